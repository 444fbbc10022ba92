"""The notebook alert hook: gpumem serve's sentence printed once per alert,
after one "gpumem: ", for this kernel's alerts only."""

import json
import os

import pytest

from gpumem_magics import alerts, state

CULL = "this kernel holds 2.0 GiB and has been idle 3s; it will be reported as an idle GPU holder at 14:05:00 unless used."


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(alerts, "_alert_state", {"mtime": None, "shown": set()})
    monkeypatch.setattr(state, "config", {"kernel_id": "k-mine"})


def write(path, items, mtime_ns):
    with open(path, "w") as f:
        json.dump({"alerts": items}, f)
    os.utime(path, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize(
    "item, want",
    [
        ({"id": "cull-k-mine-1", "gpu": -1, "message": CULL, "kernels": ["k-mine"]}, "gpumem: " + CULL + "\n"),
        (
            {"id": "gpu0-1", "gpu": 0, "message": "GPU 0 (H200) is 90% full", "kernels": ["k-other", "k-mine"]},
            "gpumem: GPU 0 (H200) is 90% full\n",
        ),
        ({"id": "cull-k-other-1", "gpu": -1, "message": CULL, "kernels": ["k-other"]}, ""),
        ({"id": "gpu1-1", "gpu": 1, "message": "GPU 1 (H200) is 90% full", "kernels": []}, ""),
    ],
    ids=["own cull warning", "a GPU it uses", "another kernel's warning", "a GPU it does not use"],
)
def test_printed_once_with_one_prefix(tmp_path, monkeypatch, capsys, item, want):
    path = str(tmp_path / "1001.json")
    monkeypatch.setitem(state.config, "alert_file", path)
    write(path, [item], 10**18)
    alerts.alert_hook()
    assert capsys.readouterr().out == want
    # Each alert once: the file written again (a new mtime) with the same
    # alert prints nothing more.
    write(path, [item], 2 * 10**18)
    alerts.alert_hook()
    assert capsys.readouterr().out == ""


def test_no_file_is_silent(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(state.config, "alert_file", str(tmp_path / "gone.json"))
    alerts.alert_hook()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("shared", [True, False], ids=["shared daemon", "private daemon"])
def test_file_beside_the_socket(tmp_path, monkeypatch, shared):
    # Without a file named by the injection: a shared daemon's dir holds
    # this user's own file; a private daemon writes the one file.
    monkeypatch.setitem(state.config, "sidecar_socket", str(tmp_path / "gpumem.sock"))
    if shared:
        os.mkdir(tmp_path / "gpumem-alerts")
        want = tmp_path / "gpumem-alerts" / ("%d.json" % os.getuid())
    else:
        want = tmp_path / "gpumem-alerts.json"
    assert alerts._alert_file() == str(want)

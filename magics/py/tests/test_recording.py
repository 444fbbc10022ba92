"""%gpumem record's arguments, and what recording and snapshots say where
they cannot work (no torch imported, a torch without CUDA)."""

import sys

import pytest

from gpumem_magics import recording, render


@pytest.mark.parametrize(
    "args, want",
    [
        ([], ("status", None)),
        (["on"], ("on", None)),
        (["on", "--max-entries", "500"], ("on", 500)),
        (["on", "--max-entries=7"], ("on", 7)),
        (["off"], ("off", None)),
    ],
)
def test_parse_record_args(args, want):
    assert recording.parse_record_args(args) == want


@pytest.mark.parametrize(
    "args, msg",
    [
        (["on", "--max-entries", "many"], "whole number"),
        (["on", "--max-entries", "0"], "at least 1"),
        (["off", "--max-entries", "5"], "goes with `record on`"),
        (["sideways"], "usage: %gpumem record on"),
    ],
)
def test_parse_record_args_errors(args, msg):
    with pytest.raises(ValueError, match=msg.replace("%", "%")):
        recording.parse_record_args(args)


def test_without_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    data = recording.record_data(["on"])
    assert data["error"].startswith("PyTorch is not imported in this kernel")
    assert not recording.is_recording()
    assert recording.snapshot_data()["error"].startswith("PyTorch is not imported")
    text, _ = render.render(data)
    assert text.startswith("gpumem record: PyTorch is not imported")


def test_status_is_off_by_default():
    data = recording.record_data([])
    assert data == {"kind": "record", "schema": 1, "on": False, "max_entries": None}
    assert render.render(data)[0].endswith("is off (`%gpumem record on [--max-entries N]` turns it on).")


def test_a_torch_without_cuda(torch):
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU: scripts/gpuhost/oom_check.py checks recording there")
    data = recording.record_data(["on"])
    assert "sees no CUDA GPU" in data["error"], data
    assert not recording.is_recording()
    assert "sees no CUDA GPU" in recording.snapshot_data()["error"]

"""%gpumem free --children [--pid N,...]: its arguments, and the line for a
worker gpumem serve left running for what it computes."""

import pytest

from gpumem_magics import render, whymagic


def test_parse_children_args():
    assert whymagic.parse_children_args(["--children"]) == []
    assert whymagic.parse_children_args(["--children", "--pid", "12,13", "--pid=14", "--pid", "12"]) == [12, 13, 14]
    for bad, says in [
        (["--children", "--pid"], "'' is not a process id"),
        (["--children", "--pid", "x"], "'x' is not a process id"),
        (["--children", "--pid", "0"], "'0' is not a process id"),
        (["--children", "--all"], "takes only --pid"),
    ]:
        with pytest.raises(ValueError, match=says):
            whymagic.parse_children_args(bad)


def test_left_running_names_the_worker_its_sm_and_how_to_end_it():
    data = {
        "kind": "children",
        "ended": [{"pid": 11, "command": "python3", "bytes": 1 << 30, "how": "SIGTERM"}],
        "left": [
            {"pid": 12, "command": "/usr/bin/python3 -c x", "bytes": 1 << 30, "reason": "computing on a GPU (3 readings)",
             "compute": "computing", "sm_percent": 90, "gpus": [0], "confirm": True, "what": "DataLoader worker 0"},
            {"pid": 13, "command": "python3", "bytes": 2 << 30, "reason": "its GPU utilization is unknown",
             "compute": "unknown", "gpus": [0, 1], "confirm": True},
            {"pid": 14, "command": "helper", "bytes": 1, "reason": "owned by uid 1001, not ours"},
        ],
        "returned_bytes": 1 << 30, "before": 3 << 30, "after": 2 << 30,
    }  # fmt: skip
    text, html = render.render(data)
    assert (
        "left running: pid 12 python3 (DataLoader worker 0) computes at 90% SM on GPU 0; "
        "to end it: %gpumem free --children --pid 12" in text
    ), text
    assert "left running: pid 13 python3 holds 2.0 GiB on GPUs 0, 1 and whether it computes is unknown" in text, text
    assert "pid 14" not in text.split("left running:")[-1] and "left running: pid 14" not in text, text
    assert "computes at 90% SM" in html

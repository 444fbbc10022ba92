"""The holder search on plain objects and a stand-in shell: no kernel, no
IPython. Tensors are CPU tensors of the torch this machine has."""

import sys

import torch

from gpumem_magics import holders


class Shell(object):
    """The parts of an IPython shell that holders reads."""

    def __init__(self, user_ns, hidden=None):
        self.user_ns = user_ns
        self.user_ns_hidden = hidden or {}
        self.displayhook = type("DH", (), {})()
        self.last_execution_result = None


class Box(object):
    pass


def test_kind_of_plain_types():
    assert holders.kind_of(int) is None
    assert holders.kind_of(str) is None
    assert holders.kind_of(type) is None
    assert holders.kind_of(list) == "seq"
    assert holders.kind_of(dict) == "map"
    assert holders.kind_of(Box) == "obj"
    assert holders.kind_of(torch.Tensor) == "tensor"
    assert holders.kind_of(torch.nn.Linear) == "module"


def test_holdings_one_level_deep():
    t = torch.zeros(10)
    box = Box()
    box.t = t
    box.nested = [torch.zeros(100)]  # two levels down: not counted
    sts, tname, n = holders.holdings(box)
    assert (tname, n) == ("Box", 1)
    assert [(b, d) for _k, b, d in sts] == [(40, "cpu")]
    assert holders.holdings([1, "a", None]) == ([], None, 0)
    assert holders.holdings(3) == ([], None, 0)


def test_user_vars_skip_private_and_hidden():
    ns = {"a": 1, "_b": 2, "In": [], "c": 3}
    shell = Shell(ns, hidden={"In": ns["In"]})
    assert dict(holders.user_vars(shell)) == {"a": 1, "c": 3}


def test_rows_from_counts_shared_storage_once():
    a = torch.zeros(1000)
    view = a[:10]
    pair = (a, torch.zeros(5))
    rows, total = holders.rows_from([("pair", pair, None), ("view", view, None), ("a", a, None)], all_devices=True)
    by = {r["name"]: r for r in rows}
    assert total == 4000 + 20
    # A tensor is a more direct holder than a container; a before its view.
    assert "shared_with" not in by["a"]
    assert by["view"]["shared_with"] == ["a"]
    assert by["pair"]["shared_with"] == ["a"]
    # Largest first; a view counts its whole storage.
    assert [(r["name"], r["bytes"]) for r in rows] == [("pair", 4020), ("a", 4000), ("view", 4000)]
    assert holders.rows_from([("a", a, None)], all_devices=False) == ([], 0)


def test_hidden_holders_output_cache_and_last_outputs():
    t = torch.zeros(4)
    ns = {"_oh": {3: t}, "_3": t, "_": t}
    shell = Shell(ns)
    got = [(ref, obj is t, what) for ref, obj, what in holders.hidden_holders(shell)]
    assert got == [("Out[3]/_3/_", True, "output cache")]


def test_traceback_frames_of_a_saved_exception():
    def failing():
        big = torch.zeros(8)  # noqa: F841 (kept alive by the traceback)
        raise RuntimeError("boom")

    saved = {n: sys.__dict__.get(n) for n in ("last_type", "last_value", "last_traceback")}
    try:
        try:
            failing()
        except RuntimeError as e:
            sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
        # This test's own frame is a function's too (a cell's is not).
        labels = [label for _fr, label in holders.traceback_frames(Shell({}))]
        assert labels[-1] == "RuntimeError traceback: failing() locals"
        refs = [(ref, what) for ref, _obj, what in holders.hidden_holders(Shell({}))]
        assert refs[-1] == ("RuntimeError traceback: failing() locals", "saved traceback")
        rows, total = holders.rows_from(
            [(ref, obj, {"hidden": True}) for ref, obj, _w in holders.hidden_holders(Shell({}))], True
        )
        assert total == 32 and rows[-1]["name"] == "RuntimeError traceback: failing() locals"
    finally:
        for n, v in saved.items():
            if v is None:
                sys.__dict__.pop(n, None)
            else:
                setattr(sys, n, v)

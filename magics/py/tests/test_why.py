"""%gpumem why on CPU tensors (--all-devices) in a stand-in shell: the seven
holders a namespace does not show, each named with a chain of at most six
hops and a fix that frees it; no reference kept; gc's state as it was."""

import gc
import sys
import weakref

import pytest
import torch

from gpumem_magics import frozen, referrers, state, why, why_elsewhere

# Each holder plants a tensor of its own size (float32 elements), so that
# its row is known by its bytes.
SEVEN = """
import functools, gc, sys, threading, types
import torch

def make():
    w = torch.zeros(1001)
    return lambda: w
f = make()

@functools.lru_cache(maxsize=8)
def load(n):
    return torch.zeros(n)
load(1002)

stash = types.ModuleType("gpumem_test_stash")
sys.modules["gpumem_test_stash"] = stash
stash.T = torch.zeros(1003)
del stash

model = torch.nn.Linear(2, 2)
def mk(t):
    return lambda mod, inp, out: t
h = model.register_forward_hook(mk(torch.zeros(1004)))

ev, ready = threading.Event(), threading.Event()
def worker():
    t = torch.zeros(1005)
    ready.set()
    ev.wait(60)
th = threading.Thread(target=worker, name="stash-worker", daemon=True)
th.start()
ready.wait(10)

class Node(object):
    pass
n = Node(); n.me = n; n.t = torch.zeros(1006)
del n
gc.freeze()

def fail():
    big = torch.zeros(1007)
    1 / 0
def plant_traceback():
    # As IPython keeps a failed cell's exception (pytest clears sys.last_*
    # before each test: the tests plant it themselves).
    try:
        fail()
    except ZeroDivisionError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
"""

EXPECT = {
    1001: ("elsewhere", "closure cell"),
    1002: ("elsewhere", "functools cache"),
    1003: ("elsewhere", "module attribute"),
    1004: ("elsewhere", "hook registry"),
    1005: ("elsewhere", "live thread"),
    1006: ("elsewhere", "gc.freeze()"),
    1007: ("hidden", "traceback"),
}


class Shell(object):
    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.user_ns_hidden = {}
        self.displayhook = type("DH", (), {})()
        self.last_execution_result = None


class Box(object):
    pass


def gc_state():
    return (gc.isenabled(), gc.get_threshold(), gc.get_debug(), frozen.count())


def same_gc_state(before):
    """gc as before why ran. The permanent generation may only shrink: a
    frozen object whose last reference goes is freed as any other (another
    thread may drop one), but why neither freezes nor unfreezes."""
    now = gc_state()
    return now[:3] == before[:3] and (now[3] > 0) == (before[3] > 0) and now[3] <= before[3]


@pytest.fixture
def planted():
    saved_last = {k: sys.__dict__.get(k) for k in ("last_type", "last_value", "last_traceback")}
    ns = {"__name__": "__main__"}
    exec(SEVEN, ns)
    assert ns["ready"].is_set(), "the worker thread did not start"
    state.configure(Shell(ns), {})
    try:
        yield ns
    finally:
        ns["ev"].set()
        ns["th"].join(10)
        gc.unfreeze()
        for k, v in saved_last.items():
            setattr(sys, k, v)
        sys.modules.pop("gpumem_test_stash", None)
        ns.clear()
        state.configure(None, {})
        gc.collect()


def rows_by_size(data):
    out = {}
    for r in data["rows"]:
        for n, (cat, _what) in EXPECT.items():
            if r["bytes"] == 4 * n and r["category"] == cat:
                out[n] = r
    return out


def test_seven_holders_named_with_short_chains(planted):
    planted["plant_traceback"]()
    before = gc_state()
    data = why.why_data(all_devices=True, budget=10)
    assert same_gc_state(before), (gc_state(), before)
    assert data["kind"] == "why", data
    got = rows_by_size(data)
    assert sorted(got) == sorted(EXPECT), [(r["category"], r["name"], r["bytes"]) for r in data["rows"]]
    for r in got.values():
        assert 1 <= r["hops"] <= 6, r
        assert len(r["chain"]) == r["hops"]
        assert r["fix"], r
    assert got[1001]["holder"] == "a closure cell" and got[1001]["fix"] == "f.__closure__[0].cell_contents = None"
    assert got[1002]["holder"] == "a functools cache" and got[1002]["fix"] == "load.cache_clear()"
    assert got[1003]["root"] == "a module attribute" and got[1003]["name"] == "gpumem_test_stash.T"
    assert got[1003]["fix"] == "import gpumem_test_stash; del gpumem_test_stash.T"
    assert got[1004]["holder"] == "a hook registry" and got[1004]["fix"] == "h.remove()"
    assert got[1005]["root"] == "a live thread's frame" and "stash-worker" in got[1005]["name"]
    assert got[1006]["root"] == "gc.freeze()'s permanent generation"
    assert got[1006]["fix"] == "gc.unfreeze(); gc.collect()"
    assert "traceback" in got[1007]["name"] and got[1007]["hops"] <= 6
    # The model's own parameters are a named variable, not held elsewhere.
    assert any(r["category"] == "variables" and r["name"] == "model" for r in data["rows"])
    assert not data.get("stopped")


def test_the_printed_fixes_free_each_holder(planted):
    ns = planted
    ns["plant_traceback"]()
    refs = {}
    for t, n in [
        (ns["f"].__closure__[0].cell_contents, 1001),
        (ns["load"](1002), 1002),
        (sys.modules["gpumem_test_stash"].T, 1003),
    ]:
        refs[n] = weakref.ref(t)
        del t
    data = why.why_data(all_devices=True, budget=10)
    got = rows_by_size(data)
    for n in (1001, 1002, 1003, 1004):
        exec(got[n]["fix"], ns)
    ns["ev"].set()
    ns["th"].join(10)
    exec(got[1006]["fix"], ns)
    gc.collect()
    for n, ref in refs.items():
        assert ref() is None, "the fix %r left the tensor of %d alive" % (got[n]["fix"], n)
    data = why.why_data(all_devices=True, budget=10)
    left = rows_by_size(data)
    assert sorted(left) == [1007], [(r["name"], r["bytes"]) for r in data["rows"]]


def test_keeps_no_reference(planted):
    ns = planted
    box = Box()
    box.t = torch.zeros(999)
    ns["cache"] = {"a": {"b": box}}  # two levels down: held elsewhere, through a variable
    ref = weakref.ref(box.t)
    boxref = weakref.ref(box)
    del box
    data = why.why_data(all_devices=True, budget=10)
    row = next(r for r in data["rows"] if r["bytes"] == 4 * 999)
    assert row["name"] == "cache['a']['b'].t" and row["fix"] == "del cache['a']['b'].t"
    del ns["cache"], data, row
    gc.collect()
    assert ref() is None and boxref() is None, gc.get_referrers(ref()) if ref() is not None else None


def test_gc_state_restored_when_disabled_and_with_debug_flags():
    saved = (gc.isenabled(), gc.get_debug())
    state.configure(Shell({"__name__": "__main__"}), {})
    try:
        gc.disable()
        gc.set_debug(gc.DEBUG_STATS)
        before = gc_state()
        why.why_data(all_devices=True)
        assert same_gc_state(before), (gc_state(), before)
    finally:
        gc.set_debug(saved[1])
        if saved[0]:
            gc.enable()
        state.configure(None, {})


def test_parse_args():
    assert why.parse_args([]) == {"device": None, "all_devices": False, "budget": 2.0}
    assert why.parse_args(["--device", "1", "--budget=0.5", "--all-devices"]) == {
        "device": 1,
        "all_devices": True,
        "budget": 0.5,
    }
    for bad in (["--device"], ["--device", "x"], ["--budget", "0"], ["--budget", "1000"], ["extra"]):
        with pytest.raises(ValueError):
            why.parse_args(bad)


def test_budget_says_where_it_stopped(planted):
    data = why.why_data(all_devices=True, budget=0.0001)
    if data.get("stopped"):
        assert data["stopped"]["at"]
    assert data["kind"] == "why"


def test_a_thread_that_drops_its_local_frees_it():
    """Reading another thread's frame makes CPython keep a snapshot of its
    locals on the frame: why empties it, so the thread's own del frees."""
    import threading

    ns = {"__name__": "__main__"}
    state.configure(Shell(ns), {})
    ready, step, done, end = (threading.Event() for _ in range(4))
    refs = []

    def worker():
        t = torch.zeros(1234)
        refs.append(weakref.ref(t))
        ready.set()
        step.wait(30)
        del t
        done.set()
        end.wait(30)

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    try:
        assert ready.wait(10)
        data = why.why_data(all_devices=True, budget=10)
        assert any(r["bytes"] == 4 * 1234 and "thread" in r["name"] for r in data["rows"])
        del data
        step.set()
        assert done.wait(10)
        gc.collect()
        assert refs[0]() is None, "why's read of the frame keeps the thread's dropped local alive"
    finally:
        step.set()
        end.set()
        th.join(10)
        state.configure(None, {})


def test_a_suspended_generator():
    ns = {"__name__": "__main__"}
    exec("import torch\ndef gen():\n    buf = torch.zeros(1235)\n    yield 1\n    yield 2\ng = gen()\nnext(g)\n", ns)
    state.configure(Shell(ns), {})
    try:
        data = why.why_data(all_devices=True, budget=10)
        row = next(r for r in data["rows"] if r["bytes"] == 4 * 1235)
        assert row["holder"] == "a suspended generator's frame" and row["fix"] == "g.close()", row
        ref = weakref.ref(ns["g"].gi_frame.f_locals["buf"])
        exec(row["fix"], ns)
        gc.collect()
        assert ref() is None
    finally:
        state.configure(None, {})


def test_a_class_attribute_and_a_holder_in_c():
    import ctypes

    ns = {"__name__": "__main__"}
    exec("import torch\nclass Config(object):\n    cache = torch.zeros(1236)\n", ns)
    leaked = torch.zeros(1237)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(leaked))  # a reference no gc object holds, as a C extension's
    ref = weakref.ref(leaked)
    del leaked
    state.configure(Shell(ns), {})
    try:
        data = why.why_data(all_devices=True, budget=10)
        by = {r["bytes"]: r for r in data["rows"]}
        cls, c = by[4 * 1236], by[4 * 1237]
        assert cls["holder"] == "a class attribute" and cls["fix"] == "del Config.cache", cls
        assert c["root"] == "a holder in C that gc cannot see into" and c["fix"].startswith("restart the kernel"), c
        exec(cls["fix"], ns)
    finally:
        t = ref()
        if t is not None:
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(t))
        del t
        state.configure(None, {})


def test_frozen_list_read_only_on_a_verified_python(monkeypatch):
    # Where the layout was not verified on a real kernel, nothing is read
    # through ctypes, and why says what it could not search.
    gc.freeze()
    try:
        assert frozen.count() > 0
        with frozen.Walk() as w:
            assert w.ok == (sys.version_info[:2] == (3, 11))
        monkeypatch.setattr(frozen, "_LAYOUTS", ())
        with frozen.Walk() as w:
            assert not w.ok and w.objects() == []
        _found, objs, info = why_elsewhere.scan(referrers.Budget(5))
        assert objs == [] and info["read"] is False and "cannot read gc.freeze()'s" in info["note"], info
    finally:
        gc.unfreeze()


FROZEN_HOLDERS = """
import gc, torch

class Holder(object):
    pass

a = torch.zeros(65 << 18)  # 65 MiB, a variable
h = Holder(); h.me = h; h.t = torch.zeros(16 << 18)  # frozen with its holder
del h
late = Holder(); late.me = late
gc.freeze()
late.t = torch.zeros(4 << 18)  # made after gc.freeze(): only a frozen object holds it
del late
"""
MIB = 1 << 20


@pytest.mark.parametrize("readable", [True, False], ids=["as-this-python-reads", "unreadable"])
def test_a_frozen_holder_is_named_or_its_bytes_unplaced(monkeypatch, readable):
    """A CPU tensor held only by objects gc.freeze() froze: where the
    permanent generation can be read (CPython 3.11), why names the frozen
    holder; where it cannot (3.12 and later, or any Python with the list
    read as unreadable here), it says so, with the bytes it could not place
    on the CPU, never a silent gap or "a holder in C"."""
    from gpumem_magics import render_why

    if not readable:
        monkeypatch.setattr(frozen, "_LAYOUTS", ())
    ns = {"__name__": "__main__"}
    gc.collect()
    exec(FROZEN_HOLDERS, ns)
    state.configure(Shell(ns), {})
    try:
        with frozen.Walk() as w:
            reads = w.ok
        data = why.why_data(all_devices=True, budget=30)
        text, _html = render_why.render_why(data)
        assert data["kind"] == "why" and not data.get("stopped"), data
        by = {r["bytes"]: r for r in data["rows"]}
        assert by[65 * MIB]["category"] == "variables", text
        if reads:
            # Both holders in one row: the same root, the same fix.
            r = by[20 * MIB]
            assert r["root"] == "gc.freeze()'s permanent generation" and r["fix"] == "gc.unfreeze(); gc.collect()", text
            assert "unplaced" not in data and data["frozen"]["read"] is True, data
            return
        # Not read: the tensor made after gc.freeze() is found, its holder
        # not; the frozen one is not found at all. Both are said.
        assert 16 * MIB not in by, text
        r = by[4 * MIB]
        assert r["root"] == "gc.freeze()'s objects, not searched" and "could not read" in r["name"], r
        u = data["unplaced"]
        assert {"device": "cpu", "bytes": 4 * MIB} in u["devices"], u
        assert "gc.freeze() froze %d objects" % data["frozen"]["count"] in u["why"], u
        assert "on the CPU no allocator counts it" in u["why"], u
        assert "not placed: 4.0 MiB on cpu: gc.freeze() froze" in text, text
        assert "cannot read gc.freeze()'s" in " ".join(data["notes"]), data["notes"]
    finally:
        gc.unfreeze()
        ns.clear()
        state.configure(None, {})
        gc.collect()


def test_thousands_of_frozen_tensors_within_the_budget():
    """3000 tensors, each in a frozen object of an unreachable frozen list,
    and 3000 in a frozen module's dict: one gc.get_referrers call for
    all of them compared each referent with every target, and one walk up
    per target, and one scan of the dict per chain, each ran for minutes,
    past any budget. Now why keeps to its budget, and every byte is in a
    row: named, or said to be unsearched."""
    import time

    ns = {"__name__": "__main__"}
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # the unreachable list must live until gc.freeze()
    exec(
        "import gc, sys, types, torch\n"
        "class Holder(object):\n    pass\n"
        "junk = []\n"
        "for i in range(3000):\n    h = Holder(); h.t = torch.zeros(4); h.all = junk; junk.append(h)\n"
        "del h, junk\n"
        "m = types.ModuleType('gpumem_test_many'); sys.modules['gpumem_test_many'] = m\n"
        "m.cache = {i: torch.zeros(2) for i in range(3000)}\n"
        "del m\n"
        "gc.freeze()\n",
        ns,
    )
    if enabled:
        gc.enable()
    state.configure(Shell(ns), {})
    try:
        t0 = time.perf_counter()
        data = why.why_data(all_devices=True, budget=3)
        took = time.perf_counter() - t0
        assert data["kind"] == "why", data
        assert took < 9, "why took %.1f s on a 3 s budget" % took
        rows = [r for r in data["rows"] if r["category"] == "elsewhere"]
        assert sum(r["bytes"] for r in rows) == 3000 * 16 + 3000 * 8, [(r["name"], r["bytes"]) for r in rows]
        if not data.get("stopped"):
            with frozen.Walk() as w:
                reads = w.ok
            roots = sorted(r["root"] for r in rows)
            if reads:
                assert roots == ["a module attribute", "gc.freeze()'s permanent generation"], roots
    finally:
        gc.unfreeze()
        sys.modules.pop("gpumem_test_many", None)
        ns.clear()
        state.configure(None, {})
        gc.collect()


def test_unplaced_counts_the_allocators_bytes_no_tensor_found():
    """On a GPU, where gc.freeze()'s objects are not read, PyTorch's
    allocated bytes that no tensor found accounts for are unplaced too (the
    frozen tensors are among them), beside the CPU's bytes not searched."""
    rows = [
        {"category": "c_level", "device": "cuda:0", "bytes": 17 * MIB, "note": "cuBLAS workspaces"},
        {"category": "elsewhere", "device": "cpu", "bytes": 4 * MIB, "root": "gc.freeze()'s objects, not searched"},
    ]
    data = {"frozen": {"count": 1000, "read": False}, "unplaced_bytes": {"cpu": 4 * MIB}}
    why._unplaced(data, rows, referrers.Budget(1), True)
    assert data["unplaced"]["devices"] == [{"device": "cpu", "bytes": 4 * MIB}, {"device": "cuda:0", "bytes": 17 * MIB}]
    assert "cannot read them on this Python" in data["unplaced"]["why"], data
    assert rows[0]["note"] == "cuBLAS workspaces; or tensors that only gc.freeze()'s objects (not searched) hold"
    # Read whole: nothing unplaced, no row changed.
    rows[0]["note"] = "cuBLAS workspaces"
    data = {"frozen": {"count": 1000, "read": True}}
    why._unplaced(data, rows, referrers.Budget(1), True)
    assert "unplaced" not in data and rows[0]["note"] == "cuBLAS workspaces"

"""%gpumem why: every byte of this kernel's framework memory in one row,
each with its fix.

The rows, in order: named variables (as %gpumem vars finds them);
IPython's hidden holders; memory held elsewhere (each live buffer that no
variable reaches, with the shortest chain of referrers to its root, see
referrers.py); allocations no Python object holds (C-level holders); the
frameworks' caches (PyTorch's split into releasable and fragmented);
TensorFlow's memory, which cannot be traced. gpumem serve adds the rest in
Go (the driver's figure: memory outside the allocators, each child
process, and what is left unexplained) and the kernel renders the joined
data.

Bounds: one gc pass over the objects (and the frozen ones), one
gc.get_referrers call per level of the search, a budget (2 s by default)
after which it says where it stopped. It leaves gc as it was (disabled
while it runs, thresholds, debug flags and frozen objects untouched), and
keeps no reference to anything it met."""

import gc
import os
import sys

from . import allocator, holders, probes, referrers, state, why_allocator, why_elsewhere, workers

CATEGORIES = ("variables", "hidden", "elsewhere", "c_level", "cache", "untraceable", "outside", "child", "unexplained")
_ROWS_SHOWN = 40  # rows per category; the rest in one "more" row
USAGE = "usage: %gpumem why [--device N] [--all-devices] [--budget SECONDS]"


def parse_args(args):
    opts = {"device": None, "all_devices": False, "budget": 2.0}
    it = iter(args)
    for a in it:
        if a == "--all-devices":
            opts["all_devices"] = True
        elif a in ("--device", "--budget") or a.startswith(("--device=", "--budget=")):
            name, _, v = a.partition("=")
            if not v:
                v = next(it, "")
            try:
                opts[name[2:]] = int(v) if name == "--device" else float(v)
            except ValueError:
                raise ValueError("%s wants a number, got %r; %s" % (name, v, USAGE)) from None
            if name == "--budget" and not 0 < opts["budget"] <= 600:
                raise ValueError("--budget is in seconds, between 0 and 600; %s" % USAGE)
        else:
            raise ValueError("unexpected %s; %s" % (a, USAGE))
    return opts


def _wanted(device, all_devices):
    if device is not None:
        name = "cuda:%d" % device
        return lambda dev: dev == name
    if all_devices:
        return lambda dev: True
    return holders.is_gpu


def why_data(device=None, all_devices=False, budget=2.0):
    """The why data dict of this kernel (see the module's doc). Never
    raises; gc's state is as it was after."""
    b = referrers.Budget(budget)
    enabled = gc.isenabled()
    gc.disable()
    # The types this call adds to the type cache are dropped again: the
    # cache must not keep a type alive that the kernel drops later.
    cached = set(holders._kind_cache)
    try:
        return _why(state.shell, device, all_devices, b, referrers.Baseline())
    except Exception as e:
        return {"kind": "error", "message": "gpumem why failed: %s" % state.short_exc(e)}
    finally:
        for tp in [tp for tp in holders._kind_cache if tp not in cached]:
            del holders._kind_cache[tp]
        cached.clear()
        if enabled:
            gc.enable()


def _why(shell, device, all_devices, b, baseline):
    want = _wanted(device, all_devices)
    data = {
        "kind": "why",
        "schema": state.SCHEMA,
        "pid": os.getpid(),
        "scope": "cuda:%d" % device if device is not None else ("all devices" if all_devices else "GPU memory"),
        "budget_s": round(b.seconds, 3),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "frameworks_loaded": [m for m in ("torch", "cupy", "jax", "tensorflow") if m in sys.modules],
    }
    notes = []
    fws = probes.frameworks()
    tdevs = [d for d in allocator.torch_devices() if want(d["device"])]
    rows = []

    # Named variables and IPython's hidden holders, as %gpumem vars claims them.
    claims = {}
    named = [(n, v, None) for n, v in holders.user_vars(shell)]
    hidden = [(ref, obj, {"hidden": True, "where": what}) for ref, obj, what in holders.hidden_holders(shell)]
    vrows, _total = holders.rows_from(named + hidden, all_devices, want=want, owners=claims)
    del named, hidden
    owned = {}  # id(row) -> its bytes
    for k, (row, n, dev) in claims.items():
        owned[id(row)] = owned.get(id(row), 0) + why_elsewhere.buffer_bytes(k, n, dev)
    for r in vrows:
        r["bytes"] = owned.get(id(r), 0)
        if not r["bytes"] and r.get("shared_with"):
            continue
        if r.get("hidden"):
            rows.append(_hidden_row(r))
        else:
            rows.append(dict(r, category="variables", chain=[r["name"]], hops=1, fix="%%gpumem free %s" % r["name"]))
    traced = {}  # storage key -> (bytes, device)
    for k, (_row, n, dev) in claims.items():
        traced[k] = (why_elsewhere.buffer_bytes(k, n, dev), dev)
    claims.clear()

    # Every other live buffer, and who holds it.
    found, frozen_objs, finfo = why_elsewhere.scan(b)
    data["frozen"] = finfo
    if finfo.get("note"):
        notes.append(finfo["note"])
    try:
        handles = {k: found.pop(k) for k in list(found) if k not in why_elsewhere.BUFFER_KINDS and k != "module"}
        data["children_known"] = {str(pid): what for pid, what in workers.describe(handles).items()}
        handles.clear()
        rows += why_elsewhere.rows(shell, found, frozen_objs, want, traced, b, baseline, data)
    finally:
        found.clear()
        del frozen_objs[:]
    rows += why_allocator.rows(tdevs, fws, traced, want, data)
    _unplaced(data, rows, b, all_devices)
    data["rows"] = _cap(rows)
    data["devices"] = why_allocator.device_table(fws, tdevs, want)
    frag = allocator.fragmentation(tdevs, allocator.last_oom(shell))
    advice = []
    if frag:
        data["fragmentation"] = frag
        advice.append(frag["text"])
        advice += allocator.expandable_advice()
    data["advice"] = advice
    if not data["frameworks_loaded"]:
        notes.append("No PyTorch, CuPy, JAX or TensorFlow is loaded in this kernel.")
    data["notes"] = notes
    data["elapsed_ms"] = b.elapsed_ms()
    return data


def _unplaced(data, rows, b, cpu_in_scope):
    """data["unplaced"]: the bytes, per device, that no row names a holder
    for because gpumem could not search for it (the budget, gc.freeze()'s
    objects it could not read), and why; absent when every byte is placed.
    Where gc.freeze()'s objects were not all read, PyTorch's allocated
    bytes that no tensor found accounts for (the "no Python holder" row)
    are unplaced too: the tensors only frozen objects reach are not found.
    On the CPU no allocator counts them, and the text says so."""
    by_dev = data.pop("unplaced_bytes", None) or {}
    fz = data.get("frozen") or {}
    unread = bool(fz.get("count")) and not fz.get("read")
    why = []
    if unread:
        if fz.get("partial") is not None and not data.get("stopped"):
            data["stopped"] = {"at": "the walk of gc.freeze()'s objects", "elapsed_ms": b.elapsed_ms()}
        for r in rows:
            if r["category"] == "c_level" and r["bytes"] > 0:
                by_dev[r["device"]] = by_dev.get(r["device"], 0) + r["bytes"]
                more = "or tensors that only gc.freeze()'s objects (not searched) hold"
                r["note"] = "%s; %s" % (r["note"], more) if r.get("note") else more
        what = "read only %d of them" % fz["partial"] if fz.get("partial") is not None else "cannot read them on this Python"
        why.append(
            "gc.freeze() froze %d objects and gpumem %s: holders among them are not named, and a tensor only they "
            "reach is not found"
            % (fz["count"], what)
            + (" (on the CPU no allocator counts it: its bytes are in no figure here)" if cpu_in_scope else "")
        )
    if data.get("stopped") and any(r.get("root") == "not searched: the budget ran out" for r in rows):
        why.append("the search stopped at the budget before it found their holders")
    if not why:
        return
    devs = [{"device": d, "bytes": n} for d, n in sorted(by_dev.items()) if n > 0]
    if cpu_in_scope and unread and not any(d["device"] == "cpu" for d in devs):
        devs.append({"device": "cpu", "bytes": 0})
    data["unplaced"] = {"devices": devs, "why": "; ".join(why)}


_HIDDEN_FIXES = (
    (
        "traceback",
        "import sys; sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None; "
        "get_ipython().InteractiveTB.tb = None",
    ),
    ("output cache", "get_ipython().displayhook.flush()"),
    ("last outputs", "get_ipython().displayhook.flush()"),
    ("last result", "get_ipython().last_execution_result = None"),
)


def _hidden_row(r):
    where = r.get("where", "")
    fix = next((f for key, f in _HIDDEN_FIXES if key in where), "%gpumem free --all")
    if "traceback" in where:
        frame = r["name"].split(": ", 1)[-1]
        chain = ["sys.last_value (the saved exception)", ".__traceback__", "(frame of %s)" % frame]
    else:
        chain = [r["name"]]
    out = dict(r, category="hidden", chain=chain, hops=len(chain), fix=fix)
    out.pop("hidden", None)
    return out


def _cap(rows):
    """At most _ROWS_SHOWN rows per category, the rest in one row."""
    out, count = [], {}
    more = {}
    for r in rows:
        c = r["category"]
        count[c] = count.get(c, 0) + 1
        if count[c] <= _ROWS_SHOWN:
            out.append(r)
        else:
            m = more.setdefault(c, {"category": c, "name": "", "device": "-", "bytes": 0, "fix": "-", "more": 0})
            m["bytes"] += r["bytes"]
            m["more"] += 1
    for m in more.values():
        m["name"] = "... and %d more rows" % m["more"]
        out.append(m)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    out.sort(key=lambda r: order.get(r["category"], 99))
    return out


def held_elsewhere(device=None, all_devices=False, budget=1.0):
    """The "held elsewhere" rows only, largest first: for other reports
    (an out-of-memory report's top holders). Same bounds as why_data."""
    data = why_data(device, all_devices, budget)
    return [r for r in data.get("rows", ()) if r.get("category") == "elsewhere"]

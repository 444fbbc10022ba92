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

from . import allocator, fixes, frozen, holders, probes, referrers, state, units, workers

CATEGORIES = ("variables", "hidden", "elsewhere", "c_level", "cache", "untraceable", "outside", "child", "unexplained")
_ROWS_SHOWN = 40  # rows per category; the rest in one "more" row
_BUFFER_KINDS = ("tensor", "storage", "cupy", "jax")
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


def _bytes(key, n, dev):
    """A buffer's bytes as its allocator counts them."""
    return allocator.round_block(n) if key[0] == "torch" and dev.startswith("cuda") else n


def _classify(tp):
    k = holders.kind_of(tp)
    if k in ("tensor", "module", "cupy", "jax"):
        return k
    torch = state.mod("torch")
    if torch is not None:
        for c in (getattr(torch, "UntypedStorage", None), getattr(getattr(torch, "storage", None), "TypedStorage", None)):
            try:
                if c is not None and issubclass(tp, c):
                    return "storage"
            except TypeError:
                pass
    return workers.handle_kind(tp)


def _storages(obj, kind, out):
    if kind == "storage":
        try:
            dev, ptr, n = str(obj.device), int(obj.data_ptr()), int(obj.nbytes())
            if n and dev != "meta":
                out.append((("torch", dev, ptr) if ptr else ("id", id(obj)), n, dev))
        except Exception:
            pass
    else:
        holders._leaf_storages(obj, kind, out)


def _scan(budget):
    """One pass over gc's objects and the frozen ones: {kind: [objects]},
    the frozen objects, and what the walk of the frozen ones found."""
    found = {}
    objs = gc.get_objects()
    try:
        _pick(objs, found)
    finally:
        del objs
    info = {"count": frozen.count(), "read": False}
    frozen_objs = []
    if info["count"]:
        with frozen.Walk(budget.deadline) as w:
            frozen_objs = w.objects()
            info["read"] = w.ok and w.complete
            if not w.ok:
                info["note"] = "cannot read gc.freeze()'s objects on this Python: what they hold is not searched"
        _pick(frozen_objs, found)
    jax = state.mod("jax")
    if jax is not None and probes.jax_initialised():
        try:
            found["jax"] = list(jax.live_arrays())
        except Exception:
            pass
    return found, frozen_objs, info


def _pick(objs, found):
    """Adds objs of the kinds _classify names to found, by kind. The pass
    over a million objects runs in C (map, set, compress): Python runs
    once per type."""
    import itertools

    kinds = {}
    for tp in set(map(type, objs)):
        k = _classify(tp)
        if k is not None:
            kinds[tp] = k
    if not kinds:
        return
    for o in itertools.compress(objs, map(kinds.__contains__, map(type, objs))):
        found.setdefault(kinds[type(o)], []).append(o)
    kinds.clear()


def _module_groups(modules):
    """id(tensor) -> (top module, path from it) for modules' parameters and
    buffers: a module is searched for once, not each of its tensors."""
    owner, parent = {}, {}
    for m in modules:
        try:
            for attr in ("_parameters", "_buffers"):
                for name, t in (getattr(m, attr, None) or {}).items():
                    if t is not None:
                        owner.setdefault(id(t), (m, "." + name))
            for name, c in (getattr(m, "_modules", None) or {}).items():
                if c is not None:
                    parent.setdefault(id(c), (m, "." + name))
        except Exception:
            continue
    out = {}
    for tid, (m, path) in owner.items():
        seen = set()
        while id(m) in parent and id(m) not in seen:
            seen.add(id(m))
            m, name = parent[id(m)]
            path = name + path
        out[tid] = (m, path)
    return out


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
        owned[id(row)] = owned.get(id(row), 0) + _bytes(k, n, dev)
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
        traced[k] = (_bytes(k, n, dev), dev)
    claims.clear()

    # Every other live buffer, and who holds it.
    found, frozen_objs, finfo = _scan(b)
    data["frozen"] = finfo
    if finfo.get("note"):
        notes.append(finfo["note"])
    try:
        handles = {k: found.pop(k) for k in list(found) if k not in _BUFFER_KINDS and k != "module"}
        data["children_known"] = {str(pid): what for pid, what in workers.describe(handles).items()}
        handles.clear()
        rows += _elsewhere(shell, found, frozen_objs, want, traced, b, baseline, data)
    finally:
        found.clear()
        del frozen_objs[:]
    rows += _allocator_rows(tdevs, fws, traced, want, data)
    data["rows"] = _cap(rows)
    data["devices"] = _device_table(fws, tdevs, want)
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


def _elsewhere(shell, found, frozen_objs, want, traced, b, baseline, data):
    """Rows of the buffers no variable holds, by the fix that frees them."""
    groups = _module_groups(found.get("module", ()))
    targets, tkeys, tlabel = [], [], []
    tindex = {}
    for kind in _BUFFER_KINDS:
        for obj in found.get(kind, ()):
            sts = []
            _storages(obj, kind, sts)
            keys = [(k, _bytes(k, n, dev), dev) for k, n, dev in sts if want(dev) and k not in traced]
            if not keys:
                continue
            holder, suffix = groups.get(id(obj), (obj, ""))
            i = tindex.get(id(holder))
            if i is None:
                i = tindex[id(holder)] = len(targets)
                targets.append(holder)
                tkeys.append({})
                tlabel.append(type(holder).__name__)
            for k, n, dev in keys:
                tkeys[i].setdefault(k, (n, dev, suffix))
    tindex.clear()
    groups.clear()
    if not targets:
        return []
    search = referrers.Search(shell, b, baseline, exclude=[targets, frozen_objs] + list(found.values()))
    try:
        resolved = _search(search, targets, frozen_objs, b)
        if search.stopped:
            data["stopped"] = {"at": search.stopped, "elapsed_ms": b.elapsed_ms()}
        return _rows_for(shell, targets, tkeys, tlabel, resolved, traced)
    finally:
        search.release()
        del targets[:]


def _search(search, targets, frozen_objs, b):
    """[(root, chain objects) or ((reason,), None)] per target."""
    tnodes = search.run(targets)
    chains = search.chains(tnodes)
    if len(chains) < len(tnodes) and frozen_objs and search.dead and not b.over():
        # On from where no visible referrer was, among the frozen objects.
        search.extend(frozen_objs)
        chains = search.chains(tnodes)
    out = []
    for t in tnodes:
        c = chains.get(t)
        if c is not None:
            out.append((c[0], [search.nodes[i] for i in c[1]]))
        else:
            out.append(((search.why_unrooted(t),), None))
    return out


def _rows_for(shell, targets, tkeys, tlabel, resolved, traced):
    rows = {}
    for i, (root, objs) in enumerate(resolved):
        desc = fixes.describe(shell, root, objs)
        r = rows.get(desc["fix"])
        if r is None:
            r = rows[desc["fix"]] = dict(desc, category="elsewhere", bytes=0, devices=set(), count=0, types=set())
        for k, (n, dev, _suffix) in tkeys[i].items():
            if k in traced:
                continue
            traced[k] = (n, dev)
            r["bytes"] += n
            r["devices"].add(dev)
            r["count"] += 1
        r["types"].add(tlabel[i])
    out = []
    for r in rows.values():
        if not r["bytes"]:
            continue
        r["device"] = "+".join(sorted(r.pop("devices")))
        types_ = sorted(r.pop("types"))
        r["type"] = types_[0] if len(types_) == 1 else "+".join(types_[:3])
        if r["count"] > 1:
            r["detail"] = "%d tensors/arrays" % r["count"]
        r.pop("count")
        out.append(r)
    out.sort(key=lambda r: -r["bytes"])
    return out


def _allocator_rows(tdevs, fws, traced, want, data):
    """Per device: allocated with no Python holder, and the caches."""
    rows = []
    by_dev = {}
    for k, (n, dev) in traced.items():
        by_dev[(k[0], dev)] = by_dev.get((k[0], dev), 0) + n
    for d in tdevs:
        dev = d["device"]
        seen = by_dev.get(("torch", dev), 0)
        d["traced"] = seen
        if d["allocated"] > seen:
            rows.append(
                {
                    "category": "c_level",
                    "name": "allocated by PyTorch, no Python tensor holds it",
                    "note": "cuBLAS workspaces, autograd graphs' saved tensors, CUDA graph pools, C++ caches",
                    "device": dev,
                    "bytes": d["allocated"] - seen,
                    "fix": "%gpumem free (clears cuBLAS workspaces); del the outputs whose graph keeps tensors; "
                    "else restart the kernel",
                }
            )
        elif seen > d["allocated"]:
            rows.append(
                {
                    "category": "unexplained",
                    "name": "counted above PyTorch's allocated figure",
                    "note": "memory shared with another framework, or allocated outside the caching allocator?",
                    "device": dev,
                    "bytes": d["allocated"] - seen,
                    "fix": "-",
                }
            )
        if d["releasable"]:
            rows.append(
                {
                    "category": "cache",
                    "name": "PyTorch's cache, releasable",
                    "device": dev,
                    "bytes": d["releasable"],
                    "fix": "%gpumem free (torch.cuda.empty_cache())",
                }
            )
        if d["fragmented"]:
            rows.append(
                {
                    "category": "cache",
                    "name": "PyTorch's cache, fragmented",
                    "note": "free blocks inside segments still in use; the largest is %s"
                    % units.fmt_bytes(d["largest_free_block"]),
                    "device": dev,
                    "bytes": d["fragmented"],
                    "fix": "free the tensors that share its segments; expandable_segments (see advice)",
                }
            )
    for fw in fws:
        if fw["name"] == "torch":
            continue
        for d in fw.get("devices", ()):
            dev = d["device"]
            if not want(dev):
                continue
            used, held = int(d.get("used") or 0), d.get("held")
            if fw["name"] == "tensorflow":
                rows.append(
                    {
                        "category": "untraceable",
                        "name": "TensorFlow, in use",
                        "note": "TensorFlow's memory cannot be traced to Python holders",
                        "device": dev,
                        "bytes": used,
                        "fix": "restart the kernel (TensorFlow returns GPU memory only when the process exits)",
                    }
                )
                continue
            key = fw["name"]
            seen = by_dev.get((key, dev), 0)
            if used > seen:
                rows.append(
                    {
                        "category": "c_level",
                        "name": "%s: in use with no Python array found" % fw["label"],
                        "device": dev,
                        "bytes": used - seen,
                        "fix": "restart the kernel" if key == "jax" else "%gpumem free",
                    }
                )
            if held is not None and held > used:
                rows.append(
                    {
                        "category": "cache",
                        "name": "%s's pool, free" % fw["label"],
                        "device": dev,
                        "bytes": held - used,
                        "fix": "%gpumem free (free_all_blocks())"
                        if key == "cupy"
                        else "restart with XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX keeps its pool)",
                    }
                )
    return rows


def _device_table(fws, tdevs, want):
    """What each framework holds from the driver per device, for the join
    with the driver's figure (done in Go)."""
    out = []
    for d in tdevs:
        out.append({k: d[k] for k in d if k in ("device", "framework", "index", "uuid", "total")})
        out[-1].update(held=d["reserved"], used=d["allocated"])
    for fw in fws:
        if fw["name"] == "torch":
            continue
        for d in fw.get("devices", ()):
            if not want(d["device"]):
                continue
            used = int(d.get("used") or 0)
            held = d.get("held")
            out.append(
                {
                    "device": d["device"],
                    "framework": fw["name"],
                    "index": int(d["device"].split(":")[-1]) if d["device"].startswith("cuda:") else None,
                    "held": used if held is None else int(held),
                    "used": used,
                }
            )
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

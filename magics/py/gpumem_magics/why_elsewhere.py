"""The "held elsewhere" rows of %gpumem why: one pass over gc's objects
and gc.freeze()'s (frozen.py) for the live buffers and the objects that
hold them, then, for each buffer no variable claimed, the shortest chain
of referrers to its root (referrers.py), grouped by the fix that frees it
(fixes.py)."""

import gc

from . import allocator, fixes, frozen, holders, probes, referrers, referrers_steps, state, workers

BUFFER_KINDS = ("tensor", "storage", "cupy", "jax")
UNSEARCHED = ("unsearched", "budget")  # the reasons a buffer's holder is not known


def buffer_bytes(key, n, dev):
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


def scan(budget):
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
                info["note"] = (
                    "cannot read gc.freeze()'s %d objects on this Python: what they hold is not searched" % info["count"]
                )
            elif not w.complete:
                # The walk stopped at the budget: the objects after it
                # are as unsearched as on a Python whose list cannot be read.
                info["partial"] = len(frozen_objs)
                info["note"] = (
                    "read %d of gc.freeze()'s %d objects before the budget ran out: what the rest hold is not "
                    "searched (%%gpumem why --budget 10 looks longer)" % (len(frozen_objs), info["count"])
                )
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


def rows(shell, found, frozen_objs, want, traced, b, baseline, data):
    """Rows of the buffers no variable holds, by the fix that frees them."""
    groups = _module_groups(found.get("module", ()))
    targets, tkeys, tlabel = [], [], []
    tindex = {}
    for kind in BUFFER_KINDS:
        for obj in found.get(kind, ()):
            sts = []
            _storages(obj, kind, sts)
            keys = [(k, buffer_bytes(k, n, dev), dev) for k, n, dev in sts if want(dev) and k not in traced]
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
    finfo = data.get("frozen") or {}
    search.frozen_unread = bool(finfo.get("count")) and not finfo.get("read")
    try:
        resolved = _search(search, targets, frozen_objs, b)
        if search.stopped:
            data["stopped"] = {"at": search.stopped, "elapsed_ms": b.elapsed_ms()}
        return _rows_for(shell, tkeys, tlabel, resolved, traced, data.setdefault("unplaced_bytes", {}))
    finally:
        search.release()
        referrers_steps.forget()
        del targets[:]


def _search(search, targets, frozen_objs, b):
    """[(root, chain objects) or ((reason,), None)] per target."""
    tnodes = search.run(targets)
    chains = search.chains(tnodes)
    unrooted = [t for t in tnodes if t not in chains]
    if unrooted and frozen_objs and not b.over():
        # On from where no visible referrer was, among the frozen objects.
        search.extend(frozen_objs, unrooted)
        chains = search.chains(tnodes)
    out = []
    for t in tnodes:
        c = chains.get(t)
        if c is not None:
            out.append((c[0], [search.nodes[i] for i in c[1]]))
        else:
            out.append(((search.why_unrooted(t),), None))
    return out


def _rows_for(shell, tkeys, tlabel, resolved, traced, unplaced):
    """The rows of the resolved targets, one per fix and root; the bytes
    whose holder was not searched (the budget, gc.freeze()'s unread
    objects) are added to unplaced, per device."""
    rows = {}
    for i, (root, objs) in enumerate(resolved):
        desc = fixes.describe(shell, root, objs)
        r = rows.get((desc["fix"], desc["root"]))
        if r is None:
            r = dict(desc, category="elsewhere", bytes=0, devices=set(), count=0, types=set())
            rows[(desc["fix"], desc["root"])] = r
        for k, (n, dev, _suffix) in tkeys[i].items():
            if k in traced:
                continue
            traced[k] = (n, dev)
            r["bytes"] += n
            r["devices"].add(dev)
            r["count"] += 1
            if objs is None and root[0] in UNSEARCHED:
                unplaced[dev] = unplaced.get(dev, 0) + n
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

"""Which variables, and which of IPython's hidden references (Out, _,
last_execution_result, saved tracebacks), hold framework memory: one
level deep into containers and objects, shared storage counted once."""

import sys

from . import state

_CONTAINER_SCAN_LIMIT = 100000


_kind_cache = {}


def kind_of(tp):
    """Classifies a type: None (holds nothing we count), 'tensor', 'module',
    'optim', 'cupy', 'jax', 'seq', 'map', 'obj'. Cached per type."""
    k = _kind_cache.get(tp, state.MISSING)
    if k is not state.MISSING:
        return k
    k = _classify(tp)
    if len(_kind_cache) > 20000:
        _kind_cache.clear()
    _kind_cache[tp] = k
    return k


_SCALARS = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, memoryview)


def _classify(tp):
    try:
        if issubclass(tp, _SCALARS) or issubclass(tp, type):
            return None
        torch = state.mod("torch")
        if torch is not None:
            if issubclass(tp, torch.Tensor):
                return "tensor"
            if issubclass(tp, torch.nn.Module):
                return "module"
            if issubclass(tp, torch.optim.Optimizer):
                return "optim"
        cp = state.mod("cupy")
        if cp is not None and issubclass(tp, cp.ndarray):
            return "cupy"
        jax = state.mod("jax")
        if jax is not None:
            arr = getattr(jax, "Array", None)
            if arr is not None and issubclass(tp, arr):
                return "jax"
        if issubclass(tp, dict):
            return "map"
        if issubclass(tp, (list, tuple, set, frozenset)):
            return "seq"
        import collections

        if issubclass(tp, collections.deque):
            return "seq"
        import types as _t

        if issubclass(tp, (_t.ModuleType, _t.FunctionType, _t.BuiltinFunctionType, _t.MethodType, _t.CodeType, _t.FrameType)):
            return None
        if "__dict__" in getattr(tp, "__dict__", {}) or any("__dict__" in getattr(b, "__dict__", {}) for b in tp.__mro__[1:]):
            return "obj"
    except Exception:
        pass
    return None


def is_gpu(dev):
    return not (dev == "cpu" or dev.startswith("cpu:") or dev == "meta")


def _tensor_storages(t, out):
    try:
        dev = t.device
        if dev.type == "meta":
            return
        devs = str(dev)
        try:
            us = getattr(t, "untyped_storage", None)  # torch >= 2.0
            st = us() if us is not None else t.storage()
            ptr, n = int(st.data_ptr()), int(st.nbytes())
            key = ("torch", devs, ptr) if ptr else ("id", id(t))
        except Exception:
            n = int(t.element_size() * t.nelement())
            key = ("id", id(t))
        if n:
            out.append((key, n, devs))
        if t.requires_grad and t.is_leaf:
            g = t.grad
            if g is not None:
                _tensor_storages(g, out)
    except Exception:
        pass


def _leaf_storages(obj, kind, out):
    """Appends (key, nbytes, device) of every buffer obj holds."""
    if kind == "tensor":
        _tensor_storages(obj, out)
    elif kind == "module":
        try:
            for p in obj.parameters():
                _tensor_storages(p, out)
            for b in obj.buffers():
                _tensor_storages(b, out)
        except Exception:
            pass
    elif kind == "optim":
        try:
            for g in obj.param_groups:
                for p in g.get("params", []):
                    _tensor_storages(p, out)
            for st in obj.state.values():
                if isinstance(st, dict):
                    for v in st.values():
                        if kind_of(type(v)) == "tensor":
                            _tensor_storages(v, out)
        except Exception:
            pass
    elif kind == "cupy":
        try:
            mem = obj.data.mem
            out.append((("cupy", int(obj.device.id), int(mem.ptr)), int(mem.size), "cuda:%d" % obj.device.id))
        except Exception:
            pass
    elif kind == "jax":
        try:
            if obj.is_deleted():
                return
            for sh in obj.addressable_shards:
                dev = sh.device
                devs = "%s:%d" % ("cuda" if dev.platform == "gpu" else dev.platform, dev.id)
                data = sh.data
                try:
                    key = ("jax", devs, int(data.unsafe_buffer_pointer()))
                except Exception:
                    key = ("id", id(data))
                out.append((key, int(data.nbytes), devs))
        except Exception:
            pass


_LEAVES = ("tensor", "module", "optim", "cupy", "jax")


def holdings(obj, leaves=None):
    """Storages an object holds: itself if a leaf, else leaves one level deep
    (container items, instance attributes). Returns (storages, type label,
    number of leaves). leaves, if a list, receives the leaf objects."""
    out = []
    kind = kind_of(type(obj))
    if kind is None:
        return out, None, 0
    if kind in _LEAVES:
        _leaf_storages(obj, kind, out)
        if leaves is not None:
            leaves.append(obj)
        return out, type(obj).__name__, 1
    if kind == "map":
        items = obj.values()
    elif kind == "seq":
        items = obj
    else:  # obj: an instance; look one level into its attributes
        try:
            d = object.__getattribute__(obj, "__dict__")
        except Exception:
            return out, None, 0
        if not isinstance(d, dict):
            return out, None, 0
        items = d.values()
    n = 0
    try:
        for i, v in enumerate(items):
            if i >= _CONTAINER_SCAN_LIMIT:
                break
            vk = kind_of(type(v))
            if vk in _LEAVES:
                _leaf_storages(v, vk, out)
                n += 1
                if leaves is not None:
                    leaves.append(v)
    except Exception:
        pass
    if not n:
        return out, None, 0
    return out, type(obj).__name__, n


def user_vars(shell):
    ns = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {})
    for name, value in list(ns.items()):
        if name.startswith("_"):
            continue
        hv = hidden.get(name, state.MISSING)
        if hv is value:
            continue
        yield name, value


def rows_from(holders, all_devices, want=None, owners=None):
    """holders: [(name, obj, extra)]. Returns rows, largest first, with
    shared storage counted once. A storage is claimed by its most direct
    holder: tensors, arrays and modules first, then optimizers, then
    containers and objects, then IPython's hidden references (largest first
    within each); the others name the claimer in shared_with. want(device)
    picks the devices counted (default: GPUs, or all with all_devices);
    owners, a dict, receives storage key -> (the claiming row, bytes,
    device)."""
    if want is None:
        want = (lambda dev: True) if all_devices else is_gpu
    prelim = []
    for name, obj, extra in holders:
        sts, tname, nleaves = holdings(obj)
        if not sts:
            continue
        seen = {}
        for key, n, dev in sts:
            if not want(dev):
                continue
            if key not in seen:
                seen[key] = (n, dev)
        if not seen:
            continue
        total = sum(n for n, _ in seen.values())
        devs = sorted(set(d for _, d in seen.values()))
        row = {"name": name, "type": tname, "device": "+".join(devs), "bytes": total}
        if tname and nleaves > 1 or (extra or {}).get("container"):
            row["detail"] = "%d tensors/arrays" % nleaves
        if extra:
            for k, v in extra.items():
                if k != "container":
                    row[k] = v
        kind = kind_of(type(obj))
        prio = 3 if row.get("hidden") else {"optim": 1, "seq": 2, "map": 2, "obj": 2}.get(kind, 0)
        prelim.append((row, seen, prio))
    owner = {}
    total = 0
    for row, seen, _p in sorted(prelim, key=lambda r: (r[2], -r[0]["bytes"], r[0]["name"])):
        shared = []
        for key, (n, dev) in seen.items():
            o = owner.get(key)
            if o is None:
                owner[key] = row["name"]
                total += n
                if owners is not None:
                    owners[key] = (row, n, dev)
            elif o not in shared:
                shared.append(o)
        if shared:
            row["shared_with"] = sorted(shared)
    prelim.sort(key=lambda r: (bool(r[0].get("hidden")), -r[0]["bytes"], r[0]["name"]))
    return [r[0] for r in prelim], total


def hidden_holders(shell):
    """IPython's own references that keep objects alive: [(ref, obj, what)].
    Grouped so one object shown under several names is one holder."""
    out = []
    ns = shell.user_ns
    oh = ns.get("_oh")
    byid = {}
    order = []

    def add(ref, obj, what):
        if kind_of(type(obj)) is None:
            return
        k = id(obj)
        if k in byid:
            byid[k][0].append(ref)
            return
        byid[k] = ([ref], obj, what)
        order.append(k)

    if isinstance(oh, dict):
        for n in sorted(oh, key=lambda x: (str(type(x)), x)):
            add("Out[%s]" % n, oh[n], "output cache")
            if ns.get("_%s" % n, state.MISSING) is oh[n]:
                add("_%s" % n, oh[n], "output cache")
    dh = getattr(shell, "displayhook", None)
    for u in ("_", "__", "___"):
        v = ns.get(u, state.MISSING)
        if v is not state.MISSING:
            add(u, v, "last outputs")
        dv = getattr(dh, u, state.MISSING)
        if dv is not state.MISSING and dv is not v:
            add("displayhook." + u, dv, "last outputs")
    ler = getattr(shell, "last_execution_result", None)
    if ler is not None and getattr(ler, "result", None) is not None:
        add("last_execution_result", ler.result, "last result")
    for ref, obj, what in (byid[k] for k in order):
        out.append(("/".join(ref), obj, what))
    for fr, label in traceback_frames(shell):
        try:
            loc = fr.f_locals
        except Exception:
            continue
        fo = FrameLocals(loc)
        out.append((label, fo, "saved traceback"))
    return out


class FrameLocals(dict):
    """A frame's locals, seen as a container (one level deep)."""


FrameLocals.__name__ = "frame locals"


def _exc_chain(e, seen):
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def traceback_frames(shell):
    """(frame, label) of function frames in saved tracebacks: sys.last_*,
    InteractiveTB.tb, last_execution_result.error_in_exec, chained ones."""
    tbs = []
    excs = []
    for n in ("last_value", "last_exc"):
        e = sys.__dict__.get(n)
        if isinstance(e, BaseException):
            excs.append(e)
    ler = getattr(shell, "last_execution_result", None)
    e = getattr(ler, "error_in_exec", None)
    if isinstance(e, BaseException):
        excs.append(e)
    seen = set()
    for e0 in excs:
        for e in _exc_chain(e0, seen):
            if e.__traceback__ is not None:
                tbs.append((e.__traceback__, type(e).__name__))
    ltb = sys.__dict__.get("last_traceback")
    if ltb is not None:
        tbs.append((ltb, getattr(sys.__dict__.get("last_type"), "__name__", "exception")))
    itb = getattr(getattr(shell, "InteractiveTB", None), "tb", None)
    if itb is not None:
        tbs.append((itb, "exception"))
    frames = []
    fseen = set()
    for tb, ename in tbs:
        while tb is not None:
            fr = tb.tb_frame
            if id(fr) not in fseen:
                fseen.add(id(fr))
                # Module-level frames (a cell's own) have the namespace as
                # their locals: that is the user's, not the traceback's.
                if fr.f_code.co_flags & 0x0002:  # CO_NEWLOCALS: a function's frame
                    frames.append((fr, "%s traceback: %s() locals" % (ename, fr.f_code.co_name)))
            tb = tb.tb_next
    return frames


def scan_vars(all_devices=False):
    shell = state.shell
    holders = [(n, v, None) for n, v in user_vars(shell)]
    for ref, obj, what in hidden_holders(shell):
        holders.append((ref, obj, {"hidden": True, "where": "held by IPython: " + what}))
    rows, total = rows_from(holders, all_devices)
    return rows, total


def holders_of(objs, shell):
    """Names of user variables (one level deep) that hold any of objs' storages."""
    keys = set()
    ids = set(id(o) for o in objs)
    for o in objs:
        for k, _b, _d in holdings(o)[0]:
            keys.add(k)
    names = []
    for n, v in user_vars(shell):
        if id(v) in ids:
            names.append(n)
            continue
        for k, _b, _d in holdings(v)[0]:
            if k in keys:
                names.append(n)
                break
    for ref, obj, _w in hidden_holders(shell):
        if id(obj) in ids or any(k in keys for k, _b, _d in holdings(obj)[0]):
            names.append(ref)
    return names

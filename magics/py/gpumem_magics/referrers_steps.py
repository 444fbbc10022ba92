"""What each step of a chain of referrers is, in Python: the suffix that
reaches the next object (`.attr`, `[key]`, `.__closure__[0]`) and what
the step passes through (a closure cell, a functools cache, a class
attribute, a hook registry, a generator's or a saved traceback's frame).
referrers.py finds the chains; fixes.py turns the labels into a name and
a fix. It only reads the objects it is given, with the one exception of
CPython's own (see _locals).
"""

import types

from . import state

_HOOK_NAMES = frozenset(
    [
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    ]
)


def frame_locals(fr, clear=False):
    """(name, value) of a function frame's locals. With clear, the
    snapshot dict CPython keeps on the frame is emptied after reading."""
    try:
        loc = fr.f_locals
    except Exception:
        return []
    items = list(loc.items())
    if clear and type(loc) is dict:
        loc.clear()
    return items


# id(dict) -> {id(value): key} of the large dicts met while labelling one
# why call's chains: thousands of chains through one dict (a cache of
# tensors) looked each key up in a scan of it. forget() empties it: it
# holds the keys.
_INDEX = {}
_INDEXED = 256  # dicts of at least this many items are indexed


def forget():
    """Drops the index of large dicts (at the end of each why call)."""
    _INDEX.clear()


def _key_of(d, value):
    if len(d) >= _INDEXED:
        idx = _INDEX.get(id(d))
        if idx is None:
            idx = _INDEX[id(d)] = {}
            for k, v in d.items():
                idx.setdefault(id(v), k)
        k = idx.get(id(value), state.MISSING)
        # Checked: another thread may have changed the dict since.
        if k is not state.MISSING and d.get(k, state.MISSING) is value:
            return k, True
    for k, v in d.items():
        if v is value:
            return k, True
    for k in d:
        if k is value:
            return k, False
    return None, False


def _ident(k):
    return isinstance(k, str) and k.isidentifier()


def _instance_dict(o):
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


def _item(k):
    if isinstance(k, (str, int, float, bool, type(None))) or (isinstance(k, tuple) and len(repr(k)) <= 60):
        return "[%r]" % (k,)
    return None


def steps(objs):
    """Labels the chain objs (the root's container first, the target last)
    as [(code, note, kind)]: code is a Python suffix that reaches the next
    object (None where there is none), note says more, kind is None or
    one of 'closure', 'lru', 'class', 'hook', 'generator', 'frame',
    'attr', 'item', 'cell'."""
    out = []
    i = 0
    while i + 1 < len(objs):
        x, y = objs[i], objs[i + 1]
        z = objs[i + 2] if i + 2 < len(objs) else state.MISSING
        code, note, kind, used = _step(x, y, z)
        out.append((code, note, kind))
        i += used
    return out


def root_step(container, child, root):
    """The first step: the name under which a root's dict holds child."""
    k, is_value = _key_of(container, child)
    if not is_value or not isinstance(k, str):
        return (None, "(a key of %s)" % root[0], None)
    return (k, None, _attr_kind(None, k))


def _other(y):
    return (None, "-> %s" % type(y).__name__, None, 1)


def _step(x, y, z):
    """One step from x to y (or through y to z: used says 1 or 2)."""
    tname = type(x).__name__
    if isinstance(x, types.FunctionType):
        if y is x.__closure__ and z is not state.MISSING:
            i = next((i for i, c in enumerate(x.__closure__ or ()) if c is z), None)
            if i is not None:
                var = x.__code__.co_freevars[i] if i < len(x.__code__.co_freevars) else "?"
                return (".__closure__[%d]" % i, "(cell %r of %s)" % (var, x.__qualname__), "closure", 2)
        for attr in ("__defaults__", "__kwdefaults__", "__dict__", "__globals__", "__wrapped__"):
            if getattr(x, attr, None) is y:
                return ("." + attr, None, "attr", 1)
        return _other(y)
    if tname == "_lru_cache_wrapper":
        note = "(a result in the functools cache of %s)" % getattr(x, "__qualname__", "?")
        return (None, note, "lru", 2 if isinstance(y, dict) and z is not state.MISSING else 1)
    if isinstance(x, type):
        if isinstance(y, dict) and z is not state.MISSING:
            k, is_value = _key_of(y, z)
            if is_value and _ident(k):
                return ("." + k, "(class attribute of %s)" % x.__qualname__, "class", 2)
        return _other(y)
    if isinstance(x, types.ModuleType):
        if y is getattr(x, "__dict__", None) and z is not state.MISSING:
            k, _v = _key_of(y, z)
            if _ident(k):
                return ("." + k, None, "attr", 2)
        return _other(y)
    if tname == "cell":
        return (".cell_contents", None, "cell", 1)
    if isinstance(x, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        fr = getattr(x, "gi_frame", None) or getattr(x, "cr_frame", None) or getattr(x, "ag_frame", None)
        var = None
        if fr is not None:
            for k, v in frame_locals(fr, clear=True):
                if v is y:
                    var = k
                    break
        return (None, "(local %r of the suspended %s())" % (var, getattr(x, "__qualname__", "?")), "generator", 1)
    if isinstance(x, types.FrameType):
        var, used = None, 1
        if isinstance(y, dict) and z is not state.MISSING and y is x.f_locals:
            k, is_value = _key_of(y, z)
            var, used = (k, 2) if is_value else (None, 1)
        else:
            for k, v in frame_locals(x):
                if v is y:
                    var = k
                    break
        return (".f_locals[%r]" % var if var else None, "(local %r of %s())" % (var, x.f_code.co_name), "frame", used)
    if isinstance(x, types.TracebackType):
        return (".tb_frame" if y is x.tb_frame else ".tb_next", None, "attr", 1)
    if isinstance(x, BaseException):
        for attr in ("__traceback__", "__context__", "__cause__", "args"):
            if getattr(x, attr, None) is y:
                return ("." + attr, None, "attr", 1)
        return _other(y)
    if isinstance(x, types.MethodType):
        return (".__self__" if y is x.__self__ else ".__func__", None, "attr", 1)
    if isinstance(x, dict):
        k, is_value = _key_of(x, y)
        if not is_value:
            return (None, "(a key of a dict)" if k is not None else "-> %s" % type(y).__name__, "item", 1)
        return (_item(k), None if _item(k) else "(under a %s key)" % type(k).__name__, "item", 1)
    if isinstance(x, (list, tuple)) or tname == "deque":
        for i, v in enumerate(x):
            if v is y:
                return ("[%d]" % i, None, "item", 1)
        return _other(y)
    if isinstance(x, (set, frozenset)):
        return (None, "(a member of a %s)" % tname, "item", 1)
    d = _instance_dict(x)
    if d is not None:
        if y is d and z is not state.MISSING:
            k, is_value = _key_of(d, z)
            if is_value and _ident(k):
                return ("." + k, None, _attr_kind(x, k), 2)
        k, is_value = _key_of(d, y)
        if is_value and _ident(k):
            return ("." + k, None, _attr_kind(x, k), 1)
    for cls in type(x).__mro__:
        for slot in getattr(cls, "__slots__", ()) or ():
            if isinstance(slot, str) and getattr(x, slot, None) is y:
                return ("." + slot, None, "attr", 1)
    return (None, "-> %s (held by a %s)" % (type(y).__name__, tname), None, 1)


def _attr_kind(x, name):
    if name in _HOOK_NAMES or (name.startswith("_global_") and name.endswith("hooks")):
        return "hook"
    return "attr"

"""What a chain of referrers means for the user: its name, the chain as
text, what holds it (a closure cell, a functools cache, a hook registry,
...) and the one line of Python that frees it. Pure but for reading the
objects of the chain (referrers.steps)."""

import sys

from . import holders, referrers

_SPECIAL = ("hook", "lru", "generator", "closure", "class")  # what a fix goes for first

_ROOT_LABELS = {
    "variable": "a variable of the notebook",
    "module": "a module attribute",
    "thread": "a live thread's frame",
    "frozen": "gc.freeze()'s permanent generation",
    "cycle": "an unreachable reference cycle",
    "c_level": "a holder in C that gc cannot see into",
    "budget": "not searched: the budget ran out",
    "unsearched": "gc.freeze()'s objects, not searched",
}
_UNROOTED_NAMES = {
    "frozen": "an object frozen by gc.freeze(), which nothing else reaches",
    "cycle": "an unreachable reference cycle gc has not collected yet",
    "c_level": "a holder in C that gc cannot see into",
    "budget": "not searched: the budget ran out",
    "unsearched": "no holder found: gc.freeze()'s objects, which gpumem could not read, may hold it",
}
_HOLDER_LABELS = {
    "hook": "a hook registry",
    "lru": "a functools cache",
    "generator": "a suspended generator's frame",
    "closure": "a closure cell",
    "class": "a class attribute",
}


def describe(shell, root, objs):
    """name, chain, hops, root, holder and fix of one chain."""
    kind = root[0]
    if objs is None:
        return unrooted(kind)
    if kind == "thread":
        thread, func, var = root[1], root[2], root[3]
        head = "thread %r" % thread
        chain = [head, "(local %r of %s())" % (var, func)] + [_show(s) for s in referrers.steps(objs)]
        return {
            "name": "%s: %s() local %r" % (head, func, var),
            "chain": chain,
            "hops": len(chain),
            "root": _ROOT_LABELS["thread"],
            "holder": _ROOT_LABELS["thread"],
            "fix": "end thread %r (its %s() holds %r), or have it drop the reference" % (thread, func, var),
        }
    code, note, k = referrers.root_step(objs[0], objs[1], root) if len(objs) > 1 else (None, None, None)
    prefix, head = "", ""
    if kind == "module":
        mod = root[1]
        top = mod.split(".")[0]
        head = mod
        if getattr(shell, "user_ns", {}).get(top) is not sys.modules.get(top):
            prefix = "import %s; " % mod
        code = "." + code if code else None
    st = [(code, note, k)] + referrers.steps(objs[1:])
    display = [head + _show(st[0])] + [_show(s) for s in st[1:]]
    special = None
    for want in _SPECIAL:
        special = next(((i, want) for i, s in enumerate(st) if s[2] == want), None)
        if special:
            break
    name = head
    for c, n, _k in st:
        if c is None:
            name += (" " + n) if n else ""
            break
        name += c
    return {
        "name": name.strip() or display[0],
        "chain": display,
        "hops": len(display),
        "root": _ROOT_LABELS[kind],
        "holder": _HOLDER_LABELS[special[1]] if special else _ROOT_LABELS[kind],
        "fix": _fix(kind, prefix, head, st, special, shell),
    }


def _show(s):
    code, note, _k = s
    return " ".join(x for x in (code, note) if x) or "?"


def _expr(head, st, upto):
    """The Python expression of the chain up to step upto (exclusive), or
    None where a step has none."""
    parts = [head]
    for s in st[:upto]:
        if s[0] is None:
            return None
        parts.append(s[0])
    return "".join(parts)


def _fix(kind, prefix, head, st, special, shell):
    if special:
        i, what = special
        e = _expr(head, st, {"closure": i + 2, "class": i + 1}.get(what, i))
        if e and what == "lru":
            return prefix + e + ".cache_clear()"
        if e and what == "closure":
            return prefix + e + " = None"
        if e and what == "class":
            return prefix + "del " + e
        if e and what == "generator":
            return prefix + e + ".close()"
        if what == "hook":
            handle = _hook_handle(shell, st, i)
            if handle:
                return handle + ".remove()"
            e = _expr(head, st, i + 1)
            key = st[i + 1][0] if i + 1 < len(st) else None
            if e and key and key.startswith("[") and key.endswith("]"):
                return "%s%s.pop(%s)  # or .remove() the handle that registered it" % (prefix, e, key[1:-1])
    if kind == "variable":
        e = _expr("", st, len(st))
        if e and len(st) == 1:
            return "%gpumem free " + e
        if e:
            return "del " + e
        return "%gpumem free " + (st[0][0] or "")
    e = _expr(head, st, 1)
    if kind == "module" and e:
        return prefix + "del " + e
    return "restart the kernel (nothing in Python can reach it)"


def _hook_handle(shell, st, i):
    """The name of a user variable holding the RemovableHandle of the hook
    at step i, or None."""
    key = st[i + 1][0] if i + 1 < len(st) else None
    if not key or not key.startswith("["):
        return None
    for name, v in holders.user_vars(shell):
        if type(v).__name__ == "RemovableHandle" and "[%r]" % (getattr(v, "id", None),) == key:
            return name
    return None


def unrooted(reason):
    fixes = {
        "frozen": "gc.unfreeze(); gc.collect()",
        "cycle": "gc.collect()",
        "c_level": "restart the kernel (a C extension or C++ code holds it: nothing in Python can release it)",
        "budget": "%gpumem why --budget 10",
        "unsearched": "gc.unfreeze(); gc.collect()",
    }
    label = _ROOT_LABELS.get(reason, reason)
    return {
        "name": _UNROOTED_NAMES.get(reason, label),
        "chain": [label],
        "hops": 1,
        "root": label,
        "holder": label,
        "fix": fixes.get(reason, "restart the kernel"),
    }

"""The shortest chain of references from a root to an object: who holds a
buffer that no variable reaches.

A breadth-first search upwards from the buffers (gc.get_referrers, one
call per level for the whole frontier) stops at a root:
  - a variable of the notebook, or an attribute of a module in sys.modules;
  - a local of a live thread's frame (those frames are not gc objects:
    their locals are read once, before the search);
and says what it met on the way: a closure cell, a functools cache, a
class attribute, a hook registry (module._forward_hooks), a generator's
frame, a saved traceback's frame. A search that ends without a root says
why: the holder is frozen by gc.freeze() (frozen.py reads those objects),
is a reference cycle gc has not collected yet, or is something in C that
gc cannot see into.

It only reads: the objects it meets are dropped before it returns. The
one exception is CPython's own: reading a frame's f_locals (3.11, 3.12)
makes a snapshot dict that lives with the frame; for a suspended
generator's or another thread's frame the snapshot is emptied again
(CPython refills it from the frame at the next read).
"""

import gc
import sys
import time
import types

from . import referrers_steps

MAX_LEVELS = 16
_FEW = 64  # a frontier up to this size is searched with gc.get_referrers

_CO_NEWLOCALS = 0x0002
_OUR_FILES = "<gpumem_magics/"


class Budget(object):
    """Seconds to spend. The search stops at 90% of them: one more level of
    it, and the rows after it, fit in the rest."""

    def __init__(self, seconds):
        self.seconds = max(0.05, float(seconds))
        self.start = time.perf_counter()
        self.deadline = self.start + 0.9 * self.seconds

    def over(self):
        return time.perf_counter() > self.deadline

    def elapsed_ms(self):
        return int((time.perf_counter() - self.start) * 1000)


# The package's modules are named PACKAGE.module, injected or imported.
_PACKAGE = __name__.rpartition(".")[0] + "."


def _is_ours(o):
    """Whether o is a frame of gpumem's own code: by the file name the
    bootstrap compiles it under, or by its module's name where it was
    imported from files (the tests)."""
    if isinstance(o, types.FrameType):
        if o.f_code.co_filename.startswith(_OUR_FILES):
            return True
        name = o.f_globals.get("__name__")
        return _PACKAGE != "." and isinstance(name, str) and name.startswith(_PACKAGE)
    return False


def module_dicts():
    """id(module.__dict__) -> module name, for the modules in sys.modules."""
    out = {}
    for name, m in list(sys.modules.items()):
        d = getattr(m, "__dict__", None)
        if isinstance(d, dict) and id(d) not in out:
            out[id(d)] = name
    return out


def thread_locals():
    """The locals of other threads' function frames, which gc does not
    traverse: ({id: (thread name, function, variable)}, {id: value})."""
    import threading

    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    info, values = {}, {}
    frames = sys._current_frames()
    try:
        for ident, fr in frames.items():
            if ident == me:
                continue
            while fr is not None:
                if fr.f_code.co_flags & _CO_NEWLOCALS and not _is_ours(fr):
                    for var, value in referrers_steps.frame_locals(fr, clear=True):
                        if id(value) not in info:
                            info[id(value)] = (names.get(ident, str(ident)), fr.f_code.co_name, var)
                            values[id(value)] = value
                fr = fr.f_back
    finally:
        frames.clear()
        del frames
    return info, values


class Baseline(object):
    """The containers that exist when gpumem starts looking. With gc
    disabled, every container made after that stays in generation 0: a
    referrer there that was not in the baseline is gpumem's own (a list of
    objects it is looking at), never a holder."""

    def __init__(self):
        self.ok = sys.version_info >= (3, 8)
        self.ids = set(id(o) for o in gc.get_objects(0)) if self.ok else set()

    def new_ids(self):
        if not self.ok:
            return set()
        return set(id(o) for o in gc.get_objects(0)) - self.ids


class Search(object):
    """A search from targets (objects) to roots: run(), then chains() for
    the targets that reached one and why_unrooted() for the others.
    baseline (gc disabled meanwhile) tells gpumem's own containers from
    the kernel's; exclude lists more of them."""

    def __init__(self, shell, budget, baseline, exclude=()):
        self.shell = shell
        self.budget = budget
        self.user_ns = getattr(shell, "user_ns", None)
        self.moddicts = module_dicts()
        self.nodes = []  # objects met, by node number
        self.index = {}  # id -> node number
        self.level = []
        self.kids = []  # node -> nodes one level down that it refers to
        self.roots = []  # (level, priority, node, root)
        self.dead = set()
        self.stopped = None
        self.ours = set(id(x) for x in exclude)
        self.ours.update((id(self.nodes), id(self.index), id(self.kids)))
        self.tinfo, self.tvalues = {}, {}
        self.frozen_objs = None
        self.frozen_unread = False  # gc.freeze()'s objects not all read (frozen.py)
        self._below = None
        self.tnodes = []
        self.baseline = baseline
        self.ours.update((id(self), id(self.__dict__)))

    def _add(self, obj, level):
        n = len(self.nodes)
        self.nodes.append(obj)
        self.index[id(obj)] = n
        self.level.append(level)
        self.kids.append([])
        t = self.tinfo.get(id(obj))
        if t is not None and self.tvalues.get(id(obj)) is obj:
            self.roots.append((level, 3, n, ("thread",) + t))
            return n, True
        return n, False

    def _root_of(self, r):
        if r is self.user_ns:
            return ("variable",)
        name = self.moddicts.get(id(r))
        if name is not None and isinstance(r, dict):
            return ("variable",) if name == "__main__" else ("module", name)
        return None

    def _referrers(self, objs):
        frontier = list(objs)
        self.ours.add(id(frontier))
        try:
            if len(frontier) <= _FEW:
                found = gc.get_referrers(*frontier)
            else:
                # gc.get_referrers compares every referent of every object
                # with each of its arguments: for thousands of targets
                # (a frozen heap's tensors) one call ran for minutes, past
                # any budget. One pass over gc's objects with a set instead.
                pool = gc.get_objects()
                self.ours.add(id(pool))
                try:
                    found = self._scan(pool, frontier, "the referrer search")
                finally:
                    self.ours.discard(id(pool))
                    pool[:] = []
                    del pool
            if self.frozen_objs and not self.stopped:
                found += self._scan(self.frozen_objs, frontier, "the referrer search among gc.freeze()'s objects")
            return found
        finally:
            self.ours.discard(id(frontier))
            del frontier

    def _scan(self, pool, frontier, where):
        """The objects of pool that refer to one of frontier: a chunk at a
        time in C, and one by one only in a chunk that does; the budget is
        checked between chunks (stopped says where)."""
        ids = set(map(id, frontier))
        out = []
        for i in range(0, len(pool), 4096):
            if self.budget.over():
                self.stopped = where
                break
            if ids.isdisjoint(map(id, gc.get_referents(*pool[i : i + 4096]))):
                continue
            for f in pool[i : i + 4096]:
                if not ids.isdisjoint(map(id, gc.get_referents(f))):
                    out.append(f)
        return out

    def run(self, targets, levels=MAX_LEVELS):
        """Searches upwards from targets; returns their node numbers."""
        self.tinfo, self.tvalues = thread_locals()
        self.ours.add(id(self.tvalues))
        self.tnodes = []
        frontier = []
        for t in targets:
            if id(t) in self.index:
                self.tnodes.append(self.index[id(t)])
                continue
            n, is_root = self._add(t, 0)
            self.tnodes.append(n)
            if not is_root:
                frontier.append(n)
        self._levels(frontier, 1, levels)
        return self.tnodes

    def extend(self, frozen_objs, unrooted=(), levels=MAX_LEVELS):
        """Searches on from the nodes no visible referrer holds, and from
        the unrooted targets themselves (a visible referrer that leads
        nowhere does not make a frozen one less of a holder), with the
        objects gc.freeze() froze as referrers too (frozen.py)."""
        self.frozen_objs = frozen_objs
        self.ours.add(id(frozen_objs))
        frontier = sorted(self.dead.union(unrooted))
        self.dead = set()
        self._below = None
        self._levels(frontier, 1 + max([self.level[i] for i in frontier] or [0]), levels)

    def _levels(self, frontier, first, levels):
        for lvl in range(first, first + levels):
            if not frontier:
                break
            if self.budget.over():
                self.stopped = "the referrer search, %d levels up%s" % (
                    lvl - 1,
                    " among gc.freeze()'s objects" if self.frozen_objs else "",
                )
                break
            fset = set(id(self.nodes[i]) for i in frontier)
            refs = self._referrers([self.nodes[i] for i in frontier])
            self.ours.add(id(refs))
            try:
                if self.stopped:
                    break
                seen_from, nxt = self._level(refs, fset, lvl)
            finally:
                # Emptied on every way out: the referrers include frames
                # (gpumem's own among them) that must not outlive the call.
                self.ours.discard(id(refs))
                refs[:] = []
                del refs
            for i in frontier:
                if i not in seen_from:
                    self.dead.add(i)
            frontier = nxt
            if self._resolved(self.tnodes):
                break

    def _level(self, refs, fset, lvl):
        """Adds the referrers refs of the frontier (ids fset) as nodes of
        level lvl: (the frontier's nodes some referrer holds, the next
        frontier)."""
        new = self.baseline.new_ids()
        seen_from = set()
        nxt = []
        for r in refs:
            if id(r) in self.ours or id(r) in new or _is_ours(r):
                continue
            kids = [self.index[id(x)] for x in gc.get_referents(r) if id(x) in fset]
            if not kids:
                continue
            seen_from.update(kids)
            n = self.index.get(id(r))
            if n is not None:  # met before, for another target: a path for this one too
                self.kids[n].extend(kids)
                continue
            root = self._root_of(r)
            n, is_root = self._add(r, lvl)
            self.kids[n].extend(kids)
            if root is not None:
                self.roots.append((lvl, 0 if root[0] == "variable" else 1, n, root))
            elif not is_root:
                nxt.append(n)
        return seen_from, nxt

    def _resolved(self, tnodes):
        """Whether every target is below a root already (cheap check: any
        root at all reaches each target)."""
        reach = set()
        for _l, _p, n, _r in self.roots:
            stack = [n]
            while stack:
                m = stack.pop()
                if m in reach:
                    continue
                reach.add(m)
                stack.extend(self.kids[m])
        return all(t in reach for t in tnodes)

    def chains(self, tnodes):
        """{target node: (root, [node numbers from the root down])}: a
        breadth-first walk down from every root at once gives each target
        its nearest root (the better root first among equals)."""
        from collections import deque

        via, owner = {}, {}
        queue = deque()
        for _lvl, _p, n, root in sorted(self.roots, key=lambda r: (r[1], r[0])):
            if n not in via:
                via[n], owner[n] = None, root
                queue.append(n)
        while queue:
            m = queue.popleft()
            for k in self.kids[m]:
                if k not in via:
                    via[k], owner[k] = m, owner[m]
                    queue.append(k)
        out = {}
        for t in tnodes:
            if t not in via:
                continue
            path = [t]
            while via[path[-1]] is not None:
                path.append(via[path[-1]])
            path.reverse()
            out[t] = (owner[t], path)
        return out

    def why_unrooted(self, t):
        """Why target node t reached no root: 'frozen', 'cycle', 'c_level',
        'unsearched' (where it met no visible referrer and gc.freeze()'s
        objects could not all be read: its holder may be one of them) or
        'budget'."""
        if self.stopped:
            return "budget"
        if self._below is None:
            self._below = self._below_frozen_and_dead()
        below_frozen, below_dead = self._below
        if t in below_frozen:
            return "frozen"
        if t in below_dead:
            return "unsearched" if self.frozen_unread else "c_level"
        return "cycle"

    def _below_frozen_and_dead(self):
        """(the nodes a frozen node holds, directly or not; the nodes at or
        below one no visible referrer holds): two passes down the kids,
        whatever the number of targets (one walk up per target was
        quadratic, and ran for minutes with thousands of them)."""
        frozen_ids = set(map(id, self.frozen_objs or ()))  # a million ids, in C

        def down(start):
            seen, stack = set(), list(start)
            while stack:
                m = stack.pop()
                if m not in seen:
                    seen.add(m)
                    stack.extend(self.kids[m])
            return seen

        frozen_nodes = [n for n, o in enumerate(self.nodes) if id(o) in frozen_ids]
        frozen_ids.clear()
        return down(k for n in frozen_nodes for k in self.kids[n]), down(self.dead)

    def release(self):
        self.nodes[:] = []
        self.index.clear()
        self.kids[:] = []
        self.roots[:] = []
        self.tinfo, self.tvalues = {}, {}
        self.frozen_objs = None
        self._below = None
        self.tnodes = []


# The labels of a chain's steps (referrers_steps.py), as fixes.py reads them.
steps = referrers_steps.steps
root_step = referrers_steps.root_step

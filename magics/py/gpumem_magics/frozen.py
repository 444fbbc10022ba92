"""The objects gc.freeze() moved to the permanent generation, which
gc.get_objects() and gc.get_referrers() never show.

An object that became garbage after gc.freeze() is never collected, so it
can pin GPU memory for the life of the kernel, invisibly. CPython has no
API that lists the permanent generation, so this module reads its list
(a doubly linked list of GC headers) through ctypes, read-only, and only
where it can prove it found the list:
  - CPython 3.11 with the GIL, whose gc state is laid out as
    generations[3], a generation0 pointer to generations[0], then the
    permanent generation. 3.12 declares the same layout, but on a real
    kernel there (torch on CUDA, a frozen heap) the search through the
    objects read this way did not return within minutes: until that is
    understood, 3.12 and later are not read;
  - the gc state is found in the interpreter's state by that self-pointer
    and the thresholds gc.get_threshold() reports, and the list must be
    closed at both ends (head -> first -> ... -> last -> head).
Anything else returns None and the caller says what it could not see.
While it walks, gc is disabled and the thread switch interval is long: no
other code runs that could free a frozen object under the walk. It writes
nothing, and keeps no object after the caller drops its results.
"""

import gc
import sys

_LAYOUTS = ((3, 11),)
_SCAN = 1 << 16  # bytes of the interpreter's state searched for the gc state


def count():
    return gc.get_freeze_count() if hasattr(gc, "get_freeze_count") else 0


def _head():
    """The permanent generation's list head (an address), or None."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in _LAYOUTS:
        return None
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return None
    import ctypes

    get = ctypes.pythonapi.PyInterpreterState_Get
    get.restype = ctypes.c_void_p
    get.argtypes = []
    interp = get()
    if not interp:
        return None
    word = ctypes.c_size_t.from_address
    i32 = ctypes.c_int.from_address
    thresholds = tuple(gc.get_threshold())
    for off in range(0, _SCAN, 8):
        a = interp + off
        # generations[0].head at a; generation0 (a pointer to it) follows
        # the three generations of 24 bytes each.
        if word(a + 72).value != a:
            continue
        if (i32(a + 16).value, i32(a + 40).value, i32(a + 64).value) != thresholds:
            continue
        head = a + 80
        first, last = word(head).value, word(head + 8).value & ~3
        if word(first + 8).value & ~3 != head or word(last).value != head:
            return None
        return head
    return None


class Walk(object):
    """with Walk() as w: w.objects(keep) lists the frozen objects whose type
    keep(tp) accepts (keep=None: all of them), up to w.limit; w.complete
    says whether the whole list was read. w.ok is False where the list
    cannot be found (see the module's doc)."""

    def __init__(self, deadline=None):
        self.deadline = deadline
        self.complete = False
        self.ok = False
        self.total = count()

    def __enter__(self):
        self._gc = gc.isenabled()
        gc.disable()
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(1000.0)
        try:
            self._headaddr = _head() if self.total else None
        except Exception:
            self._headaddr = None
        self.ok = self._headaddr is not None
        return self

    def __exit__(self, *exc):
        sys.setswitchinterval(self._switch)
        if self._gc:
            gc.enable()
        return False

    def objects(self, keep=None):
        if not self.ok:
            return []
        import ctypes
        import time

        word = ctypes.c_size_t.from_address
        head = self._headaddr
        verdict = {}  # type address -> keep(type)
        addrs = []
        node = word(head).value
        n = 0
        while node != head:
            n += 1
            if n > self.total + 1:
                break  # not the list we proved: stop
            if keep is None:
                addrs.append(node + 16)
            else:
                tp = word(node + 24).value  # ob_type, after ob_refcnt
                v = verdict.get(tp)
                if v is None:
                    try:
                        v = bool(keep(ctypes.cast(tp, ctypes.py_object).value))
                    except Exception:
                        v = False
                    verdict[tp] = v
                if v:
                    addrs.append(node + 16)
            node = word(node).value
            if self.deadline is not None and not n & 4095 and time.perf_counter() > self.deadline:
                break
        else:
            self.complete = True
        if not addrs:
            return []
        # The objects, at once: an array of their addresses read as an
        # array of object references (each one a new reference).
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.py_object * len(addrs))).contents[:]

"""Leaves the kernel as gpumem found it.

IPython overwrites some of its state even for a silent execute, and a
magic's own failure could overwrite more (all measured on ipykernel 6.17):
  - an exception that reaches IPython sets sys.last_type/value/traceback/exc,
    which %debug, %tb and the user's own code read;
  - every run_cell, silent or not, replaces shell.last_execution_result and
    last_execution_succeeded;
  - IPython keeps every cell's source in linecache, gpumem's cells included.

kept_last() restores sys.last_* around gpumem's code (the %gpumem magic runs
in the user's own cell, so only those are ours to restore). silent_cell()
does that and, after the silent cell that carries gpumem's code, puts back
last_execution_result and drops that cell from linecache, through a one-shot
post_execute callback (the only point after run_cell has overwritten them).

This module imports nothing of the package: the bootstrap loads it first so
that even a failure to load the rest leaves no trace.
"""

import linecache
import sys

LAST_NAMES = ("last_type", "last_value", "last_traceback", "last_exc")
_MISSING = object()


def save_last():
    return {n: sys.__dict__.get(n, _MISSING) for n in LAST_NAMES}


def restore_last(saved):
    for n, v in saved.items():
        if sys.__dict__.get(n, _MISSING) is v:
            continue
        if v is _MISSING:
            try:
                delattr(sys, n)
            except AttributeError:
                pass
        else:
            setattr(sys, n, v)


class kept_last(object):
    """with kept_last(): sys.last_* are as before afterwards, whatever ran."""

    def __enter__(self):
        self._saved = save_last()
        return self

    def __exit__(self, *exc):
        restore_last(self._saved)
        return False


class silent_cell(kept_last):
    """with silent_cell(shell, marker): for the body of a silent execute whose
    cell's first line contains marker. Restores sys.last_* on exit and, once
    the cell is done, last_execution_result/succeeded and linecache."""

    def __init__(self, shell, marker):
        self._shell = shell
        self._marker = marker

    def __enter__(self):
        restore_after_cell(self._shell, self._marker, sys._getframe(1))
        return kept_last.__enter__(self)


def _cell_filename(frame, marker):
    """The filename of the first frame, walking outwards, whose source is a
    cached cell starting with marker."""
    while frame is not None:
        fn = frame.f_code.co_filename
        entry = linecache.cache.get(fn)
        if entry and len(entry) > 2 and entry[2] and marker in entry[2][0]:
            return fn
        frame = frame.f_back
    return None


def restore_after_cell(shell, marker, frame):
    """Arranges for what run_cell overwrites to be put back after this cell."""
    ler = getattr(shell, "last_execution_result", None)
    les = getattr(shell, "last_execution_succeeded", True)
    cell = _cell_filename(frame, marker)
    del frame

    def restore():
        try:
            shell.events.unregister("post_execute", restore)
        except Exception:
            pass
        try:
            shell.last_execution_result = ler
            shell.last_execution_succeeded = les
        except Exception:
            pass
        if cell is not None:
            linecache.cache.pop(cell, None)
            getattr(linecache, "_ipython_cache", {}).pop(cell, None)
            getattr(getattr(shell, "compile", None), "_filename_map", {}).pop(cell, None)

    shell.events.register("post_execute", restore)

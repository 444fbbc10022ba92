"""The out-of-memory report in a real IPython shell: a cell raises a
framework's error as the framework raises it, the report follows the
traceback, the traceback and sys.last_* stay IPython's, and nothing of the
failing frames is kept once IPython lets them go."""

import gc
import sys
import weakref

import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpumem_magics import magic, oom

TORCH_MSG = "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 79.35 GiB of which 512.00 MiB is free."


@pytest.fixture
def shell(capsys):
    sh = InteractiveShell.instance()
    magic.install(sh, {"version": "test"})
    sh.user_ns["CUPY_OOM"] = type("OutOfMemoryError", (MemoryError,), {"__module__": "cupy.cuda.memory"})
    yield sh
    magic.uninstall()
    for n in ("CUPY_OOM", "big", "hold"):
        sh.user_ns.pop(n, None)
    capsys.readouterr()


def run(shell, capsys, code):
    shell.run_cell(code, store_history=True)
    return capsys.readouterr().out


def test_report_under_the_traceback_without_daemon(shell, capsys):
    out = run(shell, capsys, "raise CUPY_OOM('Out of memory allocating 1,073,741,824 bytes (allocated so far: 0 bytes).')")
    tb = out.index("OutOfMemoryError")
    rep = out.index("gpumem: out of memory in cell [")
    assert tb < rep, out
    assert "asked for 1.0 GiB (cupy.cuda.memory.OutOfMemoryError)" in out
    assert "line 1: raise CUPY_OOM(" in out
    assert "gpumem serve is not running: this is what the kernel alone knows." in out
    assert out.count("gpumem: out of memory") == 1


def test_torch_error_as_torch_raises_it(shell, capsys, torch):
    cls = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    shell.user_ns["TorchOOM"] = cls
    out = run(shell, capsys, "def step():\n    x = [1] * 10\n    raise TorchOOM(%r)\nstep()" % TORCH_MSG)
    assert "asked for 4.0 GiB on cuda:0 (%s.%s)" % (cls.__module__, cls.__name__) in out, out
    # The innermost frame in the cell: the line that raised, inside step().
    assert "gpumem: out of memory in cell [" in out and ", line 3: raise TorchOOM(" in out
    shell.user_ns.pop("TorchOOM", None)


def test_other_errors_get_no_report(shell, capsys):
    out = run(shell, capsys, "raise ValueError('CUDA out of memory. Tried to allocate 1 GiB')")
    assert "gpumem" not in out
    assert "gpumem" not in run(shell, capsys, "1 + 1")


def test_a_failing_report_prints_one_line_and_keeps_the_traceback(shell, capsys, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("probe broke")

    monkeypatch.setattr(oom, "kernel_figures", broken)
    out = run(shell, capsys, "raise CUPY_OOM('Out of memory allocating 1 bytes')")
    lines = [ln for ln in out.splitlines() if "gpumem" in ln]
    assert lines == ["gpumem: could not build the out-of-memory report (RuntimeError: probe broke)"], out
    assert "OutOfMemoryError" in out.split(lines[0])[0]
    assert type(sys.last_value).__name__ == "OutOfMemoryError"
    assert shell.last_execution_result.error_in_exec is sys.last_value


def test_sys_last_are_ipythons(shell, capsys):
    run(shell, capsys, "raise CUPY_OOM('Out of memory allocating 8 bytes')")
    e = sys.last_value
    assert type(e).__name__ == "OutOfMemoryError" and sys.last_traceback is e.__traceback__


def test_no_reference_to_the_failing_frames(shell, capsys):
    class Pinned:
        pass

    shell.user_ns["Pinned"] = Pinned
    shell.user_ns["refs"] = []
    run(
        shell,
        capsys,
        "import weakref\n"
        "def forward():\n"
        "    activation = Pinned()\n"
        "    refs.append(weakref.ref(activation))\n"
        "    raise CUPY_OOM('Out of memory allocating 1,024 bytes')\n"
        "forward()",
    )
    ref = shell.user_ns["refs"][0]
    assert ref() is not None  # IPython's saved traceback holds it
    # IPython lets go: its references to the error and its traceback.
    for n in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, n):
            delattr(sys, n)
    shell.last_execution_result = None
    shell.InteractiveTB.tb = None
    shell.user_ns.pop("refs")
    gc.collect()
    assert ref() is None, "something besides IPython kept the failing frame: %r" % gc.get_referrers(ref())
    shell.user_ns.pop("Pinned")


def test_the_report_names_what_ipython_holds(shell, capsys, torch):
    # CPU tensors in the traceback's frames are not GPU memory: IPython
    # holds none of it, the report says.
    out = run(
        shell,
        capsys,
        "import torch\ndef f():\n    act = torch.zeros(1000)\n    raise CUPY_OOM('Out of memory allocating 1,024 bytes')\nf()",
    )
    assert "held only by IPython: nothing on a GPU" in out


def test_uninstall_removes_the_hook(shell, capsys):
    magic.uninstall()
    out = run(shell, capsys, "raise CUPY_OOM('Out of memory allocating 1,024 bytes')")
    assert "gpumem" not in out
    magic.install(shell, {"version": "test"})
    assert shell.events.callbacks["post_run_cell"].count(oom.oom_hook) == 1


def test_weakref_helper_sanity():
    # The leak test above relies on weakrefs dying with their object.
    class Obj:
        pass

    o = Obj()
    r = weakref.ref(o)
    del o
    gc.collect()
    assert r() is None

"""%gpumem record's arguments, and what recording and snapshots say where
they cannot work (no torch imported, a torch without CUDA)."""

import sys

import pytest

from gpumem_magics import recording, render


@pytest.mark.parametrize(
    "args, want",
    [
        ([], ("status", None)),
        (["on"], ("on", None)),
        (["on", "--max-entries", "500"], ("on", 500)),
        (["on", "--max-entries=7"], ("on", 7)),
        (["off"], ("off", None)),
    ],
)
def test_parse_record_args(args, want):
    assert recording.parse_record_args(args) == want


@pytest.mark.parametrize(
    "args, msg",
    [
        (["on", "--max-entries", "many"], "whole number"),
        (["on", "--max-entries", "0"], "at least 1"),
        (["off", "--max-entries", "5"], "goes with `record on`"),
        (["sideways"], "usage: %gpumem record on"),
    ],
)
def test_parse_record_args_errors(args, msg):
    with pytest.raises(ValueError, match=msg.replace("%", "%")):
        recording.parse_record_args(args)


def test_without_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    data = recording.record_data(["on"])
    assert data["error"].startswith("PyTorch is not imported in this kernel")
    assert not recording.is_recording()
    assert recording.snapshot_data()["error"].startswith("PyTorch is not imported")
    text, _ = render.render(data)
    assert text.startswith("gpumem record: PyTorch is not imported")


def test_status_is_off_by_default():
    data = recording.record_data([])
    assert data == {"kind": "record", "schema": 1, "on": False, "max_entries": None, "armed": False}
    assert render.render(data)[0].endswith("is off (`%gpumem record on [--max-entries N]` turns it on).")


def test_a_torch_without_cuda(torch):
    if torch.cuda.is_available():
        pytest.skip("this torch sees a GPU: scripts/gpuhost/oom_check.py checks recording there")
    data = recording.record_data(["on"])
    assert "sees no CUDA GPU" in data["error"], data
    assert not recording.is_recording()
    assert "sees no CUDA GPU" in recording.snapshot_data()["error"]


class FakeCuda:
    """A torch whose CUDA a test initialises, recording the history calls."""

    def __init__(self):
        self.initialised = False
        self.calls = []
        outer = self

        class Memory:
            def _record_memory_history(self, enabled="all", **kw):
                outer.calls.append((enabled, kw.get("max_entries")))

        class Cuda:
            memory = Memory()

            def is_available(self):
                return True

            def is_initialized(self):
                return outer.initialised

        self.cuda = Cuda()
        self._C = type("C", (), {"_cuda_getDeviceCount": staticmethod(lambda: 1)})
        self.__version__ = "fake"


def test_record_on_waits_for_cuda(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    from gpumem_magics import state

    shell = InteractiveShell.instance()
    monkeypatch.setattr(state, "shell", shell)
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", fake)
    data = recording.record_data(["on", "--max-entries", "42"])
    assert data["armed"] and not data["on"] and fake.calls == [], data
    assert "CUDA is not initialised in this kernel yet" in render.render(data)[0]
    # A cell that does not touch CUDA: still waiting, nothing called.
    recording.armed_hook(None)
    assert fake.calls == [] and not recording.is_recording()
    # A cell initialised CUDA: recording starts, the hook leaves.
    fake.initialised = True
    recording.armed_hook(None)
    assert fake.calls == [("all", 42)] and recording.is_recording()
    assert recording.armed_hook not in shell.events.callbacks["post_run_cell"]
    off = recording.record_data(["off"])
    assert fake.calls[-1] == (None, None) and not off["on"] and not recording.is_recording()


class _History:
    """torch.cuda.memory's _record_memory_history as a stand-in records its
    calls (no GPU here); refuse makes the next call raise."""

    def __init__(self):
        self.calls = []
        self.refuse = None

    def _record_memory_history(self, enabled=None, **kw):
        if self.refuse:
            e, self.refuse = self.refuse, None
            raise e
        self.calls.append((enabled, kw.get("max_entries")))


@pytest.fixture
def cuda_torch(monkeypatch):
    """A torch that sees a GPU and has initialised CUDA, as far as
    recording asks; recording's state put back after."""
    import types

    mem = _History()
    cuda = types.SimpleNamespace(memory=mem, is_available=lambda: True, is_initialized=lambda: True)
    fake = types.SimpleNamespace(cuda=cuda, _C=types.SimpleNamespace(_cuda_getDeviceCount=lambda: 1), __version__="fake")
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(recording, "_state", {"on": False, "max_entries": None, "armed": None})
    return mem


def test_record_on_and_off(cuda_torch):
    data = recording.record_data(["on", "--max-entries", "5"])
    assert (data["on"], data["max_entries"], "error" in data) == (True, 5, False)
    assert recording.is_recording()
    data = recording.record_data(["off"])
    assert (data["on"], data["max_entries"], "error" in data) == (False, None, False)
    assert not recording.is_recording()
    assert cuda_torch.calls == [("all", 5), (None, None)]
    # Off while off asks PyTorch nothing.
    data = recording.record_data(["off"])
    assert (data["on"], "error" in data) == (False, False)
    assert cuda_torch.calls == [("all", 5), (None, None)]


def test_record_refused(cuda_torch):
    cuda_torch.refuse = RuntimeError("no")
    data = recording.record_data(["on"])
    assert data["error"] == "PyTorch refused: RuntimeError: no"
    assert "on" not in data and not recording.is_recording()
    recording.record_data(["on"])
    cuda_torch.refuse = RuntimeError("still no")
    data = recording.record_data(["off"])
    assert data["error"] == "PyTorch refused: RuntimeError: still no"
    assert recording.is_recording(), "a refused off leaves recording on"

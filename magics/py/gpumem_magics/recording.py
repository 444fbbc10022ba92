"""%gpumem record and %gpumem snapshot: PyTorch's memory history
(torch.cuda.memory._record_memory_history), off by default, and snapshots
of it (torch.cuda.memory._dump_snapshot, the pickle pytorch.org/memory_viz
opens), taken on demand or after an out-of-memory error while recording.
A snapshot is written to a directory of this user's only and handed to
gpumem serve, which reduces it for the JupyterLab panel."""

import os
import tempfile
import time

from . import daemon, display, state

# Trace entries kept when --max-entries is not given: a ring of the last
# ones (each several KB in the snapshot; 100,000 is a few hundred MB at
# most).
DEFAULT_MAX_ENTRIES = 100000
# Snapshot files of this kernel kept on disk (the daemon keeps its own
# descriptors of the ones it took).
KEEP_FILES = 8

# on: PyTorch records now; armed: the entries to record once CUDA is
# initialised (record on before any cell used the GPU), else None.
_state = {"on": False, "max_entries": None, "armed": None}


def is_recording():
    return _state["on"]


def _torch_memory():
    """torch.cuda.memory when recording can work here, else (None, why)."""
    torch = state.mod("torch")
    if torch is None:
        return None, "PyTorch is not imported in this kernel: import torch first (gpumem never imports it for you)"
    mem = getattr(getattr(torch, "cuda", None), "memory", None)
    if mem is None or not hasattr(mem, "_record_memory_history"):
        return None, "this PyTorch (%s) has no memory history (torch.cuda.memory._record_memory_history)" % getattr(
            torch, "__version__", "?"
        )
    if not hasattr(torch._C, "_cuda_getDeviceCount") or not torch.cuda.is_available():
        return None, "this PyTorch (%s) sees no CUDA GPU: there is no GPU memory to record" % getattr(torch, "__version__", "?")
    return mem, None


def parse_record_args(args):
    """(action, max_entries): action "on", "off" or "status"."""
    action, max_entries = "status", None
    it = iter(args)
    for a in it:
        if a in ("on", "off"):
            action = a
        elif a == "--max-entries" or a.startswith("--max-entries="):
            v = a.split("=", 1)[1] if "=" in a else next(it, "")
            try:
                max_entries = int(v)
            except ValueError:
                raise ValueError("--max-entries takes a whole number of trace entries, not %r" % v) from None
            if max_entries <= 0:
                raise ValueError("--max-entries must be at least 1")
        else:
            raise ValueError("unexpected %r; usage: %%gpumem record on [--max-entries N] | off" % a)
    if max_entries is not None and action != "on":
        raise ValueError("--max-entries goes with `record on`")
    return action, max_entries


def record_data(args):
    """%gpumem record on|off: the data dict (kind "record")."""
    data = {"kind": "record", "schema": state.SCHEMA}
    try:
        action, max_entries = parse_record_args(args)
    except ValueError as e:
        data["error"] = str(e)
        return data
    if action == "status":
        data.update(on=_state["on"], max_entries=_state["max_entries"], armed=_state["armed"] is not None)
        return data
    mem, why = _torch_memory()
    if mem is None:
        data["error"] = why
        return data
    torch = state.mod("torch")
    if action == "off":
        _disarm()
        return _switch(data, mem, None)
    n = max_entries or DEFAULT_MAX_ENTRIES
    if not torch.cuda.is_initialized():
        # torch's _record_memory_history initialises CUDA itself: gpumem
        # never does. It is turned on after the first cell that does.
        _arm(n)
        data.update(on=False, armed=True, max_entries=n)
        return data
    return _switch(data, mem, n)


def _switch(data, mem, n):
    """Turns recording on (n entries) or off (None; PyTorch is asked only
    when it records) and says so in data, or PyTorch's refusal."""
    if n is not None or _state["on"]:
        try:
            _set(mem, n)
        except Exception as e:
            data["error"] = "PyTorch refused: %s" % state.short_exc(e)
            return data
    _state.update(on=n is not None, max_entries=n)
    data.update(on=n is not None, max_entries=n)
    return data


def _set(mem, n):
    """Turns PyTorch's memory history on (n entries) or off (None)."""
    if n is None:
        try:
            mem._record_memory_history(enabled=None)
        except TypeError:  # PyTorch before 2.1
            mem._record_memory_history(False)
        return
    try:
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=n)
    except TypeError:
        mem._record_memory_history(True, trace_alloc_max_entries=n, trace_alloc_record_context=True)


def _arm(n):
    _state["armed"] = n
    hooks = state.shell.events.callbacks.get("post_run_cell", [])
    if armed_hook not in hooks:
        state.shell.events.register("post_run_cell", armed_hook)


def _disarm():
    _state["armed"] = None
    try:
        if armed_hook in state.shell.events.callbacks.get("post_run_cell", []):
            state.shell.events.unregister("post_run_cell", armed_hook)
    except Exception:
        pass


def armed_hook(*_args):
    """post_run_cell, while `record on` waits for CUDA: once a cell has
    initialised it, recording starts. Never raises into the user's cell."""
    try:
        torch = state.mod("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        n = _state["armed"]
        _disarm()
        mem, why = _torch_memory()
        if mem is None or n is None:
            return
        _set(mem, n)
        _state.update(on=True, max_entries=n)
    except Exception as e:
        print("gpumem: could not turn PyTorch's memory history on (%s)" % state.short_exc(e))


def snapshot_dir():
    """A directory only this user may write: gpumem-<uid> in the temporary
    directory (made 0700), else a fresh one. Its real path: the daemon
    refuses paths through symlinks."""
    d = os.path.join(tempfile.gettempdir(), "gpumem-%d" % os.getuid())
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        d = tempfile.mkdtemp(prefix="gpumem-")
    return os.path.realpath(d)


def _prune(d, prefix):
    try:
        names = sorted(n for n in os.listdir(d) if n.startswith(prefix) and n.endswith(".pickle"))
        for n in names[:-KEEP_FILES]:
            os.unlink(os.path.join(d, n))
    except OSError:
        pass


def snapshot_data(reason="manual", oom_event=None):
    """%gpumem snapshot: dumps PyTorch's memory snapshot and hands it to
    gpumem serve. The data dict (kind "snapshot")."""
    data = {"kind": "snapshot", "schema": state.SCHEMA, "reason": reason, "recording": _state["on"]}
    mem, why = _torch_memory()
    if mem is None:
        data["error"] = why
        return data
    torch = state.mod("torch")
    if not torch.cuda.is_initialized():
        data["error"] = "CUDA is not initialised in this kernel: there is no GPU memory to snapshot yet"
        return data
    kid = (state.config.get("kernel_id") or "pid%d" % os.getpid())[:8]
    d = snapshot_dir()
    prefix = "snapshot-%s-" % kid
    path = os.path.join(d, "%s%d.pickle" % (prefix, int(time.time() * 1000)))
    t0 = time.perf_counter()
    try:
        mem._dump_snapshot(path)
    except Exception as e:
        data["error"] = "torch.cuda.memory._dump_snapshot failed: %s" % state.short_exc(e)
        return data
    data["seconds"] = round(time.perf_counter() - t0, 2)
    data["path"] = path
    try:
        data["bytes"] = os.path.getsize(path)
    except OSError:
        pass
    _prune(d, prefix)
    if not _state["on"]:
        data["note"] = (
            "Memory history is off: the snapshot has the segments and blocks but no stacks or timeline; "
            "`%gpumem record on` first."
        )
    if state.sidecar_socket():
        body = {"path": path, "reason": reason}
        if oom_event:
            body["oom_event"] = int(oom_event)
        status, reply = daemon.sidecar_post("/api/v1/snapshots", body, 2.0)
        if status == 202:
            import json

            data["daemon"] = json.loads(reply.decode("utf-8"))
        else:
            data["daemon_error"] = daemon.request_error(status, reply)
    return data


def snapshot_after_oom(report):
    """After an out-of-memory report while recording: the snapshot, shown
    under the report."""
    seq = ((report or {}).get("event") or {}).get("seq")
    display.show(snapshot_data("oom", seq))

"""The kernel's worker processes as Python knows them: what each child pid
is (a DataLoader worker, a multiprocessing or concurrent.futures pool
worker, a spawned Process, a subprocess), and the frameworks' own
teardown of them, run before gpumem serve ends what is left
(%gpumem free --children). Imports nothing: it only looks at the modules
already loaded."""

import gc
import sys

from . import state

_DL_ITER = "torch.utils.data.dataloader._MultiProcessingDataLoaderIter"
_DL = "torch.utils.data.dataloader.DataLoader"
_POOL = "multiprocessing.pool.Pool"
_PPE = "concurrent.futures.process.ProcessPoolExecutor"
_POPEN = "subprocess.Popen"
_ENGINE_PACKAGES = ("vllm", "sglang", "tensorrt_llm", "lmdeploy")
_ENGINE_NAMES = frozenset(["LLM", "LLMEngine", "AsyncLLMEngine", "AsyncLLM", "Engine", "Runtime"])


def _qualname(tp):
    return "%s.%s" % (getattr(tp, "__module__", ""), getattr(tp, "__qualname__", ""))


def handle_kind(tp):
    """What a type is among the holders of child processes, or None."""
    try:
        for c in tp.__mro__:
            q = _qualname(c)
            if q == _DL_ITER:
                return "dataloader_iter"
            if q == _DL:
                return "dataloader"
            if q == _POOL:
                return "pool"
            if q == _PPE:
                return "process_pool"
            if q == _POPEN:
                return "popen"
        mod = getattr(tp, "__module__", "") or ""
        if mod.split(".")[0] in _ENGINE_PACKAGES and tp.__name__ in _ENGINE_NAMES:
            return "engine"
    except Exception:
        pass
    return None


def _pid(p):
    try:
        pop = getattr(p, "_popen", None)
        pid = getattr(pop, "pid", None) if pop is not None else getattr(p, "pid", None)
        return int(pid) if pid else None
    except Exception:
        return None


def describe(handles):
    """{pid: what} for the kernel's children that Python started. handles:
    {kind: [objects]} from one gc pass (see handle_kind)."""
    out = {}
    for it in handles.get("dataloader_iter", ()):
        persistent = bool(getattr(it, "_persistent_workers", False))
        for i, w in enumerate(getattr(it, "_workers", None) or ()):
            pid = _pid(w)
            if pid:
                out[pid] = "DataLoader worker %d%s" % (i, " (persistent_workers)" if persistent else "")
    for pool in handles.get("pool", ()):
        for w in getattr(pool, "_pool", None) or ():
            pid = _pid(w)
            if pid:
                out.setdefault(pid, "multiprocessing pool worker")
    for ex in handles.get("process_pool", ()):
        for pid in list((getattr(ex, "_processes", None) or {}).keys()):
            out.setdefault(int(pid), "concurrent.futures process pool worker")
    mp = sys.modules.get("multiprocessing.process")
    for p in list(getattr(mp, "_children", None) or ()):
        pid = _pid(p)
        if pid:
            method = type(getattr(p, "_popen", None)).__module__.rpartition(".popen_")[2].split("_")[0] or "?"
            out.setdefault(pid, "multiprocessing Process %r (%s)" % (getattr(p, "name", "?"), method))
    for po in handles.get("popen", ()):
        pid = getattr(po, "pid", None)
        if pid and getattr(po, "returncode", 0) is None:
            args = po.args if isinstance(po.args, str) else " ".join(str(a) for a in po.args or ())
            out.setdefault(int(pid), "subprocess: %s" % args[:80])
    return out


def scan_handles():
    """One gc pass: {kind: [objects]} of the holders of child processes."""
    cache = {}
    found = {}
    objs = gc.get_objects()
    try:
        for o in objs:
            tp = type(o)
            k = cache.get(tp, state.MISSING)
            if k is state.MISSING:
                k = cache[tp] = handle_kind(tp)
            if k is not None:
                found.setdefault(k, []).append(o)
    finally:
        del objs
    return found


def teardown():
    """Runs the frameworks' own teardown of the kernel's workers: shuts down
    DataLoader iterators' workers (and forgets a persistent one, so that
    the next epoch starts new workers), terminates multiprocessing pools,
    shuts process pool executors down, ray.shutdown(), and an inference
    engine's shutdown(). Returns [{what, pids}] of what ran and errors."""
    ran, errors = [], []
    handles = scan_handles()
    try:
        pids = describe(handles)
        for it in handles.get("dataloader_iter", ()):
            if getattr(it, "_shutdown", True):
                continue
            ws = [_pid(w) for w in getattr(it, "_workers", None) or ()]
            try:
                it._shutdown_workers()
                ran.append({"what": "DataLoader iterator: _shutdown_workers()", "pids": [p for p in ws if p]})
            except Exception as e:
                errors.append("DataLoader: %s" % state.short_exc(e))
            for dl in handles.get("dataloader", ()):
                if getattr(dl, "_iterator", None) is it:
                    dl._iterator = None
        for pool in handles.get("pool", ()):
            if getattr(pool, "_state", None) != "RUN":
                continue
            ws = [_pid(w) for w in getattr(pool, "_pool", None) or ()]
            try:
                pool.terminate()
                ran.append({"what": "multiprocessing pool: terminate()", "pids": [p for p in ws if p]})
            except Exception as e:
                errors.append("pool: %s" % state.short_exc(e))
        for ex in handles.get("process_pool", ()):
            procs = dict(getattr(ex, "_processes", None) or {})
            if not procs:
                continue
            try:
                if hasattr(ex, "terminate_workers"):
                    ex.terminate_workers()
                else:
                    ex.shutdown(wait=False, cancel_futures=True)
                ran.append({"what": "process pool executor: shutdown", "pids": [int(p) for p in procs]})
            except Exception as e:
                errors.append("process pool: %s" % state.short_exc(e))
        ray = state.mod("ray")
        if ray is not None:
            try:
                if ray.is_initialized():
                    ray.shutdown()
                    ran.append({"what": "ray.shutdown()", "pids": []})
            except Exception as e:
                errors.append("ray: %s" % state.short_exc(e))
        for eng in handles.get("engine", ()):
            stop = getattr(eng, "shutdown", None)
            if callable(stop):
                try:
                    stop()
                    ran.append({"what": "%s.shutdown()" % type(eng).__name__, "pids": []})
                except Exception as e:
                    errors.append("%s: %s" % (type(eng).__name__, state.short_exc(e)))
    finally:
        handles.clear()
    return {"ran": ran, "errors": errors, "known": {str(k): v for k, v in pids.items()}}

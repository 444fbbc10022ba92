"""The report printed under a GPU out-of-memory error's traceback: what the
cell asked for, what this kernel holds (its framework's figures, what only
IPython keeps, this error's traceback included, and the variables), and,
from gpumem serve, who else holds that GPU and the one line of advice
that fits. The daemon computes the holders and the advice (its
sidecar/oom package); this module only gathers the kernel's own figures
and renders what comes back.

It runs as a post_run_cell hook: IPython has shown the traceback by then,
so the report comes right under it and can never change it. When the cell
did not fail the hook reads one attribute and returns. It recognises the
errors without importing any framework, by their classes' names and
modules and their messages, and keeps no reference to the error or its
frames once it returns."""

import linecache
import os
import re
import time

from . import daemon, display, holders, hygiene, probes, recording, reports, state

LABELS = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX", "tensorflow": "TensorFlow"}

# How long the kernel waits for gpumem serve: the report must come at once.
DAEMON_TIMEOUT = 0.8

_MAX_CHAIN = 8
_MAX_VARIABLES = 32


def oom_hook(result=None):
    """post_run_cell: the out-of-memory report, when the cell raised one."""
    if getattr(result, "error_in_exec", None) is None:
        return
    _report_error(result)


def _report_error(result):
    with hygiene.kept_last():
        try:
            found = classify(result.error_in_exec)
            if found is None:
                return
            data = report_data(state.shell, result, *found)
            del found
            display.show(data)
            if recording.is_recording():
                recording.snapshot_after_oom(data)
        except Exception as e:
            # One line; the user's traceback above is untouched.
            print("gpumem: could not build the out-of-memory report (%s)" % state.short_exc(e))


def _top_module(cls):
    return (getattr(cls, "__module__", None) or "").split(".", 1)[0]


def _classify_one(e):
    """(framework, qualified class name) of one exception, or None."""
    msg = None
    for cls in type(e).__mro__:
        name, top = cls.__name__, _top_module(cls)
        qual = "%s.%s" % (cls.__module__, name)
        if name == "OutOfMemoryError" and top == "torch":
            return "torch", qual
        if name == "OutOfMemoryError" and top in ("cupy", "cupy_backends"):
            return "cupy", qual
        if name == "ResourceExhaustedError" and top == "tensorflow":
            return "tensorflow", qual
        if top in ("jax", "jaxlib"):
            if msg is None:
                msg = _text(e)
            if "RESOURCE_EXHAUSTED" in msg[:200]:
                return "jax", qual
    # PyTorch before 1.13 raised a RuntimeError with this message.
    if isinstance(e, RuntimeError) and _text(e).startswith("CUDA out of memory."):
        return "torch", "%s.%s" % (type(e).__module__, type(e).__name__)
    return None


def classify(exc):
    """(the out-of-memory error, its framework, its class's qualified name)
    when exc is one or was raised from one (its cause or context), else
    None."""
    e, seen = exc, 0
    while e is not None and seen < _MAX_CHAIN:
        found = _classify_one(e)
        if found is not None:
            return (e,) + found
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def _text(e):
    try:
        return str(e)
    except Exception:
        return ""


_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_TF_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "complex64": 8, "complex128": 16,
}  # fmt: skip


def _size(num, unit):
    return int(round(float(num.replace(",", "")) * _UNITS[unit.lower()]))


def parse_request(framework, message):
    """{"bytes": what the failed allocation asked for, or None; "device": the
    device ordinal the message names, or None}, from the error's message as
    each framework writes it."""
    out = {"bytes": None, "device": None}
    m = None
    if framework == "torch":
        m = re.search(r"Tried to allocate ([\d.,]+) ?(bytes|B|KiB|MiB|GiB|TiB)\b", message)
        if m:
            out["bytes"] = _size(m.group(1), m.group(2))
        d = re.search(r"\bGPU (\d+)\b", message)
    elif framework == "cupy":
        m = re.search(r"allocating ([\d,]+) bytes", message)
        if m:
            out["bytes"] = int(m.group(1).replace(",", ""))
        d = None
    elif framework == "jax":
        m = re.search(r"allocate (\d+) bytes", message) or re.search(r"\((\d+)B\)", message)
        if m:
            out["bytes"] = int(m.group(1))
        d = re.search(r"device ordinal (\d+)", message) or re.search(r"\bcuda:(\d+)\b", message)
    elif framework == "tensorflow":
        m = re.search(r"rounded to (\d+)", message)
        if m:
            out["bytes"] = int(m.group(1))
        else:
            s = re.search(r"tensor with shape\[([\d,\s]*)\] and type (\w+)", message)
            if s and s.group(2) in _TF_DTYPE_BYTES:
                n = _TF_DTYPE_BYTES[s.group(2)]
                for dim in s.group(1).split(","):
                    if dim.strip():
                        n *= int(dim)
                out["bytes"] = n
        d = re.search(r"device:GPU:(\d+)", message)
    else:
        d = None
    if d:
        out["device"] = int(d.group(1))
    return out


def cell_line(shell, exc, count):
    """{"execution_count", "line", "source"} of the innermost frame of exc's
    traceback in the cell numbered count (else in any cell), or {}."""
    fmap = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    best = other = None
    tb = exc.__traceback__
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        n = fmap.get(fn)
        if n is None and fn.startswith("<ipython-input-"):
            try:
                n = int(fn.split("-")[2])
            except (IndexError, ValueError):
                n = None
        if n is not None:
            if count is None or n == count:
                best = (n, tb.tb_lineno, fn)
            else:
                other = (n, tb.tb_lineno, fn)
        tb = tb.tb_next
    del tb
    hit = best or other
    if hit is None:
        return {}
    n, line, fn = hit
    return {"execution_count": n, "line": line, "source": linecache.getline(fn, line).strip()[:200]}


def _device(framework, parsed):
    """The ordinal of the GPU the error hit: the message's, else the
    framework's current device (only asked when that cannot create a CUDA
    context: the error means one exists)."""
    if parsed.get("device") is not None:
        return parsed["device"]
    try:
        if framework == "torch":
            torch = state.mod("torch")
            if torch is not None and torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        elif framework == "cupy":
            cp = state.mod("cupy")
            if cp is not None:
                return int(cp.cuda.runtime.getDevice())
    except Exception:
        pass
    return None


def _uuid(framework, ordinal):
    if framework != "torch" or ordinal is None:
        return None
    try:
        torch = state.mod("torch")
        if torch is not None and torch.cuda.is_initialized():
            u = getattr(torch.cuda.get_device_properties(ordinal), "uuid", None)
            return str(u) if u is not None else None
    except Exception:
        pass
    return None


def kernel_figures(shell, framework, ordinal):
    """What this kernel holds on that GPU: the framework's allocated and
    reserved bytes and the split of its cache, what only IPython holds, and
    the variables holding GPU memory."""
    k = {"allocated_bytes": 0, "reserved_bytes": 0, "releasable_bytes": 0, "fragmented_bytes": 0}
    dev = "cuda:%d" % ordinal if ordinal is not None else None
    for fw in probes.frameworks():
        if fw.get("name") != framework:
            continue
        for d in fw.get("devices", []):
            if dev is None or d.get("device") == dev:
                k["allocated_bytes"] = int(d.get("used") or 0)
                k["reserved_bytes"] = int(d.get("held") or d.get("used") or 0)
                if d.get("total"):
                    k["device_total_bytes"] = int(d["total"])
                break
    cached = max(0, k["reserved_bytes"] - k["allocated_bytes"])
    # Only the kernel's own report shows it, when gpumem serve does not
    # answer: the daemon's event carries the one every face shows.
    k["cached_bytes"] = k["releasable_bytes"] = cached
    torch = state.mod("torch")
    if framework == "torch" and torch is not None:
        try:
            if torch.cuda.is_initialized():
                st = torch.cuda.memory_stats(ordinal)
                frag = int(st.get("inactive_split_bytes.all.current", 0))
                k["fragmented_bytes"] = min(frag, cached)
                k["releasable_bytes"] = cached - k["fragmented_bytes"]
                free, total = torch.cuda.mem_get_info(ordinal)
                k["device_free_bytes"], k["device_total_bytes"] = int(free), int(total)
        except Exception:
            pass
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
        k["expandable_segments"] = "expandable_segments:true" in conf.replace(" ", "").lower()
    hid = reports.hidden_only(shell)
    k["ipython_bytes"], k["ipython_refs"], k["traceback_bytes"] = hid["bytes"], hid["refs"][:16], hid["traceback_bytes"]
    variables, truncated = top_holders(shell)
    k["variables"], k["variables_truncated"] = variables, truncated
    return k


def top_holders(shell):
    """The user variables holding GPU memory, largest first, as (rows,
    truncated): today `%gpumem vars`'s rows; a `%gpumem why` that finds
    memory held elsewhere adds its rows here."""
    rows, _total = holders.scan_vars(False)
    user = [{"name": r["name"], "bytes": int(r.get("bytes") or 0)} for r in rows if not r.get("hidden")]
    return user[:_MAX_VARIABLES], len(user) > _MAX_VARIABLES


def report_data(shell, result, exc, framework, qualname):
    """The data dict of the report (kind "oom"), asking gpumem serve for the
    GPU's holders and the advice when it runs."""
    t0 = time.perf_counter()
    message = _text(exc)
    parsed = parse_request(framework, message)
    ordinal = _device(framework, parsed)
    count = getattr(result, "execution_count", None)
    cell = cell_line(shell, exc, count)
    del exc
    first = message.strip().split("\n", 1)[0][:500]
    req = {
        "framework": framework,
        "error": qualname,
        "message": first,
        "requested_bytes": parsed["bytes"] or 0,
        "device": {
            "ordinal": ordinal,
            "uuid": _uuid(framework, ordinal),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        },
        "cell": cell,
        "kernel": kernel_figures(shell, framework, ordinal),
    }
    req["device"] = {k: v for k, v in req["device"].items() if v is not None}
    data = {"kind": "oom", "schema": state.SCHEMA, "label": LABELS.get(framework, framework), "request": req}
    if state.sidecar_socket():
        status, body = daemon.sidecar_post("/api/v1/oom", _wire(req), DAEMON_TIMEOUT)
        if status == 200:
            import json

            data["event"] = json.loads(body.decode("utf-8"))
        else:
            data["daemon_error"] = daemon.request_error(status, body)
    else:
        data["no_daemon"] = True
    data["elapsed_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return data


def _wire(req):
    """The request as the daemon reads it: its figures without the ones only
    the kernel's own report shows (the daemon computes the cache's itself)."""
    out = dict(req)
    only_here = ("device_free_bytes", "device_total_bytes", "cached_bytes")
    out["kernel"] = {k: v for k, v in req["kernel"].items() if k not in only_here}
    return out

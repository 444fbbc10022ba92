"""PyTorch's CUDA caching allocator from inside: per device what it has
allocated and reserved, how its cache (reserved minus allocated) splits
into releasable and fragmented, its largest free block, the last
out-of-memory error's request, and the fragmentation advice
(expandable_segments). Never initialises CUDA: nothing is read unless
torch.cuda.is_initialized()."""

import json
import os
import re
import sys

from . import state, units

_FRAG_MIN = 256 * state.MIB
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"([0-9.]+) (B|KiB|MiB|GiB|TiB)"


def _size(m):
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def round_block(n):
    """A CUDA allocation's size as the caching allocator counts it: rounded
    up to 512 bytes."""
    return 0 if n <= 0 else (n + 511) // 512 * 512


def torch_devices():
    """Per CUDA device torch has memory on: {device, index, uuid,
    allocated, reserved, releasable, fragmented, largest_free_block,
    expandable}."""
    torch = state.mod("torch")
    if torch is None:
        return []
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return []
        current = cuda.current_device()
        count = cuda.device_count()
    except Exception:
        return []
    segments = []
    try:
        segments = cuda.memory_snapshot()
    except Exception:
        pass
    out = []
    for i in range(count):
        try:
            st = cuda.memory_stats(i)
        except Exception:
            continue
        reserved = int(st.get("reserved_bytes.all.current", 0))
        if reserved == 0 and i != current:
            continue
        allocated = int(st.get("allocated_bytes.all.current", 0))
        cache = max(0, reserved - allocated)
        fragmented = min(cache, int(st.get("inactive_split_bytes.all.current", 0)))
        largest, expandable = 0, False
        for seg in segments:
            if seg.get("device") != i:
                continue
            expandable = expandable or bool(seg.get("is_expandable"))
            for b in seg.get("blocks") or ():
                if b.get("state") == "inactive":
                    largest = max(largest, int(b.get("size") or 0))
        d = {
            "device": "cuda:%d" % i,
            "framework": "torch",
            "index": i,
            "allocated": allocated,
            "reserved": reserved,
            "releasable": cache - fragmented,
            "fragmented": fragmented,
            "largest_free_block": largest,
            "expandable": expandable,
        }
        try:
            p = cuda.get_device_properties(i)
            uuid = getattr(p, "uuid", None)
            if uuid is not None:
                d["uuid"] = str(uuid)
            d["total"] = int(p.total_memory)
        except Exception:
            pass
        if reserved:
            # The process has a context on this device (it holds memory
            # there): asking for its free memory creates nothing.
            try:
                free, _total = cuda.mem_get_info(i)
                d["gpu_free"] = int(free)
            except Exception:
                pass
        out.append(d)
    return out


def _oom_exception(shell):
    for e in (sys.__dict__.get("last_value"), sys.__dict__.get("last_exc")):
        if isinstance(e, BaseException) and "out of memory" in str(e).lower():
            return e
    ler = getattr(shell, "last_execution_result", None)
    e = getattr(ler, "error_in_exec", None)
    if isinstance(e, BaseException) and "out of memory" in str(e).lower():
        return e
    return None


def last_oom(shell):
    """The last CUDA out-of-memory error IPython keeps (sys.last_value):
    {device, request, gpu_free, reserved_unallocated}, or None."""
    e = _oom_exception(shell)
    if e is None:
        return None
    msg = str(e)
    m = re.search(r"Tried to allocate " + _SIZE, msg)
    if m is None:
        return None
    out = {"request": _size(m), "message": msg.splitlines()[0][:300]}
    m = re.search(r"GPU (\d+) has a total capacity of " + _SIZE + r" of which " + _SIZE + " is free", msg)
    if m:
        out["device"] = "cuda:%s" % m.group(1)
        out["gpu_free"] = int(float(m.group(4)) * _UNITS[m.group(5)])
    m = re.search(_SIZE + r" is reserved by PyTorch but unallocated", msg)
    if m:
        out["reserved_unallocated"] = _size(m)
    return out


def fragmentation(devices, oom):
    """The fragmentation finding, or None: the cache is mostly not
    releasable, or the last OOM asked for more than the largest free block
    while the free memory in all was enough."""
    for d in devices:
        if d.get("expandable"):
            continue
        largest = max(d.get("largest_free_block", 0), d.get("gpu_free", 0))
        free = d.get("releasable", 0) + d.get("fragmented", 0) + d.get("gpu_free", 0)
        if oom and oom.get("device", d["device"]) == d["device"]:
            req = oom["request"]
            if oom.get("gpu_free") is not None:
                free = d.get("releasable", 0) + d.get("fragmented", 0) + oom["gpu_free"]
                largest = max(d.get("largest_free_block", 0), oom["gpu_free"])
            if req > largest and req <= free:
                return {
                    "device": d["device"],
                    "case": "oom",
                    "request": req,
                    "largest_free_block": largest,
                    "free": free,
                    "text": "the last out-of-memory error asked for %s on %s; %s was free in all, but the largest "
                    "free block was %s: the cache is fragmented"
                    % (units.fmt_bytes(req), d["device"], units.fmt_bytes(free), units.fmt_bytes(largest)),
                }
        if d.get("fragmented", 0) >= _FRAG_MIN and d["fragmented"] > d.get("releasable", 0):
            return {
                "device": d["device"],
                "case": "cache",
                "fragmented": d["fragmented"],
                "largest_free_block": d.get("largest_free_block", 0),
                "text": "%s of PyTorch's cache on %s is fragmented (free blocks inside segments still in use; "
                "empty_cache cannot return them); its largest free block is %s"
                % (units.fmt_bytes(d["fragmented"]), d["device"], units.fmt_bytes(d.get("largest_free_block", 0))),
            }
    return None


def kernel_name():
    """The kernelspec this kernel was started from, from its connection
    file ("" when unknown)."""
    app = sys.modules.get("ipykernel.kernelapp")
    try:
        inst = app.IPKernelApp.instance() if app and app.IPKernelApp.initialized() else None
        path = getattr(inst, "abs_connection_file", None) or getattr(inst, "connection_file", None)
        if path:
            with open(path, "rb") as f:
                return str(json.loads(f.read().decode("utf-8")).get("kernel_name") or "")
    except Exception:
        pass
    return ""


def expandable_advice():
    """How to start this kernel with expandable segments next time."""
    spec = kernel_name() or "python3"
    set_now = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    lines = [
        "PyTorch's expandable segments avoid this: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "for this kernel's next start, either",
        '  - in its kernelspec: `jupyter kernelspec list` shows the directory of %r; add "env": '
        '{"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} to its kernel.json, then restart the kernel; or' % spec,
        "  - after a restart, as the first cell, before `import torch`: %env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    ]
    if set_now:
        lines.append("  (PYTORCH_CUDA_ALLOC_CONF is %r in this kernel now)" % set_now)
    return lines

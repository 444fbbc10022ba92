"""The allocators' rows of %gpumem why, per device: what a framework has
allocated that no Python object was found to hold, its cache (PyTorch's
split into releasable and fragmented), TensorFlow's untraceable memory;
and the table of what each framework holds, for gpumem serve's join
with the driver's figure."""

from . import units


def rows(tdevs, fws, traced, want, data):
    """Per device: allocated with no Python holder, and the caches."""
    rows = []
    by_dev = {}
    for k, (n, dev) in traced.items():
        by_dev[(k[0], dev)] = by_dev.get((k[0], dev), 0) + n
    for d in tdevs:
        dev = d["device"]
        seen = by_dev.get(("torch", dev), 0)
        d["traced"] = seen
        if d["allocated"] > seen:
            rows.append(
                {
                    "category": "c_level",
                    "name": "allocated by PyTorch, no Python tensor holds it",
                    "note": "cuBLAS workspaces, autograd graphs' saved tensors, CUDA graph pools, C++ caches",
                    "device": dev,
                    "bytes": d["allocated"] - seen,
                    "fix": "%gpumem free (clears cuBLAS workspaces); del the outputs whose graph keeps tensors; "
                    "else restart the kernel",
                }
            )
        elif seen > d["allocated"]:
            rows.append(
                {
                    "category": "unexplained",
                    "name": "counted above PyTorch's allocated figure",
                    "note": "memory shared with another framework, or allocated outside the caching allocator?",
                    "device": dev,
                    "bytes": d["allocated"] - seen,
                    "fix": "-",
                }
            )
        if d["releasable"]:
            rows.append(
                {
                    "category": "cache",
                    "name": "PyTorch's cache, releasable",
                    "device": dev,
                    "bytes": d["releasable"],
                    "fix": "%gpumem free (torch.cuda.empty_cache())",
                }
            )
        if d["fragmented"]:
            rows.append(
                {
                    "category": "cache",
                    "name": "PyTorch's cache, fragmented",
                    "note": "free blocks inside segments still in use; the largest is %s"
                    % units.fmt_bytes(d["largest_free_block"]),
                    "device": dev,
                    "bytes": d["fragmented"],
                    "fix": "free the tensors that share its segments; expandable_segments (see advice)",
                }
            )
    rows += _other_rows(fws, by_dev, want)
    return rows


def _other_rows(fws, by_dev, want):
    """The rows of CuPy, JAX and TensorFlow, per device."""
    rows = []
    for fw in fws:
        if fw["name"] == "torch":
            continue
        for d in fw.get("devices", ()):
            dev = d["device"]
            if not want(dev):
                continue
            used, held = int(d.get("used") or 0), d.get("held")
            if fw["name"] == "tensorflow":
                rows.append(
                    {
                        "category": "untraceable",
                        "name": "TensorFlow, in use",
                        "note": "TensorFlow's memory cannot be traced to Python holders",
                        "device": dev,
                        "bytes": used,
                        "fix": "restart the kernel (TensorFlow returns GPU memory only when the process exits)",
                    }
                )
                continue
            key = fw["name"]
            seen = by_dev.get((key, dev), 0)
            if used > seen:
                rows.append(
                    {
                        "category": "c_level",
                        "name": "%s: in use with no Python array found" % fw["label"],
                        "device": dev,
                        "bytes": used - seen,
                        "fix": "restart the kernel" if key == "jax" else "%gpumem free",
                    }
                )
            if held is not None and held > used:
                rows.append(
                    {
                        "category": "cache",
                        "name": "%s's pool, free" % fw["label"],
                        "device": dev,
                        "bytes": held - used,
                        "fix": "%gpumem free (free_all_blocks())"
                        if key == "cupy"
                        else "restart with XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX keeps its pool)",
                    }
                )
    return rows


def device_table(fws, tdevs, want):
    """What each framework holds from the driver per device, for the join
    with the driver's figure (done in Go)."""
    out = []
    for d in tdevs:
        out.append({k: d[k] for k in d if k in ("device", "framework", "index", "uuid", "total")})
        out[-1].update(held=d["reserved"], used=d["allocated"])
    for fw in fws:
        if fw["name"] == "torch":
            continue
        for d in fw.get("devices", ()):
            if not want(d["device"]):
                continue
            used = int(d.get("used") or 0)
            held = d.get("held")
            out.append(
                {
                    "device": d["device"],
                    "framework": fw["name"],
                    "index": int(d["device"].split(":")[-1]) if d["device"].startswith("cuda:") else None,
                    "held": used if held is None else int(held),
                    "used": used,
                }
            )
    return out

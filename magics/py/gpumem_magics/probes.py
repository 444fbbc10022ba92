"""What each GPU framework already imported in the kernel holds, per
device. Never imports a framework and never initialises CUDA: every call
that would is guarded."""

from . import state


def _torch_probe():
    torch = state.mod("torch")
    if torch is None:
        return None
    fw = {"name": "torch", "label": "PyTorch", "version": str(getattr(torch, "__version__", "?")), "devices": []}
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            fw["state"] = "idle"
            fw["message"] = "CUDA not initialised in this kernel: holds no GPU memory"
            return fw
        fw["state"] = "active"
        current = cuda.current_device()
        for i in range(cuda.device_count()):
            reserved = int(cuda.memory_reserved(i))
            if reserved == 0 and i != current:
                continue
            d = {
                "device": "cuda:%d" % i,
                "used": int(cuda.memory_allocated(i)),
                "held": reserved,
                "peak": int(cuda.max_memory_allocated(i)),
            }
            try:
                p = cuda.get_device_properties(i)
                d["total"] = int(p.total_memory)
                d["name"] = str(p.name)
            except Exception:
                pass
            fw["devices"].append(d)
    except Exception as e:
        fw["state"] = "error"
        fw["message"] = "could not read: %s" % state.short_exc(e)
    return fw


def _cupy_probe():
    cp = state.mod("cupy")
    if cp is None:
        return None
    fw = {"name": "cupy", "label": "CuPy", "version": str(getattr(cp, "__version__", "?")), "devices": []}
    try:
        pool = cp.get_default_memory_pool()
        used, held = int(pool.used_bytes()), int(pool.total_bytes())
        if held == 0:
            fw["state"] = "idle"
            fw["message"] = "memory pool empty"
            return fw
        fw["state"] = "active"
        dev = int(cp.cuda.runtime.getDevice())
        d = {"device": "cuda:%d" % dev, "used": used, "held": held, "peak": None}
        try:
            d["total"] = int(cp.cuda.Device(dev).mem_info[1])
        except Exception:
            pass
        fw["devices"].append(d)
        try:
            pinned = cp.get_default_pinned_memory_pool()
            nfree = int(pinned.n_free_blocks())
            if nfree:
                fw["message"] = "pinned host pool holds %d free blocks" % nfree
        except Exception:
            pass
    except Exception as e:
        fw["state"] = "error"
        fw["message"] = "could not read: %s" % state.short_exc(e)
    return fw


def jax_initialised():
    xb = state.mod("jax._src.xla_bridge")
    if xb is None:
        return False
    backends = getattr(xb, "_backends", None)
    return bool(backends)


def _jax_probe():
    jax = state.mod("jax")
    if jax is None:
        return None
    fw = {"name": "jax", "label": "JAX", "version": str(getattr(jax, "__version__", "?")), "devices": []}
    try:
        if not jax_initialised():
            fw["state"] = "idle"
            fw["message"] = "no JAX backend initialised yet: holds no GPU memory"
            return fw
        fw["state"] = "active"
        for dev in jax.local_devices():
            if dev.platform == "cpu":
                continue
            st = dev.memory_stats() or {}
            held = st.get("pool_bytes", st.get("bytes_reserved"))
            d = {
                "device": "%s:%d" % ("cuda" if dev.platform == "gpu" else dev.platform, dev.id),
                "used": int(st.get("bytes_in_use", 0)),
                "held": None if held is None else int(held),
                "peak": st.get("peak_bytes_in_use"),
                "total": st.get("bytes_limit"),
            }
            if not st:
                fw["message"] = "memory_stats() is unavailable (XLA_PYTHON_CLIENT_ALLOCATOR=platform?)"
            fw["devices"].append(d)
    except Exception as e:
        fw["state"] = "error"
        fw["message"] = "could not read: %s" % state.short_exc(e)
    return fw


def tf_initialised():
    ctxmod = state.mod("tensorflow.python.eager.context")
    if ctxmod is None:
        return False
    try:
        ctx = ctxmod.context()
        return getattr(ctx, "_context_handle", None) is not None
    except Exception:
        return False


def _tf_probe():
    tf = state.mod("tensorflow")
    if tf is None:
        return None
    fw = {"name": "tensorflow", "label": "TensorFlow", "version": str(getattr(tf, "__version__", "?")), "devices": []}
    try:
        if not tf_initialised():
            fw["state"] = "idle"
            fw["message"] = "TensorFlow runtime not initialised yet: holds no GPU memory"
            return fw
        fw["state"] = "active"
        for ld in tf.config.list_logical_devices("GPU"):
            info = tf.config.experimental.get_memory_info(ld.name)
            idx = ld.name.rsplit(":", 1)[-1]
            fw["devices"].append(
                {"device": "cuda:%s" % idx, "used": int(info.get("current", 0)), "held": None, "peak": int(info.get("peak", 0))}
            )
        fw["message"] = "keeps its GPU memory until the process exits: only a kernel restart returns it"
    except Exception as e:
        fw["state"] = "error"
        fw["message"] = "could not read: %s" % state.short_exc(e)
    return fw


_PROBES = (_torch_probe, _cupy_probe, _jax_probe, _tf_probe)


def frameworks():
    out = []
    for p in _PROBES:
        fw = p()
        if fw is not None:
            out.append(fw)
    return out


def flat(fws):
    """{(framework, device): {used, held, label}} from frameworks()."""
    out = {}
    for fw in fws:
        for d in fw.get("devices", []):
            out[(fw["name"], d["device"])] = dict(d, label=fw["label"], name=fw["name"])
    return out


def before_after(before, after):
    b, a = flat(before), flat(after)
    out = []
    for key in sorted(
        set(b) | set(a), key=lambda k: ([x["name"] for x in before] + [x["name"] for x in after] + [k[0]]).index(k[0])
    ):
        x, y = b.get(key, {}), a.get(key, {})
        lab = x.get("label") or y.get("label")
        out.append(
            {
                "name": key[0],
                "label": lab,
                "device": key[1],
                "before": {"used": x.get("used", 0), "held": x.get("held") if x else 0},
                "after": {"used": y.get("used", 0), "held": y.get("held") if y else 0},
            }
        )
    return out

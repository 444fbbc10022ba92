"""%gpumem free and `gpumem free`: deletes variables and IPython's hidden
references to them, collects garbage and empties the frameworks' caches,
and says what each step returned."""

import gc
import os
import time
import weakref

from . import daemon, holders, probes, state, units

# Names %gpumem free refuses to delete: IPython's own.
_PROTECTED = frozenset(
    ["In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "__builtins__", "__builtin__", "__name__"]
)


def _empty_caches(all_, notes):
    gc.collect()
    torch = state.mod("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                # cuBLAS workspaces (tens of MiB per stream, counted as
                # allocated) come back on the next matmul; empty_cache
                # alone leaves them.
                clear_ws = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
                if clear_ws is not None:
                    clear_ws()
                torch.cuda.empty_cache()
                torch.cuda.ipc_collect()
        except Exception as e:
            notes.append("PyTorch: empty_cache failed: %s" % state.short_exc(e))
    cp = state.mod("cupy")
    if cp is not None:
        try:
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()
        except Exception as e:
            notes.append("CuPy: free_all_blocks failed: %s" % state.short_exc(e))
    jax = state.mod("jax")
    if jax is not None and probes.jax_initialised():
        try:
            jax.clear_caches()
        except Exception as e:
            notes.append("JAX: clear_caches failed: %s" % state.short_exc(e))
        if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "") != "platform":
            notes.append(
                "JAX's allocator keeps freed memory in its pool for reuse; only XLA_PYTHON_CLIENT_ALLOCATOR=platform "
                "(set before importing jax) returns it to the GPU."
            )
    if state.mod("tensorflow") is not None:
        if all_:
            keras = state.mod("keras") or state.mod("tf_keras")
            try:
                if keras is not None:
                    keras.backend.clear_session()
                    notes.append("TensorFlow: ran keras.backend.clear_session().")
            except Exception as e:
                notes.append("TensorFlow: clear_session failed: %s" % state.short_exc(e))
        notes.append("TensorFlow keeps its GPU memory until the process exits: only a kernel restart returns it.")


def parse_free_args(args):
    names, keep = [], []
    opts = {"all": False, "dry_run": False, "all_devices": False}
    mode = names
    for a in args:
        if a == "--all":
            opts["all"] = True
            mode = names
        elif a in ("--dry-run", "-n"):
            opts["dry_run"] = True
        elif a == "--all-devices":
            opts["all_devices"] = True
        elif a == "--keep":
            mode = keep
        elif a.startswith("--keep="):
            keep += [x for x in a[len("--keep=") :].split(",") if x]
        elif a.startswith("-"):
            raise ValueError("unknown option %s (see %%gpumem help)" % a)
        else:
            mode += [x for x in a.split(",") if x]
    return names, keep, opts


def free_data(names=(), all_=False, keep=(), dry_run=False, all_devices=False, ask_daemon=True):
    """Frees the named variables (or, with all_, every variable holding GPU
    memory but keep), IPython's hidden references to them, then the caches.
    With no names and not all_: caches only. With ask_daemon, the driver's
    figure before and after comes from gpumem serve when it is configured.
    Never raises."""
    t0 = time.perf_counter()
    shell = state.shell
    names, keep = list(dict.fromkeys(names)), list(keep)
    data = {"kind": "free", "schema": state.SCHEMA, "dry_run": bool(dry_run), "all": bool(all_)}
    ns = shell.user_ns
    bad = [n for n in names if n in _PROTECTED]
    unknown = [n for n in names if n not in ns]
    unknown_keep = [n for n in keep if n not in ns]
    if bad or unknown or unknown_keep or (keep and not all_):
        if bad:
            msg = "refusing to delete IPython's own %s" % ", ".join(bad)
        elif unknown:
            msg = "no variable named %s in this kernel" % ", ".join(unknown)
        elif unknown_keep:
            msg = "--keep names no variable: %s" % ", ".join(unknown_keep)
        else:
            msg = "--keep only makes sense with --all"
        data["error"] = msg + "; nothing was deleted"
        return data
    data["cache_only"] = not names and not all_
    notes = []
    before = probes.frameworks()
    drv_before = daemon.driver_usage(fresh=True) if ask_daemon and not dry_run else None

    plan = _plan_free(shell, names, all_, keep, all_devices)
    data["deleted"] = plan["deleted"]
    data["hidden"] = plan["hidden_report"]
    if not dry_run:
        alive = _execute_plan(shell, plan, notes)
        del plan
        tc = time.perf_counter()
        _empty_caches(all_, notes)  # gc.collect() first, then the caches
        data["caches_ms"] = round((time.perf_counter() - tc) * 1000, 3)
        for d in data["deleted"]:
            refs = alive.get(d["name"], ())
            still = [r for r in refs if r() is not None]
            if still:
                d["alive"] = True
                held = holders.holders_of([r() for r in still], shell)
                if held:
                    d["held_by"] = held
        del alive
        after = probes.frameworks()
        data["frameworks"] = probes.before_after(before, after)
        if drv_before is not None:
            drv_after = daemon.driver_usage(fresh=True)
            if not drv_before.get("error") and drv_after and not drv_after.get("error"):
                data["driver"] = {"before": drv_before["bytes"], "after": drv_after["bytes"]}
    else:
        data["frameworks"] = probes.before_after(before, before)
        cached = sum(
            max(0, (d.get("held") or 0) - (d.get("used") or 0))
            for fw in before
            if fw["name"] in ("torch", "cupy")
            for d in fw.get("devices", [])
        )
        if cached:
            notes.append("would also return %s of cached memory to the GPU" % units.fmt_bytes(cached))
        del plan
    if any(d.get("alive") for d in data.get("deleted", [])):
        notes.append("Some memory is still referenced from elsewhere: `%gpumem vars` shows who holds it.")
    data["notes"] = notes
    total = (time.perf_counter() - t0) * 1000
    data["elapsed_ms"] = int(total)
    # What this free costs beyond gc.collect() and emptying the caches.
    data["overhead_ms"] = round(total - data.get("caches_ms", 0.0), 3)
    return data


def _plan_free(shell, names, all_, keep, all_devices):
    ns = shell.user_ns
    targets = {n: ns[n] for n in names}
    if all_:
        for n, v in holders.user_vars(shell):
            if n in keep or n in targets:
                continue
            sts = holders.holdings(v)[0]
            if any(all_devices or holders.is_gpu(dev) for _k, _n, dev in sts):
                targets[n] = v
    keys = set()
    deleted = []
    for n, v in targets.items():
        sts, tname, _ = holders.holdings(v)
        seen = {}
        for key, b, dev in sts:
            seen.setdefault(key, (b, dev))
            keys.add(key)
        devs = sorted(set(d for _, d in seen.values()))
        deleted.append(
            {
                "name": n,
                "type": tname or type(v).__name__,
                "device": "+".join(devs) or "-",
                "bytes": sum(b for b, _ in seen.values()),
            }
        )
    deleted.sort(key=lambda d: (-d["bytes"], d["name"]))
    ids = set(id(v) for v in targets.values())
    # Kept variables' storages: a hidden reference to memory a kept variable
    # also holds is left alone (dropping it would free nothing).
    hidden = []
    report = []
    for ref, obj, what in holders.hidden_holders(shell):
        sts = holders.holdings(obj)[0]
        hit = id(obj) in ids or any(k in keys for k, _b, _d in sts)
        gpu = [(k, b) for k, b, dev in sts if all_devices or holders.is_gpu(dev)]
        if hit or (all_ and gpu):
            hidden.append((ref, obj, what))
            report.append(
                {"ref": ref, "what": what, "action": "drop", "bytes": sum(b for _k, b in dict(gpu).items()) if gpu else 0}
            )
        elif gpu and not names and not all_:
            report.append({"ref": ref, "what": what, "action": "kept", "bytes": sum(b for _k, b in dict(gpu).items())})
    return {"targets": targets, "deleted": deleted, "hidden": hidden, "hidden_report": report}


def _execute_plan(shell, plan, notes):
    """Deletes the targets and drops the hidden references. Returns
    {name: [weakref to each leaf]} to tell afterwards what is still alive."""
    ns = shell.user_ns
    alive = {}
    for n, v in plan["targets"].items():
        leaves = []
        holders.holdings(v, leaves)
        refs = []
        for leaf in leaves or [v]:
            try:
                refs.append(weakref.ref(leaf))
            except TypeError:
                pass
        alive[n] = refs
    ids = set(id(v) for v in plan["targets"].values())
    for ref, obj, _what in plan["hidden"]:
        try:
            _drop_hidden(shell, ref, obj, ids)
        except Exception as e:
            notes.append("could not drop %s: %s" % (ref, state.short_exc(e)))
    hiddens = [getattr(shell, "user_ns_hidden", {})]
    try:
        hiddens += [m.__dict__ for m in shell._main_mod_cache.values()]
    except Exception:
        pass
    for n, v in list(plan["targets"].items()):
        if ns.get(n, state.MISSING) is v:
            del ns[n]
        for d in hiddens:
            for k in [k for k, o in d.items() if o is v]:
                del d[k]
    plan["targets"].clear()
    plan["hidden"] = []
    return alive


def _drop_hidden(shell, ref, obj, ids):
    ns = shell.user_ns
    if isinstance(obj, holders.FrameLocals):
        # ref is a traceback label; find its frame again and clear it.
        for fr, label in holders.traceback_frames(shell):
            if label == ref:
                _clear_frame(fr)
        return
    hidden_ns = getattr(shell, "user_ns_hidden", {})
    dh = getattr(shell, "displayhook", None)
    oh = ns.get("_oh")
    if isinstance(oh, dict):
        for k in [k for k, v in oh.items() if v is obj]:
            del oh[k]
            for d in (ns, hidden_ns):
                if d.get("_%s" % k, state.MISSING) is obj:
                    del d["_%s" % k]
    for u in ("_", "__", "___"):
        for d in (ns, hidden_ns):
            if d.get(u, state.MISSING) is obj:
                d[u] = ""
        if dh is not None and getattr(dh, u, None) is obj:
            setattr(dh, u, "")
    ler = getattr(shell, "last_execution_result", None)
    if ler is not None and getattr(ler, "result", None) is obj:
        ler.result = None


def _clear_frame(fr):
    """Drops a finished frame's locals. frame.clear() empties the fast
    locals but (CPython 3.11/3.12) not the f_locals dict that reading
    f_locals made: that snapshot would keep every local alive. Reading
    f_locals again re-syncs it (cleared names are removed); clear what is
    left."""
    try:
        fr.clear()
    except RuntimeError:  # still executing
        return
    try:
        loc = fr.f_locals
        if isinstance(loc, dict):
            loc.clear()
    except Exception:
        pass

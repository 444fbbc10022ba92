"""The data of %gpumem (this kernel's memory and one line of advice),
%gpumem vars and %%gpumem (one cell's change and peak)."""

import os
import time

from . import daemon, holders, probes, state, units

_CACHED_ADVICE_MIN = 256 * state.MIB


def summary_data():
    fws = probes.frameworks()
    data = {"kind": "summary", "schema": state.SCHEMA, "pid": os.getpid(), "frameworks": fws}
    drv = daemon.driver_usage()
    if drv is not None:
        data["driver"] = drv
    else:
        data["driver_hint"] = daemon.DRIVER_HINT
    active = any(fw.get("state") == "active" for fw in fws)
    if active:
        note = "The CUDA context (about 0.5 GiB per GPU used) is freed only when the process exits: restart the kernel."
        if drv and not drv.get("error") and drv.get("bytes"):
            held = sum(
                (d.get("held") if d.get("held") is not None else d.get("used") or 0) for fw in fws for d in fw.get("devices", [])
            )
            other = drv["bytes"] - held
            if other > 0:
                note = (
                    "%s of the driver's figure is not framework memory: the CUDA context and libraries' "
                    "workspaces; only a kernel restart frees it." % units.fmt_bytes(other)
                )
        data["context_note"] = note
    try:
        hid = hidden_only(state.shell)
        if hid["bytes"]:
            data["hidden"] = {"bytes": hid["bytes"], "refs": hid["refs"]}
    except Exception:
        pass
    data["advice"] = _advice(data)
    return data


def hidden_only(shell):
    """GPU memory that only IPython's own references hold (no user variable
    holds it too): {"bytes", "refs", "traceback_bytes"}, the last the part
    held by saved tracebacks' frames."""
    user_keys = set()
    for _n, v in holders.user_vars(shell):
        for key, _b, _d in holders.holdings(v)[0]:
            user_keys.add(key)
    hb, tb, refs = 0, 0, []
    for ref, obj, what in holders.hidden_holders(shell):
        extra = 0
        for key, n, dev in holders.holdings(obj)[0]:
            if holders.is_gpu(dev) and key not in user_keys:
                user_keys.add(key)
                extra += n
        if extra:
            hb += extra
            refs.append(ref)
            if what == "saved traceback":
                tb += extra
    return {"bytes": hb, "refs": refs, "traceback_bytes": tb}


def _advice(data):
    fws = data.get("frameworks", [])
    for fw in fws:
        if fw["name"] == "jax":
            for d in fw.get("devices", []):
                if (
                    os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() not in ("false", "0")
                    and d.get("held")
                    and d.get("total")
                    and d["held"] >= 0.5 * d["total"]
                ):
                    return (
                        "JAX preallocated %s (75%% of the GPU by default); set XLA_PYTHON_CLIENT_PREALLOCATE=false "
                        "before importing jax (restart the kernel)" % units.fmt_bytes(d["held"])
                    )
    hid = data.get("hidden") or {}
    if hid.get("bytes", 0) >= _CACHED_ADVICE_MIN:
        return "%s is held only by IPython (%s): `%%gpumem free --all` drops it, or `%%gpumem vars` to see it" % (
            units.fmt_bytes(hid["bytes"]),
            ", ".join(hid.get("refs", [])),
        )
    cached = 0
    for fw in fws:
        if fw["name"] in ("torch", "cupy"):
            for d in fw.get("devices", []):
                if d.get("held") is not None:
                    cached += max(0, d["held"] - (d.get("used") or 0))
    if cached >= _CACHED_ADVICE_MIN:
        return "%s is cached but unused: `%%gpumem free` returns it to the GPU" % units.fmt_bytes(cached)
    for fw in fws:
        if fw["name"] == "tensorflow" and fw.get("state") == "active":
            return "TensorFlow returns GPU memory only when the process exits: restart the kernel to free it"
    return None


_VARS_ROWS = 100  # rows shown; a notebook with thousands of tensors gets a summary line


def vars_data(all_devices=False):
    rows, total = holders.scan_vars(all_devices)
    user = [r for r in rows if not r.get("hidden")]
    hidden = [r for r in rows if r.get("hidden")]
    data = {
        "kind": "vars",
        "schema": state.SCHEMA,
        "all_devices": bool(all_devices),
        "rows": user[:_VARS_ROWS] + hidden,
        "total_bytes": total,
        "variables": len(user),
    }
    if len(user) > _VARS_ROWS:
        cut = user[_VARS_ROWS:]
        data["more"] = {"rows": len(cut), "bytes": sum(r["bytes"] for r in cut)}
    if not any(state.mod(m) for m in ("torch", "cupy", "jax")):
        data["notes"] = ["No PyTorch, CuPy or JAX is loaded in this kernel."]
    return data


def _reset_peaks(notes):
    torch = state.mod("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                for i in range(torch.cuda.device_count()):
                    torch.cuda.reset_peak_memory_stats(i)
        except Exception as e:
            notes.append("PyTorch: could not reset peak counters: %s" % state.short_exc(e))
    tf = state.mod("tensorflow")
    if tf is not None and probes.tf_initialised():
        try:
            for ld in tf.config.list_logical_devices("GPU"):
                tf.config.experimental.reset_memory_stats(ld.name)
        except Exception as e:
            notes.append("TensorFlow: could not reset peak counters: %s" % state.short_exc(e))


def _run_cell_code(shell, cell):
    import ast

    src = shell.transform_cell(cell)
    name = shell.compile.cache(src, shell.execution_count, raw_code=cell)
    tree = shell.compile.ast_parse(src, filename=name)
    tree = shell.transform_ast(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body = tree.body[:-1]
    glob = shell.user_ns
    if tree.body:
        exec(shell.compile(tree, name, "exec"), glob)
    if last is not None:
        return eval(shell.compile(last, name, "eval"), glob)
    return None


def run_cell(shell, cell):
    """Runs a %%gpumem cell as IPython would; returns its value and the
    cell's data dict (change per framework and device, peak)."""
    notes = []
    before = probes.frameworks()
    _reset_peaks(notes)
    t0 = time.perf_counter()
    value = None
    try:
        value = _run_cell_code(shell, cell)
    except BaseException:
        # As %%time does: show the user's traceback as a failed cell would,
        # without this module's frames.
        shell.showtraceback(tb_offset=2)
    elapsed = time.perf_counter() - t0
    after = probes.frameworks()
    rows = probes.before_after(before, after)
    peaks = {(fw["name"], d["device"]): d.get("peak") for fw in after for d in fw.get("devices", [])}
    for r in rows:
        r["peak"] = peaks.get((r["name"], r["device"]))
        if r["name"] == "jax" and r["peak"] is not None:
            notes.append("JAX's peak is since the process started: it has no reset.")
    if any(r["name"] == "cupy" for r in rows):
        notes.append("CuPy keeps no peak counter: its peak is not shown.")
    data = {
        "kind": "cell",
        "schema": state.SCHEMA,
        "frameworks": rows,
        "elapsed_ms": int(elapsed * 1000),
        "notes": sorted(set(notes), key=notes.index),
    }
    return value, data

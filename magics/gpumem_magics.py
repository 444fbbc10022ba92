# gpumem's %gpumem magics. gpumem injects this file into a running IPython
# kernel over the Jupyter protocol (see inject.go); nothing is installed in the
# user's environment.
#
# Rules this code keeps, because it runs inside someone else's notebook:
#   - it never imports torch, tensorflow, jax or cupy: it only uses the ones
#     already in sys.modules;
#   - it never creates a CUDA context: every call that would initialise CUDA is
#     guarded (torch.cuda.is_initialized(), JAX's backends, TF's context);
#   - it adds nothing to the user's namespace; its state lives in this module,
#     which the bootstrap registers as sys.modules["_gpumem_magics"];
#   - it never raises into the user's cell: failures are reported, not thrown
#     (an exception would overwrite sys.last_* and the user's traceback);
#   - it renders only from a data dict (render()), so the renderings are
#     deterministic and tested with golden files.
#
# The data dicts are gpumem's JSON schema v1; magics/report.go decodes the
# "free" one for `gpumem free`.

import gc
import html as _html
import os
import sys
import time
import weakref

SCHEMA = 1
VERSION = "dev"  # replaced by the bootstrap with the source's hash
MODULE_NAME = "_gpumem_magics"
MIME = "application/vnd.gpumem.v1+json"
GIB = 1 << 30
MIB = 1 << 20

_config = {}
_shell = None

_LAST_NAMES = ("last_type", "last_value", "last_traceback", "last_exc")
_MISSING = object()
# Names %gpumem free refuses to delete: IPython's own.
_PROTECTED = frozenset(
    ["In", "Out", "get_ipython", "exit", "quit", "_ih", "_oh", "_dh", "__builtins__", "__builtin__", "__name__"]
)
_CONTAINER_SCAN_LIMIT = 100000
_CACHED_ADVICE_MIN = 256 * MIB


# ---------------------------------------------------------------------------
# Formatting helpers (pure)


def fmt_bytes(n):
    """Human bytes, binary units: 0 B, 512 B, 1.50 KiB, 2.00 GiB."""
    if n is None:
        return "?"
    n = int(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return "%s%d B" % (sign, n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if n < 1024 or unit == "PiB":
            return "%s%.2f %s" % (sign, n, unit)
    return "%s%d B" % (sign, n)


def fmt_delta(n):
    if n is None:
        return "?"
    return ("+" if n > 0 else "") + fmt_bytes(n)


def _esc(s):
    return _html.escape(str(s), quote=True)


def _pad(rows, header):
    """Left-aligned text columns; the last column is not padded."""
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for r in table:
        cells = [r[i].ljust(widths[i]) if i < len(r) - 1 else r[i] for i in range(len(r))]
        out.append("  ".join(cells).rstrip())
    return out


def _text_bar(used, held, scale, width=20):
    """[████▒▒    ]: █ in use, ▒ held but unused, scaled to scale bytes."""
    if not scale or scale <= 0:
        return ""
    used = max(0, min(used or 0, scale))
    held = max(used, min(held if held is not None else used, scale))
    u = (used * width + scale // 2) // scale
    h = (held * width + scale // 2) // scale
    if used > 0 and u == 0:
        u = 1
    h = max(h, u)
    if held > used and h == u and u < width:
        h = u + 1
    return "[" + "█" * u + "▒" * (h - u) + " " * (width - h) + "]"


def _pct(part, scale):
    if not scale or scale <= 0 or not part:
        return 0.0
    return min(100.0, round(100.0 * part / scale, 1))


def _html_bar(used, held, scale):
    if not scale or scale <= 0:
        return ""
    used = used or 0
    held = held if held is not None else used
    pu = _pct(used, scale)
    ph = max(0.0, round(_pct(held, scale) - pu, 1))
    return (
        '<div class="gpumem-bar" style="width:160px;height:10px;background:#e8e8e8;'
        'border-radius:2px;overflow:hidden;display:flex">'
        '<div style="width:%.1f%%;background:#d9534f"></div>'
        '<div style="width:%.1f%%;background:#f0ad4e"></div></div>' % (pu, ph)
    )


_CSS = (
    '<style>.gpumem{font-family:var(--jp-code-font-family,monospace);font-size:12px}'
    ".gpumem table{border-collapse:collapse}"
    ".gpumem th,.gpumem td{padding:2px 8px;text-align:left;vertical-align:middle}"
    ".gpumem td.n{text-align:right}"
    ".gpumem .dim{color:#777}.gpumem .warn{color:#b35900}.gpumem .err{color:#c9302c}"
    "</style>"
)


def _html_table(header, rows, numeric=()):
    h = ["<table><thead><tr>"]
    for i, c in enumerate(header):
        h.append('<th%s>%s</th>' % (' class="n"' if i in numeric else "", _esc(c)))
    h.append("</tr></thead><tbody>")
    for r in rows:
        h.append("<tr>")
        for i, c in enumerate(r):
            # Cells given as ("html", s) are trusted markup made here.
            if isinstance(c, tuple) and c and c[0] == "html":
                h.append("<td>%s</td>" % c[1])
            else:
                h.append('<td%s>%s</td>' % (' class="n"' if i in numeric else "", _esc(c)))
        h.append("</tr>")
    h.append("</tbody></table>")
    return "".join(h)


def _html_lines(lines, cls=""):
    return "".join('<div class="%s">%s</div>' % (cls, _esc(x)) for x in lines)


def _html_doc(title, body):
    return '%s<div class="gpumem"><b>%s</b>%s</div>' % (_CSS, _esc(title), body)


# ---------------------------------------------------------------------------
# Rendering (pure: data dict in, text and HTML out)


def render(data):
    """Returns (text/plain, text/html) for a data dict made by this module."""
    kind = data.get("kind")
    fn = {
        "summary": _render_summary,
        "vars": _render_vars,
        "free": _render_free,
        "cell": _render_cell,
        "help": _render_help,
        "top": _render_top,
        "error": _render_error,
    }.get(kind, _render_error)
    return fn(data)


def _fw_rows(frameworks):
    rows = []
    for fw in frameworks:
        for d in fw.get("devices", []):
            rows.append((fw, d))
    return rows


def _scale_for(d, rows):
    if d.get("total"):
        return d["total"]
    m = 0
    for _, x in rows:
        m = max(m, x.get("held") or 0, x.get("used") or 0)
    return m


def _render_summary(data):
    title = "gpumem: GPU memory of this kernel (pid %s)" % data.get("pid", "?")
    text = [title, ""]
    hbody = []
    rows = _fw_rows(data.get("frameworks", []))
    if rows:
        trows, hrows = [], []
        for fw, d in rows:
            used, held = d.get("used"), d.get("held")
            cached = None if held is None or used is None else max(0, held - used)
            scale = _scale_for(d, rows)
            of = (" of " + fmt_bytes(d["total"])) if d.get("total") else ""
            trows.append(
                [
                    d.get("device", "?"),
                    fw.get("label", fw.get("name", "?")),
                    fmt_bytes(used),
                    "-" if cached is None else fmt_bytes(cached),
                    "-" if held is None else fmt_bytes(held),
                    "-" if d.get("peak") is None else fmt_bytes(d["peak"]),
                    _text_bar(used, held, scale) + of,
                ]
            )
            hrows.append(
                [
                    d.get("device", "?"),
                    fw.get("label", fw.get("name", "?")),
                    fmt_bytes(used),
                    "-" if cached is None else fmt_bytes(cached),
                    "-" if held is None else fmt_bytes(held),
                    "-" if d.get("peak") is None else fmt_bytes(d["peak"]),
                    ("html", _html_bar(used, held, scale) + ('<span class="dim">%s</span>' % _esc(of) if of else "")),
                ]
            )
        header = ["device", "framework", "in use", "cached", "held", "peak", "in use ▮ / cached ▮"]
        text += _pad(trows, header[:-1] + ["in use █ / cached ▒"])
        hbody.append(_html_table(header, hrows, numeric=(2, 3, 4, 5)))
    notes = []
    for fw in data.get("frameworks", []):
        if fw.get("message"):
            notes.append("%s: %s" % (fw.get("label", fw.get("name")), fw["message"]))
    if not rows and not notes:
        notes.append("No GPU framework (PyTorch, CuPy, JAX, TensorFlow) is loaded in this kernel.")
    elif not rows:
        notes.append("No framework holds GPU memory in this kernel.")
    text += notes
    hbody.append(_html_lines(notes, "dim"))
    extra = []
    drv = data.get("driver")
    if drv:
        if drv.get("error"):
            extra.append(("warn", "driver: %s" % drv["error"]))
        else:
            per = ", ".join(
                "GPU %s: %s" % (g.get("index"), fmt_bytes(g.get("bytes"))) for g in drv.get("per_gpu", [])
            )
            pids = ", ".join(str(p) for p in drv.get("pids", []))
            extra.append(
                (
                    "",
                    "driver (NVML, via gpumem serve): %s for this kernel%s%s"
                    % (fmt_bytes(drv.get("bytes")), (" (" + per + ")") if per else "", ("; pids " + pids) if pids else ""),
                )
            )
    elif data.get("driver_hint"):
        extra.append(("dim", data["driver_hint"]))
    if data.get("context_note"):
        extra.append(("dim", data["context_note"]))
    hid = data.get("hidden") or {}
    if hid.get("bytes"):
        extra.append(
            (
                "warn",
                "held only by IPython: %s (%s)" % (fmt_bytes(hid["bytes"]), ", ".join(hid.get("refs", []))),
            )
        )
    if data.get("advice"):
        extra.append(("warn", "advice: " + data["advice"]))
    if extra:
        text.append("")
        text += [x[1] for x in extra]
        hbody.append("".join('<div class="%s">%s</div>' % (c, _esc(s)) for c, s in extra))
    return "\n".join(text), _html_doc(title, "".join(hbody))


def _render_vars(data):
    scope = "all devices" if data.get("all_devices") else "GPU memory only; --all-devices adds CPU"
    title = "gpumem vars: variables holding memory (%s)" % scope
    text = [title, ""]
    rows = data.get("rows", [])
    if not rows:
        msg = "No variable holds %s." % ("tensors or arrays" if data.get("all_devices") else "GPU memory")
        text.append(msg)
        body = _html_lines([msg], "dim")
    else:
        big = max(r.get("bytes", 0) for r in rows) or 1
        trows, hrows = [], []
        for r in rows:
            note = _var_note(r)
            trows.append(
                [r["name"], r.get("type", "?"), r.get("device", "?"), fmt_bytes(r.get("bytes")), _text_bar(r.get("bytes"), r.get("bytes"), big, 12), note]
            )
            hrows.append(
                [r["name"], r.get("type", "?"), r.get("device", "?"), fmt_bytes(r.get("bytes")), ("html", _html_bar(r.get("bytes"), r.get("bytes"), big)), note]
            )
        header = ["name", "type", "device", "bytes", "", "note"]
        text += _pad(trows, header)
        body = _html_table(header, hrows, numeric=(3,))
    foot = []
    more = data.get("more")
    if more:
        foot.append("... and %d more variables holding %s (not shown; total below counts them)"
                    % (more["rows"], fmt_bytes(more["bytes"])))
    total = data.get("total_bytes", 0)
    nvars = data.get("variables", sum(1 for r in rows if not r.get("hidden")))
    holders = "%d variable%s" % (nvars, "" if nvars == 1 else "s")
    if any(r.get("hidden") for r in rows):
        holders = (holders + " and " if nvars else "") + "IPython's hidden references"
    foot.append("total: %s held by %s (shared storage counted once)" % (fmt_bytes(total), holders))
    foot += data.get("notes", [])
    text += [""] + foot
    body += _html_lines(foot, "dim")
    return "\n".join(text), _html_doc(title, body)


def _var_note(r):
    parts = []
    if r.get("hidden"):
        parts.append(r.get("where", "held by IPython"))
    if r.get("detail"):
        parts.append(r["detail"])
    if r.get("shared_with"):
        parts.append("shares storage with " + ", ".join(r["shared_with"]))
    return "; ".join(parts)


def _render_free(data):
    if data.get("dry_run"):
        title = "gpumem free --dry-run: nothing was freed"
    elif data.get("cache_only"):
        title = "gpumem free: emptied caches (no variable touched)"
    else:
        title = "gpumem free"
    text = [title, ""]
    body = []
    if data.get("error"):
        text.append("error: " + data["error"])
        body.append('<div class="err">%s</div>' % _esc("error: " + data["error"]))
        return "\n".join(text), _html_doc(title, "".join(body))
    dels = data.get("deleted", [])
    verb = "would delete" if data.get("dry_run") else "deleted"
    if dels:
        rows = []
        for d in dels:
            if data.get("dry_run"):
                status = ""
            elif d.get("alive"):
                status = "still referenced" + (" by " + ", ".join(d["held_by"]) if d.get("held_by") else " elsewhere")
            else:
                status = "freed"
            rows.append([d["name"], d.get("type", "?"), d.get("device", "?"), fmt_bytes(d.get("bytes")), status])
        text.append(verb + ":")
        text += ["  " + x for x in _pad(rows, ["name", "type", "device", "bytes", "status" if not data.get("dry_run") else ""])]
        body.append("<div>%s:</div>" % _esc(verb) + _html_table(["name", "type", "device", "bytes", "status"], rows, numeric=(3,)))
    elif not data.get("cache_only"):
        msg = "no variable to delete"
        text.append(msg)
        body.append(_html_lines([msg], "dim"))
    hid = data.get("hidden", [])
    if hid:
        hverb = "would drop" if data.get("dry_run") else "dropped"
        lines = []
        for h in hid:
            if h.get("action") == "kept":
                lines.append("kept %s (%s)%s" % (h["ref"], h.get("what", ""), (": " + fmt_bytes(h["bytes"])) if h.get("bytes") else ""))
            else:
                lines.append("%s %s (%s)" % (hverb, h["ref"], h.get("what", "")))
        text.append("IPython's hidden references:")
        text += ["  " + x for x in lines]
        body.append("<div>IPython's hidden references:</div>" + _html_lines(["  " + x for x in lines]))
    fws = data.get("frameworks", [])
    if fws:
        rows = []
        hrows = []
        for f in fws:
            b, a = f.get("before", {}), f.get("after", {})
            ret = None
            if b.get("held") is not None and a.get("held") is not None:
                ret = b["held"] - a["held"]
            rows.append(
                [
                    f.get("label", f.get("name", "?")),
                    f.get("device", "?"),
                    "%s / %s" % (fmt_bytes(b.get("used")), fmt_bytes(b.get("held"))),
                    "%s / %s" % (fmt_bytes(a.get("used")), fmt_bytes(a.get("held"))),
                    "-" if ret is None else fmt_bytes(ret),
                ]
            )
        header = ["framework", "device", "before (in use / held)", "after (in use / held)", "returned to GPU"]
        if text[-1]:
            text.append("")
        text += _pad(rows, header)
        body.append(_html_table(header, rows, numeric=(2, 3, 4)))
    else:
        msg = "No framework held GPU memory before or after."
        if text[-1]:
            text.append("")
        text.append(msg)
        body.append(_html_lines([msg], "dim"))
    drv = data.get("driver")
    if drv and drv.get("before") is not None and drv.get("after") is not None:
        line = "driver (NVML): %s -> %s for this kernel (%s)" % (
            fmt_bytes(drv["before"]), fmt_bytes(drv["after"]), fmt_delta(drv["after"] - drv["before"]))
        text.append(line)
        body.append(_html_lines([line]))
    notes = list(data.get("notes", []))
    if data.get("elapsed_ms") is not None:
        notes.append("took %d ms" % data["elapsed_ms"])
    if notes:
        text.append("")
        text += notes
        body.append(_html_lines(notes, "dim"))
    return "\n".join(text), _html_doc(title, "".join(body))


def _render_cell(data):
    title = "gpumem: this cell's GPU memory"
    text = [title, ""]
    body = []
    rows = []
    for f in data.get("frameworks", []):
        b, a = f.get("before", {}), f.get("after", {})
        du = None if a.get("used") is None or b.get("used") is None else a["used"] - b["used"]
        dh = None if a.get("held") is None or b.get("held") is None else a["held"] - b["held"]
        rows.append([
            f.get("label", "?"), f.get("device", "?"), fmt_delta(du), fmt_delta(dh),
            "-" if f.get("peak") is None else fmt_bytes(f["peak"]),
            fmt_bytes(a.get("used")), "-" if a.get("held") is None else fmt_bytes(a.get("held")),
        ])
    if rows:
        header = ["framework", "device", "Δ in use", "Δ held", "peak in use", "in use now", "held now"]
        text += _pad(rows, header)
        body.append(_html_table(header, rows, numeric=(2, 3, 4, 5, 6)))
    else:
        msg = "No framework held GPU memory before or after the cell."
        text.append(msg)
        body.append(_html_lines([msg], "dim"))
    notes = list(data.get("notes", []))
    if data.get("elapsed_ms") is not None:
        notes.append("cell ran %d ms" % data["elapsed_ms"])
    if notes:
        text += [""] + notes
        body.append(_html_lines(notes, "dim"))
    return "\n".join(text), _html_doc(title, "".join(body))


_HELP = [
    ("%gpumem", "this kernel's GPU memory per device and framework, the driver's figure, advice"),
    ("%gpumem vars [--all-devices]", "variables holding GPU memory, largest first (--all-devices: CPU tensors too)"),
    ("%gpumem free NAME ...", "delete the variables, drop IPython's hidden references to them, empty the caches"),
    ("%gpumem free --all [--keep NAME ...]", "delete every variable holding GPU memory except --keep, and hidden references"),
    ("%gpumem free", "only empty the frameworks' caches (gc + empty_cache); no variable is touched"),
    ("%gpumem free ... --dry-run", "show what would be deleted and dropped; free nothing"),
    ("%%gpumem", "(first line of a cell) run the cell, report its change in memory and its peak"),
    ("%gpumem top", "the notebooks and processes sharing this kernel's GPUs, biggest first (needs gpumem serve)"),
    ("%gpumem help", "this help"),
]


def _render_help(data):
    title = "gpumem magics (injected by gpumem %s)" % data.get("version", "")
    rows = [[a, b] for a, b in _HELP]
    foot = [
        "Hidden references: Out/_oh, _, __, ___, _N, the displayhook, last_execution_result, "
        "sys.last_* and the frames of a saved traceback keep objects alive after `del`.",
        "Only a kernel restart frees the CUDA context (about 0.5 GiB per GPU) and TensorFlow's memory.",
    ]
    text = [title, ""] + _pad(rows, ["command", "what it does"]) + [""] + foot
    body = _html_table(["command", "what it does"], rows) + _html_lines(foot, "dim")
    return "\n".join(text), _html_doc(title, body)


def _render_top(data):
    title = "gpumem top: who holds the GPUs this kernel uses"
    if data.get("error"):
        return _render_error({"message": data["error"]})
    text, body = [title, ""], []
    for g in data.get("gpus", []):
        total = g.get("total", 0) or 0
        head = "GPU %s  %s  %s / %s used (%.0f%%)" % (
            g.get("index"), g.get("name", ""), fmt_bytes(g.get("used", 0)), fmt_bytes(total),
            100.0 * (g.get("used", 0) or 0) / total if total else 0.0)
        rows = []
        for h in g.get("holders", []):
            mark = "  <- this kernel" if h.get("self") else ""
            rows.append([h.get("name", ""), h.get("user", ""), fmt_bytes(h.get("bytes", 0)) + mark])
        text.append(head)
        text += ["  " + line for line in _pad(rows, ["holder", "user", "memory"])] if rows else ["  (nothing listed)"]
        text.append("")
        body.append("<h4>%s</h4>" % _esc(head))
        body.append(_html_table(["holder", "user", "memory"], rows, numeric=(2,)))
    if data.get("note"):
        text.append(data["note"])
        body.append(_html_lines([data["note"]], "dim"))
    if not data.get("gpus"):
        text.append("This kernel holds no GPU memory that gpumem serve knows of.")
    return "\n".join(text).rstrip(), _html_doc(title, "".join(body))


def _render_error(data):
    msg = data.get("message") or ("unknown report kind %r" % data.get("kind"))
    title = "gpumem: error"
    return title + ": " + msg, _html_doc(title, '<div class="err">%s</div>' % _esc(msg))


# ---------------------------------------------------------------------------
# Framework probes: never import, never initialise CUDA.


def _mod(name):
    return sys.modules.get(name)


def _torch_probe():
    torch = _mod("torch")
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
        fw["message"] = "could not read: %s" % _short_exc(e)
    return fw


def _cupy_probe():
    cp = _mod("cupy")
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
        fw["message"] = "could not read: %s" % _short_exc(e)
    return fw


def _jax_initialised():
    xb = _mod("jax._src.xla_bridge")
    if xb is None:
        return False
    backends = getattr(xb, "_backends", None)
    return bool(backends)


def _jax_probe():
    jax = _mod("jax")
    if jax is None:
        return None
    fw = {"name": "jax", "label": "JAX", "version": str(getattr(jax, "__version__", "?")), "devices": []}
    try:
        if not _jax_initialised():
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
        fw["message"] = "could not read: %s" % _short_exc(e)
    return fw


def _tf_initialised():
    ctxmod = _mod("tensorflow.python.eager.context")
    if ctxmod is None:
        return False
    try:
        ctx = ctxmod.context()
        return getattr(ctx, "_context_handle", None) is not None
    except Exception:
        return False


def _tf_probe():
    tf = _mod("tensorflow")
    if tf is None:
        return None
    fw = {"name": "tensorflow", "label": "TensorFlow", "version": str(getattr(tf, "__version__", "?")), "devices": []}
    try:
        if not _tf_initialised():
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
        fw["message"] = "could not read: %s" % _short_exc(e)
    return fw


_PROBES = (_torch_probe, _cupy_probe, _jax_probe, _tf_probe)


def frameworks():
    out = []
    for p in _PROBES:
        fw = p()
        if fw is not None:
            out.append(fw)
    return out


def _short_exc(e):
    s = "%s: %s" % (type(e).__name__, e)
    return s if len(s) <= 200 else s[:197] + "..."


def _flat(fws):
    """{(framework, device): {used, held, label}} from frameworks()."""
    out = {}
    for fw in fws:
        for d in fw.get("devices", []):
            out[(fw["name"], d["device"])] = dict(d, label=fw["label"], name=fw["name"])
    return out


# ---------------------------------------------------------------------------
# The sidecar (gpumem serve): the driver's (NVML) figure for this kernel.


def driver_usage(timeout=0.5, fresh=False):
    """Asks gpumem serve (its unix socket API) for this kernel's processes'
    GPU memory: GET /api/v1/kernels/<id> when the Go side passed the kernel
    id (the only request a kernel may make in shared mode), else GET
    /api/v1/notebooks matched by pid. fresh asks for a reading taken now
    rather than the last sample (a report before and after a free).

    Returns None when no sidecar is configured, else a dict with bytes,
    per_gpu and pids, or with error."""
    sock = _config.get("sidecar_socket") or os.environ.get("GPUMEM_SOCKET")
    if not sock:
        return None
    import json

    kid = _config.get("kernel_id")
    pid = os.getpid()

    def get(path):
        status, body = _sidecar_get(path, timeout)
        if status == 0:
            raise OSError(body.decode("utf-8", "replace"))
        return status, body

    try:
        if kid:
            from urllib.parse import quote

            status, body = get("/api/v1/kernels/" + quote(kid, safe="") + ("?fresh=1" if fresh else ""))
            if status == 404:
                return {"error": "gpumem serve does not know this kernel (%s) yet" % kid}
            if status != 200:
                return {"error": "gpumem serve answered %d: %s" % (status, _api_error(body))}
            nbs = [json.loads(body.decode("utf-8"))]
        else:
            status, body = get("/api/v1/notebooks")
            if status != 200:
                return {"error": "gpumem serve answered %d: %s" % (status, _api_error(body))}
            nbs = json.loads(body.decode("utf-8")).get("notebooks") or []
    except Exception as e:
        return {"error": "gpumem serve did not answer on %s (%s)" % (sock, _short_exc(e))}
    for nb in nbs:
        if (kid and nb.get("kernel_id") == kid) or pid in (nb.get("pids") or []):
            return {
                "bytes": int(nb.get("gpu_memory_bytes") or 0),
                "per_gpu": [{"index": g.get("index"), "bytes": int(g.get("bytes") or 0)} for g in nb.get("per_gpu") or []],
                "pids": [int(p) for p in nb.get("pids") or []],
            }
    return {"bytes": 0, "per_gpu": [], "pids": [pid]}


def _api_error(body):
    try:
        import json

        return str(json.loads(body.decode("utf-8")).get("error"))[:200]
    except Exception:
        return body[:200].decode("utf-8", "replace")


_DRIVER_HINT = (
    "The driver's figure for this kernel (what nvidia-smi counts, CUDA context included) "
    "needs the sidecar: run `gpumem serve`, then `gpumem attach` this kernel."
)


# ---------------------------------------------------------------------------
# Finding what holds memory: variables, IPython's hidden references.

_kind_cache = {}


def _kind(tp):
    """Classifies a type: None (holds nothing we count), 'tensor', 'module',
    'optim', 'cupy', 'jax', 'seq', 'map', 'obj'. Cached per type."""
    k = _kind_cache.get(tp, _MISSING)
    if k is not _MISSING:
        return k
    k = _classify(tp)
    if len(_kind_cache) > 20000:
        _kind_cache.clear()
    _kind_cache[tp] = k
    return k


_SCALARS = (int, float, complex, bool, str, bytes, bytearray, type(None), range, slice, memoryview)


def _classify(tp):
    try:
        if issubclass(tp, _SCALARS) or issubclass(tp, type):
            return None
        torch = _mod("torch")
        if torch is not None:
            if issubclass(tp, torch.Tensor):
                return "tensor"
            if issubclass(tp, torch.nn.Module):
                return "module"
            if issubclass(tp, torch.optim.Optimizer):
                return "optim"
        cp = _mod("cupy")
        if cp is not None and issubclass(tp, cp.ndarray):
            return "cupy"
        jax = _mod("jax")
        if jax is not None:
            arr = getattr(jax, "Array", None)
            if arr is not None and issubclass(tp, arr):
                return "jax"
        if issubclass(tp, dict):
            return "map"
        if issubclass(tp, (list, tuple, set, frozenset)):
            return "seq"
        import collections

        if issubclass(tp, collections.deque):
            return "seq"
        import types as _t

        if issubclass(tp, (_t.ModuleType, _t.FunctionType, _t.BuiltinFunctionType, _t.MethodType, _t.CodeType, _t.FrameType)):
            return None
        if "__dict__" in getattr(tp, "__dict__", {}) or any("__dict__" in getattr(b, "__dict__", {}) for b in tp.__mro__[1:]):
            return "obj"
    except Exception:
        pass
    return None


def _is_gpu(dev):
    return not (dev == "cpu" or dev.startswith("cpu:") or dev == "meta")


def _tensor_storages(t, out):
    try:
        dev = t.device
        if dev.type == "meta":
            return
        devs = str(dev)
        try:
            us = getattr(t, "untyped_storage", None)  # torch >= 2.0
            st = us() if us is not None else t.storage()
            ptr, n = int(st.data_ptr()), int(st.nbytes())
            key = ("torch", devs, ptr) if ptr else ("id", id(t))
        except Exception:
            n = int(t.element_size() * t.nelement())
            key = ("id", id(t))
        if n:
            out.append((key, n, devs))
        if t.requires_grad and t.is_leaf:
            g = t.grad
            if g is not None:
                _tensor_storages(g, out)
    except Exception:
        pass


def _leaf_storages(obj, kind, out):
    """Appends (key, nbytes, device) of every buffer obj holds."""
    if kind == "tensor":
        _tensor_storages(obj, out)
    elif kind == "module":
        try:
            for p in obj.parameters():
                _tensor_storages(p, out)
            for b in obj.buffers():
                _tensor_storages(b, out)
        except Exception:
            pass
    elif kind == "optim":
        try:
            for g in obj.param_groups:
                for p in g.get("params", []):
                    _tensor_storages(p, out)
            for st in obj.state.values():
                if isinstance(st, dict):
                    for v in st.values():
                        if _kind(type(v)) == "tensor":
                            _tensor_storages(v, out)
        except Exception:
            pass
    elif kind == "cupy":
        try:
            mem = obj.data.mem
            out.append((("cupy", int(obj.device.id), int(mem.ptr)), int(mem.size), "cuda:%d" % obj.device.id))
        except Exception:
            pass
    elif kind == "jax":
        try:
            if obj.is_deleted():
                return
            for sh in obj.addressable_shards:
                dev = sh.device
                devs = "%s:%d" % ("cuda" if dev.platform == "gpu" else dev.platform, dev.id)
                data = sh.data
                try:
                    key = ("jax", devs, int(data.unsafe_buffer_pointer()))
                except Exception:
                    key = ("id", id(data))
                out.append((key, int(data.nbytes), devs))
        except Exception:
            pass


_LEAVES = ("tensor", "module", "optim", "cupy", "jax")


def _holdings(obj, leaves=None):
    """Storages an object holds: itself if a leaf, else leaves one level deep
    (container items, instance attributes). Returns (storages, type label,
    number of leaves). leaves, if a list, receives the leaf objects."""
    out = []
    kind = _kind(type(obj))
    if kind is None:
        return out, None, 0
    if kind in _LEAVES:
        _leaf_storages(obj, kind, out)
        if leaves is not None:
            leaves.append(obj)
        return out, type(obj).__name__, 1
    if kind == "map":
        items = obj.values()
    elif kind == "seq":
        items = obj
    else:  # obj: an instance; look one level into its attributes
        try:
            d = object.__getattribute__(obj, "__dict__")
        except Exception:
            return out, None, 0
        if not isinstance(d, dict):
            return out, None, 0
        items = d.values()
    n = 0
    try:
        for i, v in enumerate(items):
            if i >= _CONTAINER_SCAN_LIMIT:
                break
            vk = _kind(type(v))
            if vk in _LEAVES:
                _leaf_storages(v, vk, out)
                n += 1
                if leaves is not None:
                    leaves.append(v)
    except Exception:
        pass
    if not n:
        return out, None, 0
    return out, type(obj).__name__, n


def _user_vars(shell):
    ns = shell.user_ns
    hidden = getattr(shell, "user_ns_hidden", {})
    for name, value in list(ns.items()):
        if name.startswith("_"):
            continue
        hv = hidden.get(name, _MISSING)
        if hv is value:
            continue
        yield name, value


def _rows_from(holders, all_devices):
    """holders: [(name, obj, extra)]. Returns rows, largest first, with
    shared storage counted once. A storage is claimed by its most direct
    holder: tensors, arrays and modules first, then optimizers, then
    containers and objects, then IPython's hidden references (largest first
    within each); the others name the claimer in shared_with."""
    prelim = []
    for name, obj, extra in holders:
        sts, tname, nleaves = _holdings(obj)
        if not sts:
            continue
        seen = {}
        for key, n, dev in sts:
            if not all_devices and not _is_gpu(dev):
                continue
            if key not in seen:
                seen[key] = (n, dev)
        if not seen:
            continue
        total = sum(n for n, _ in seen.values())
        devs = sorted(set(d for _, d in seen.values()))
        row = {"name": name, "type": tname, "device": "+".join(devs), "bytes": total}
        if tname and nleaves > 1 or (extra or {}).get("container"):
            row["detail"] = "%d tensors/arrays" % nleaves
        if extra:
            for k, v in extra.items():
                if k != "container":
                    row[k] = v
        kind = _kind(type(obj))
        prio = 3 if row.get("hidden") else {"optim": 1, "seq": 2, "map": 2, "obj": 2}.get(kind, 0)
        prelim.append((row, seen, prio))
    owner = {}
    total = 0
    for row, seen, _p in sorted(prelim, key=lambda r: (r[2], -r[0]["bytes"], r[0]["name"])):
        shared = []
        for key, (n, _) in seen.items():
            o = owner.get(key)
            if o is None:
                owner[key] = row["name"]
                total += n
            elif o not in shared:
                shared.append(o)
        if shared:
            row["shared_with"] = sorted(shared)
    prelim.sort(key=lambda r: (bool(r[0].get("hidden")), -r[0]["bytes"], r[0]["name"]))
    return [r[0] for r in prelim], total


def _hidden_holders(shell):
    """IPython's own references that keep objects alive: [(ref, obj, what)].
    Grouped so one object shown under several names is one holder."""
    out = []
    ns = shell.user_ns
    oh = ns.get("_oh")
    byid = {}
    order = []

    def add(ref, obj, what):
        if _kind(type(obj)) is None:
            return
        k = id(obj)
        if k in byid:
            byid[k][0].append(ref)
            return
        byid[k] = ([ref], obj, what)
        order.append(k)

    if isinstance(oh, dict):
        for n in sorted(oh, key=lambda x: (str(type(x)), x)):
            add("Out[%s]" % n, oh[n], "output cache")
            if ns.get("_%s" % n, _MISSING) is oh[n]:
                add("_%s" % n, oh[n], "output cache")
    dh = getattr(shell, "displayhook", None)
    for u in ("_", "__", "___"):
        v = ns.get(u, _MISSING)
        if v is not _MISSING:
            add(u, v, "last outputs")
        dv = getattr(dh, u, _MISSING)
        if dv is not _MISSING and dv is not v:
            add("displayhook." + u, dv, "last outputs")
    ler = getattr(shell, "last_execution_result", None)
    if ler is not None and getattr(ler, "result", None) is not None:
        add("last_execution_result", ler.result, "last result")
    for ref, obj, what in (byid[k] for k in order):
        out.append(("/".join(ref), obj, what))
    for fr, label in _traceback_frames(shell):
        try:
            loc = fr.f_locals
        except Exception:
            continue
        fo = _FrameLocals(loc)
        out.append((label, fo, "saved traceback"))
    return out


class _FrameLocals(dict):
    """A frame's locals, seen as a container (one level deep)."""


_FrameLocals.__name__ = "frame locals"


def _exc_chain(e, seen):
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _traceback_frames(shell):
    """(frame, label) of function frames in saved tracebacks: sys.last_*,
    InteractiveTB.tb, last_execution_result.error_in_exec, chained ones."""
    tbs = []
    excs = []
    for n in ("last_value", "last_exc"):
        e = sys.__dict__.get(n)
        if isinstance(e, BaseException):
            excs.append(e)
    ler = getattr(shell, "last_execution_result", None)
    e = getattr(ler, "error_in_exec", None)
    if isinstance(e, BaseException):
        excs.append(e)
    seen = set()
    labels = {}
    for e0 in excs:
        for e in _exc_chain(e0, seen):
            if e.__traceback__ is not None:
                tbs.append((e.__traceback__, type(e).__name__))
    ltb = sys.__dict__.get("last_traceback")
    if ltb is not None:
        tbs.append((ltb, getattr(sys.__dict__.get("last_type"), "__name__", "exception")))
    itb = getattr(getattr(shell, "InteractiveTB", None), "tb", None)
    if itb is not None:
        tbs.append((itb, "exception"))
    frames = []
    fseen = set()
    for tb, ename in tbs:
        while tb is not None:
            fr = tb.tb_frame
            if id(fr) not in fseen:
                fseen.add(id(fr))
                # Module-level frames (a cell's own) have the namespace as
                # their locals: that is the user's, not the traceback's.
                if fr.f_code.co_flags & 0x0002:  # CO_NEWLOCALS: a function's frame
                    frames.append((fr, "%s traceback: %s() locals" % (ename, fr.f_code.co_name)))
            tb = tb.tb_next
    return frames


def scan_vars(all_devices=False):
    shell = _shell
    holders = [(n, v, None) for n, v in _user_vars(shell)]
    for ref, obj, what in _hidden_holders(shell):
        holders.append((ref, obj, {"hidden": True, "where": "held by IPython: " + what}))
    rows, total = _rows_from(holders, all_devices)
    return rows, total


# ---------------------------------------------------------------------------
# The magics' data


def summary_data():
    fws = frameworks()
    data = {"kind": "summary", "schema": SCHEMA, "pid": os.getpid(), "frameworks": fws}
    drv = driver_usage()
    if drv is not None:
        data["driver"] = drv
    else:
        data["driver_hint"] = _DRIVER_HINT
    active = any(fw.get("state") == "active" for fw in fws)
    if active:
        note = "The CUDA context (about 0.5 GiB per GPU used) is freed only when the process exits: restart the kernel."
        if drv and not drv.get("error") and drv.get("bytes"):
            held = sum((d.get("held") if d.get("held") is not None else d.get("used") or 0) for fw in fws for d in fw.get("devices", []))
            other = drv["bytes"] - held
            if other > 0:
                note = (
                    "%s of the driver's figure is not framework memory: the CUDA context and libraries' "
                    "workspaces; only a kernel restart frees it." % fmt_bytes(other)
                )
        data["context_note"] = note
    try:
        hid_rows, _ = _rows_from(
            [(ref, obj, {"hidden": True}) for ref, obj, _w in _hidden_holders(_shell)], False
        )
        # Hidden bytes that no user variable also holds.
        user_keys = set()
        for _n, v in _user_vars(_shell):
            for key, _b, _d in _holdings(v)[0]:
                user_keys.add(key)
        hb, refs = 0, []
        for ref, obj, _w in _hidden_holders(_shell):
            extra = 0
            for key, n, dev in _holdings(obj)[0]:
                if _is_gpu(dev) and key not in user_keys:
                    user_keys.add(key)
                    extra += n
            if extra:
                hb += extra
                refs.append(ref)
        del hid_rows
        if hb:
            data["hidden"] = {"bytes": hb, "refs": refs}
    except Exception:
        pass
    data["advice"] = _advice(data)
    return data


def _advice(data):
    fws = data.get("frameworks", [])
    for fw in fws:
        if fw["name"] == "jax":
            for d in fw.get("devices", []):
                if os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower() not in ("false", "0") and d.get("held") and d.get("total") and d["held"] >= 0.5 * d["total"]:
                    return (
                        "JAX preallocated %s (75%% of the GPU by default); set XLA_PYTHON_CLIENT_PREALLOCATE=false "
                        "before importing jax (restart the kernel)" % fmt_bytes(d["held"])
                    )
    hid = data.get("hidden") or {}
    if hid.get("bytes", 0) >= _CACHED_ADVICE_MIN:
        return "%s is held only by IPython (%s): `%%gpumem free --all` drops it, or `%%gpumem vars` to see it" % (
            fmt_bytes(hid["bytes"]), ", ".join(hid.get("refs", [])))
    cached = 0
    for fw in fws:
        if fw["name"] in ("torch", "cupy"):
            for d in fw.get("devices", []):
                if d.get("held") is not None:
                    cached += max(0, d["held"] - (d.get("used") or 0))
    if cached >= _CACHED_ADVICE_MIN:
        return "%s is cached but unused: `%%gpumem free` returns it to the GPU" % fmt_bytes(cached)
    for fw in fws:
        if fw["name"] == "tensorflow" and fw.get("state") == "active":
            return "TensorFlow returns GPU memory only when the process exits: restart the kernel to free it"
    return None


_VARS_ROWS = 100  # rows shown; a notebook with thousands of tensors gets a summary line


def vars_data(all_devices=False):
    rows, total = scan_vars(all_devices)
    user = [r for r in rows if not r.get("hidden")]
    hidden = [r for r in rows if r.get("hidden")]
    data = {"kind": "vars", "schema": SCHEMA, "all_devices": bool(all_devices), "rows": user[:_VARS_ROWS] + hidden,
            "total_bytes": total, "variables": len(user)}
    if len(user) > _VARS_ROWS:
        cut = user[_VARS_ROWS:]
        data["more"] = {"rows": len(cut), "bytes": sum(r["bytes"] for r in cut)}
    if not any(_mod(m) for m in ("torch", "cupy", "jax")):
        data["notes"] = ["No PyTorch, CuPy or JAX is loaded in this kernel."]
    return data


def _empty_caches(all_, notes):
    gc.collect()
    torch = _mod("torch")
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
            notes.append("PyTorch: empty_cache failed: %s" % _short_exc(e))
    cp = _mod("cupy")
    if cp is not None:
        try:
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()
        except Exception as e:
            notes.append("CuPy: free_all_blocks failed: %s" % _short_exc(e))
    jax = _mod("jax")
    if jax is not None and _jax_initialised():
        try:
            jax.clear_caches()
        except Exception as e:
            notes.append("JAX: clear_caches failed: %s" % _short_exc(e))
        if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "") != "platform":
            notes.append(
                "JAX's allocator keeps freed memory in its pool for reuse; only XLA_PYTHON_CLIENT_ALLOCATOR=platform "
                "(set before importing jax) returns it to the GPU."
            )
    if _mod("tensorflow") is not None:
        if all_:
            keras = _mod("keras") or _mod("tf_keras")
            try:
                if keras is not None:
                    keras.backend.clear_session()
                    notes.append("TensorFlow: ran keras.backend.clear_session().")
            except Exception as e:
                notes.append("TensorFlow: clear_session failed: %s" % _short_exc(e))
        notes.append("TensorFlow keeps its GPU memory until the process exits: only a kernel restart returns it.")


def _fw_before_after(before, after):
    b, a = _flat(before), _flat(after)
    out = []
    for key in sorted(set(b) | set(a), key=lambda k: ([x["name"] for x in before] + [x["name"] for x in after] + [k[0]]).index(k[0])):
        x, y = b.get(key, {}), a.get(key, {})
        lab = x.get("label") or y.get("label")
        out.append({
            "name": key[0], "label": lab, "device": key[1],
            "before": {"used": x.get("used", 0), "held": x.get("held") if x else 0},
            "after": {"used": y.get("used", 0), "held": y.get("held") if y else 0},
        })
    return out


def _parse_free_args(args):
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
            keep += [x for x in a[len("--keep="):].split(",") if x]
        elif a.startswith("-"):
            raise ValueError("unknown option %s (see %%gpumem help)" % a)
        else:
            mode += [x for x in a.split(",") if x]
    return names, keep, opts


def free_data(names=(), all_=False, keep=(), dry_run=False, all_devices=False):
    """Frees the named variables (or, with all_, every variable holding GPU
    memory but keep), IPython's hidden references to them, then the caches.
    With no names and not all_: caches only. Never raises."""
    t0 = time.perf_counter()
    shell = _shell
    names, keep = list(dict.fromkeys(names)), list(keep)
    data = {"kind": "free", "schema": SCHEMA, "dry_run": bool(dry_run), "all": bool(all_)}
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
    before = frameworks()
    drv_before = driver_usage(fresh=True) if not dry_run else None

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
                held = _holders_of([r() for r in still], shell)
                if held:
                    d["held_by"] = held
        del alive
        after = frameworks()
        data["frameworks"] = _fw_before_after(before, after)
        if drv_before is not None:
            drv_after = driver_usage(fresh=True)
            if not drv_before.get("error") and drv_after and not drv_after.get("error"):
                data["driver"] = {"before": drv_before["bytes"], "after": drv_after["bytes"]}
    else:
        data["frameworks"] = _fw_before_after(before, before)
        cached = sum(
            max(0, (d.get("held") or 0) - (d.get("used") or 0))
            for fw in before if fw["name"] in ("torch", "cupy") for d in fw.get("devices", [])
        )
        if cached:
            notes.append("would also return %s of cached memory to the GPU" % fmt_bytes(cached))
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
        for n, v in _user_vars(shell):
            if n in keep or n in targets:
                continue
            sts = _holdings(v)[0]
            if any(all_devices or _is_gpu(dev) for _k, _n, dev in sts):
                targets[n] = v
    keys = set()
    deleted = []
    for n, v in targets.items():
        sts, tname, _ = _holdings(v)
        seen = {}
        for key, b, dev in sts:
            seen.setdefault(key, (b, dev))
            keys.add(key)
        devs = sorted(set(d for _, d in seen.values()))
        deleted.append({"name": n, "type": tname or type(v).__name__, "device": "+".join(devs) or "-",
                        "bytes": sum(b for b, _ in seen.values())})
    deleted.sort(key=lambda d: (-d["bytes"], d["name"]))
    ids = set(id(v) for v in targets.values())
    # Kept variables' storages: a hidden reference to memory a kept variable
    # also holds is left alone (dropping it would free nothing).
    hidden = []
    report = []
    for ref, obj, what in _hidden_holders(shell):
        sts = _holdings(obj)[0]
        hit = id(obj) in ids or any(k in keys for k, _b, _d in sts)
        gpu = [(k, b) for k, b, dev in sts if all_devices or _is_gpu(dev)]
        if hit or (all_ and gpu):
            hidden.append((ref, obj, what))
            report.append({"ref": ref, "what": what, "action": "drop",
                           "bytes": sum(b for _k, b in dict(gpu).items()) if gpu else 0})
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
        _holdings(v, leaves)
        refs = []
        for leaf in leaves or [v]:
            try:
                refs.append(weakref.ref(leaf))
            except TypeError:
                pass
        alive[n] = refs
    ids = set(id(v) for v in plan["targets"].values())
    for ref, obj, what in plan["hidden"]:
        try:
            _drop_hidden(shell, ref, obj, ids)
        except Exception as e:
            notes.append("could not drop %s: %s" % (ref, _short_exc(e)))
    hiddens = [getattr(shell, "user_ns_hidden", {})]
    try:
        hiddens += [m.__dict__ for m in shell._main_mod_cache.values()]
    except Exception:
        pass
    for n, v in list(plan["targets"].items()):
        if ns.get(n, _MISSING) is v:
            del ns[n]
        for d in hiddens:
            for k in [k for k, o in d.items() if o is v]:
                del d[k]
    plan["targets"].clear()
    plan["hidden"] = []
    return alive


def _drop_hidden(shell, ref, obj, ids):
    ns = shell.user_ns
    if isinstance(obj, _FrameLocals):
        # ref is a traceback label; find its frame again and clear it.
        for fr, label in _traceback_frames(shell):
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
                if d.get("_%s" % k, _MISSING) is obj:
                    del d["_%s" % k]
    for u in ("_", "__", "___"):
        for d in (ns, hidden_ns):
            if d.get(u, _MISSING) is obj:
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


def _holders_of(objs, shell):
    """Names of user variables (one level deep) that hold any of objs' storages."""
    keys = set()
    ids = set(id(o) for o in objs)
    for o in objs:
        for k, _b, _d in _holdings(o)[0]:
            keys.add(k)
    names = []
    for n, v in _user_vars(shell):
        if id(v) in ids:
            names.append(n)
            continue
        for k, _b, _d in _holdings(v)[0]:
            if k in keys:
                names.append(n)
                break
    for ref, obj, _w in _hidden_holders(shell):
        if id(obj) in ids or any(k in keys for k, _b, _d in _holdings(obj)[0]):
            names.append(ref)
    return names


# ---------------------------------------------------------------------------
# %%gpumem: a cell's memory


def _reset_peaks(notes):
    torch = _mod("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                for i in range(torch.cuda.device_count()):
                    torch.cuda.reset_peak_memory_stats(i)
        except Exception as e:
            notes.append("PyTorch: could not reset peak counters: %s" % _short_exc(e))
    tf = _mod("tensorflow")
    if tf is not None and _tf_initialised():
        try:
            for ld in tf.config.list_logical_devices("GPU"):
                tf.config.experimental.reset_memory_stats(ld.name)
        except Exception as e:
            notes.append("TensorFlow: could not reset peak counters: %s" % _short_exc(e))


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


def cell_magic(cell):
    shell = _shell
    notes = []
    before = frameworks()
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
    after = frameworks()
    rows = _fw_before_after(before, after)
    peaks = {(fw["name"], d["device"]): d.get("peak") for fw in after for d in fw.get("devices", [])}
    for r in rows:
        r["peak"] = peaks.get((r["name"], r["device"]))
        if r["name"] == "jax" and r["peak"] is not None:
            notes.append("JAX's peak is since the process started: it has no reset.")
    if any(r["name"] == "cupy" for r in rows):
        notes.append("CuPy keeps no peak counter: its peak is not shown.")
    data = {"kind": "cell", "schema": SCHEMA, "frameworks": rows, "elapsed_ms": int(elapsed * 1000),
            "notes": sorted(set(notes), key=notes.index)}
    _show(data)
    return value


# ---------------------------------------------------------------------------
# gpumem serve's view: %gpumem top and the notebook alerts.


def top_data(timeout=1.0):
    """The notebooks (or, in shared mode, the users) holding memory on the
    GPUs this kernel uses, from gpumem serve."""
    if not (_config.get("sidecar_socket") or os.environ.get("GPUMEM_SOCKET")):
        return {"kind": "top", "error": "%gpumem top needs the sidecar: run `gpumem serve` beside Jupyter"}
    import json

    mine = driver_usage(timeout)
    if mine is None or mine.get("error"):
        return {"kind": "top", "error": (mine or {}).get("error", "gpumem serve did not answer")}
    my_gpus = {g["index"] for g in mine.get("per_gpu", []) if g.get("bytes")}
    status, body = _sidecar_get("/api/v1/notebooks", timeout)
    gpus, note = [], ""
    if status == 200:
        rep = json.loads(body.decode("utf-8"))
        for g in rep.get("gpus") or []:
            if g.get("index") not in my_gpus:
                continue
            holders = []
            for nb in rep.get("notebooks") or []:
                for pg in nb.get("per_gpu") or []:
                    if pg.get("index") == g.get("index") and pg.get("bytes"):
                        holders.append({"name": nb.get("notebook") or "kernel " + nb.get("kernel_id", "")[:8],
                                        "user": nb.get("user", ""), "bytes": int(pg["bytes"]),
                                        "self": nb.get("kernel_id") == _config.get("kernel_id")})
            for o in rep.get("other") or []:
                for pg in o.get("per_gpu") or []:
                    if pg.get("index") == g.get("index") and pg.get("bytes"):
                        holders.append({"name": "pid %s: %s" % (o.get("pid"), (o.get("command") or "")[:60]),
                                        "user": o.get("user", ""), "bytes": int(pg["bytes"])})
            holders.sort(key=lambda h: -h["bytes"])
            gpus.append({"index": g.get("index"), "name": g.get("name", ""), "used": g.get("memory_used_bytes", 0),
                         "total": g.get("memory_total_bytes", 0), "holders": holders})
    elif status == 403:
        # Shared mode: a kernel may see per-user totals, not others' notebooks.
        s2, b2 = _sidecar_get("/api/v1/users", timeout)
        s3, b3 = _sidecar_get("/api/v1/gpus", timeout)
        if s2 != 200 or s3 != 200:
            return {"kind": "top", "error": "gpumem serve answered %d" % (s2 if s2 != 200 else s3)}
        users = json.loads(b2.decode("utf-8")).get("users") or []
        for g in json.loads(b3.decode("utf-8")).get("gpus") or []:
            if g.get("index") not in my_gpus:
                continue
            holders = []
            for u in users:
                for pg in u.get("per_gpu") or []:
                    if pg.get("index") == g.get("index") and pg.get("bytes"):
                        holders.append({"name": "user %s (%d notebook%s)" % (u.get("user"), u.get("notebooks", 0),
                                                                               "" if u.get("notebooks", 0) == 1 else "s"),
                                        "user": u.get("user", ""), "bytes": int(pg["bytes"])})
            holders.sort(key=lambda h: -h["bytes"])
            gpus.append({"index": g.get("index"), "name": g.get("name", ""), "used": g.get("memory_used_bytes", 0),
                         "total": g.get("memory_total_bytes", 0), "holders": holders})
        note = "gpumem serve runs in shared mode: other users' notebooks are shown as per-user totals."
    else:
        return {"kind": "top", "error": "gpumem serve answered %d: %s" % (status, _api_error(body))}
    return {"kind": "top", "gpus": gpus, "note": note}


def _sidecar_get(path, timeout):
    import http.client
    import socket

    sock = _config.get("sidecar_socket") or os.environ.get("GPUMEM_SOCKET")

    class _UnixConn(http.client.HTTPConnection):
        def connect(self):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect(sock)
            except BaseException:
                s.close()
                raise
            self.sock = s

    conn = _UnixConn("local-gpumem.sock", timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except Exception as e:
        return 0, str(e).encode()
    finally:
        conn.close()


_alert_state = {"mtime": None, "shown": set()}


def _alert_file():
    f = _config.get("alert_file")
    if f:
        return f
    sock = _config.get("sidecar_socket") or os.environ.get("GPUMEM_SOCKET")
    return os.path.join(os.path.dirname(sock), "gpumem-alerts.json") if sock else None


def alert_hook(*_args):
    """pre_run_cell: prints, once per alert, gpumem serve's line about a GPU
    this kernel uses being nearly full. It costs one stat() per cell; it
    never raises into the user's cell."""
    try:
        path = _alert_file()
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == _alert_state["mtime"]:
            return
        _alert_state["mtime"] = mtime
        import json

        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        kid = _config.get("kernel_id")
        for a in doc.get("alerts") or []:
            aid = a.get("id")
            if aid in _alert_state["shown"] or (kid and kid not in (a.get("kernels") or [])):
                continue
            _alert_state["shown"].add(aid)
            print("gpumem: " + str(a.get("message", "")))
    except Exception:
        pass


# ---------------------------------------------------------------------------
# Glue: the magic, display, install/uninstall


def _show(data):
    try:
        text, html = render(data)
    except Exception as e:
        data = {"kind": "error", "message": "rendering failed: %s" % _short_exc(e)}
        text, html = render(data)
    from IPython.display import display

    display({"text/plain": text, "text/html": html, MIME: data}, raw=True)


_USAGE = "usage: %gpumem [vars [--all-devices] | free [NAME ...] [--all] [--keep NAME ...] [--dry-run] | help]"


def gpumem(line="", cell=None):
    """%gpumem: GPU memory of this kernel. `%gpumem help` lists the commands."""
    saved = _save_last()
    try:
        if cell is not None:
            if line.strip():
                _show({"kind": "error", "message": "%%gpumem takes no arguments on its first line"})
                return None
            return cell_magic(cell)
        args = line.split()
        cmd = args[0] if args else ""
        if cmd == "":
            _show(summary_data())
        elif cmd == "vars":
            rest = [a for a in args[1:] if a != "--all-devices"]
            if rest:
                _show({"kind": "error", "message": "unexpected %s; %s" % (" ".join(rest), _USAGE)})
            else:
                _show(vars_data("--all-devices" in args[1:]))
        elif cmd == "free":
            try:
                names, keep, opts = _parse_free_args(args[1:])
            except ValueError as e:
                _show({"kind": "free", "schema": SCHEMA, "error": str(e)})
                return None
            _show(free_data(names, opts["all"], keep, opts["dry_run"], opts["all_devices"]))
        elif cmd == "top":
            _show(top_data())
        elif cmd in ("help", "-h", "--help"):
            _show({"kind": "help", "version": VERSION})
        else:
            _show({"kind": "error", "message": "unknown command %r; %s" % (cmd, _USAGE)})
    except Exception as e:
        _show({"kind": "error", "message": "gpumem failed: %s" % _short_exc(e)})
    finally:
        if cell is None:
            _restore_last(saved)
    return None


def _save_last():
    return {n: sys.__dict__.get(n, _MISSING) for n in _LAST_NAMES}


def _restore_last(saved):
    """Puts sys.last_* back unless %gpumem free deliberately dropped them."""
    for n, v in saved.items():
        cur = sys.__dict__.get(n, _MISSING)
        if cur is v:
            continue
        if v is _MISSING:
            try:
                delattr(sys, n)
            except AttributeError:
                pass
        else:
            setattr(sys, n, v)


def configure(shell, config):
    """Binds this module to shell and the Go side's config, registering nothing."""
    global _shell, _config, VERSION
    _shell = shell
    _config = dict(config or {})
    VERSION = _config.get("version", VERSION)


def install(shell, config):
    """Registers the magics in shell. Called by the bootstrap."""
    configure(shell, config)
    shell.register_magic_function(gpumem, "line_cell", "gpumem")
    if _config.get("notebook_alerts"):
        shell.events.register("pre_run_cell", alert_hook)


def uninstall():
    """Removes what install() registered (the bootstrap calls it on an old
    version before installing a new one)."""
    shell = _shell
    if shell is None:
        return
    try:
        if alert_hook in shell.events.callbacks.get("pre_run_cell", []):
            shell.events.unregister("pre_run_cell", alert_hook)
    except Exception:
        pass
    try:
        mm = shell.magics_manager
        for kind in ("line", "cell"):
            fn = mm.magics[kind].get("gpumem")
            if fn is not None and getattr(fn, "__module__", None) in (MODULE_NAME, __name__):
                del mm.magics[kind]["gpumem"]
    except Exception:
        pass


class JSONResult(object):
    """What gpumem reads back through user_expressions: _repr_json_ only."""

    def __init__(self, data):
        self.data = data

    def _repr_json_(self):
        return self.data

    def __repr__(self):
        return "<gpumem result>"


def api_free(opts):
    """`gpumem free KERNEL`: runs free_data for the Go side."""
    return free_data(
        opts.get("vars") or (),
        bool(opts.get("all")),
        opts.get("keep") or (),
        bool(opts.get("dry_run")),
        bool(opts.get("all_devices")),
    )


def api_status():
    return {
        "kind": "status", "schema": SCHEMA, "version": VERSION, "pid": os.getpid(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "frameworks_loaded": [m for m in ("torch", "cupy", "jax", "tensorflow") if m in sys.modules],
    }

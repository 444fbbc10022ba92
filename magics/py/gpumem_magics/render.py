"""Renders a data dict (kind summary, vars, free, cell, help, top, error;
why and children in render_why.py; oom, record and snapshot in
render_oom.py) as text/plain and text/html. Pure: the data dict is all it
reads, so the renderings are deterministic; `gpumem free` prints the same
text."""

from . import layout, render_oom, render_why, units


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
        "why": render_why.render_why,
        "children": render_why.render_children,
        "error": _render_error,
        "oom": render_oom.render_oom,
        "record": render_oom.render_record,
        "snapshot": render_oom.render_snapshot,
    }.get(kind, _render_error)
    return fn(data)


def _gpu_work(util, compute):
    """The line on this kernel's work on its GPUs (children included), as
    gpumem serve judged it: unknown is said, never shown as 0."""
    if util is None:
        line = "GPU work: unknown (the GPU does not report per-process utilization: MIG, or an older driver)"
    else:
        line = "GPU work (NVML): %d%% SM, %d%% memory busy" % (util.get("sm_percent", 0), util.get("memory_percent", 0))
    if compute and not (util is None and compute.get("state") == "unknown"):
        line += "; %s" % compute.get("state", "unknown")
        hoarded = compute.get("hoarded_gib_hours")
        if hoarded:
            line += "; held while computing nothing: %.1f GiB·h in the last 24 h" % hoarded
    return ("", line)


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
            of = (" of " + units.fmt_bytes(d["total"])) if d.get("total") else ""
            cells = [
                d.get("device", "?"),
                fw.get("label", fw.get("name", "?")),
                units.fmt_bytes(used),
                "-" if cached is None else units.fmt_bytes(cached),
                "-" if held is None else units.fmt_bytes(held),
                "-" if d.get("peak") is None else units.fmt_bytes(d["peak"]),
            ]
            trows.append(cells + [layout.text_bar(used, held, scale) + of])
            hrows.append(
                cells
                + [("html", layout.html_bar(used, held, scale) + ('<span class="dim">%s</span>' % layout.esc(of) if of else ""))]
            )
        header = ["device", "framework", "in use", "cached", "held", "peak", "in use ▮ / cached ▮"]
        text += layout.pad(trows, header[:-1] + ["in use █ / cached ▒"])
        hbody.append(layout.html_table(header, hrows, numeric=(2, 3, 4, 5)))
    notes = []
    for fw in data.get("frameworks", []):
        if fw.get("message"):
            notes.append("%s: %s" % (fw.get("label", fw.get("name")), fw["message"]))
    if not rows and not notes:
        notes.append("No GPU framework (PyTorch, CuPy, JAX, TensorFlow) is loaded in this kernel.")
    elif not rows:
        notes.append("No framework holds GPU memory in this kernel.")
    text += notes
    hbody.append(layout.html_lines(notes, "dim"))
    extra = []
    drv = data.get("driver")
    if drv:
        if drv.get("error"):
            extra.append(("warn", "driver: %s" % drv["error"]))
        elif drv.get("no_gpu"):
            # Without a GPU there is no figure: 0 B, or a GPU that cannot
            # report its utilization, would say something false.
            extra.append(("warn", "GPU n/a: " + drv["no_gpu"]))
        else:
            per = ", ".join("GPU %s: %s" % (g.get("index"), units.fmt_bytes(g.get("bytes"))) for g in drv.get("per_gpu", []))
            pids = ", ".join(str(p) for p in drv.get("pids", []))
            extra.append(
                (
                    "",
                    "driver (NVML, via gpumem serve): %s for this kernel%s%s"
                    % (units.fmt_bytes(drv.get("bytes")), (" (" + per + ")") if per else "", ("; pids " + pids) if pids else ""),
                )
            )
            if "utilization" in drv:
                extra.append(_gpu_work(drv.get("utilization"), drv.get("compute")))
            if drv.get("simulated"):
                extra.append(("dim", drv["simulated"]))
    elif data.get("driver_hint"):
        extra.append(("dim", data["driver_hint"]))
    for sc in (drv or {}).get("stray_contexts") or []:
        extra.append(("warn", render_why.stray_line(sc)))
    if data.get("context_note"):
        extra.append(("dim", data["context_note"]))
    hid = data.get("hidden") or {}
    if hid.get("bytes"):
        extra.append(
            (
                "warn",
                "held only by IPython: %s (%s)" % (units.fmt_bytes(hid["bytes"]), ", ".join(hid.get("refs", []))),
            )
        )
    if data.get("advice"):
        extra.append(("warn", "advice: " + data["advice"]))
    if extra:
        text.append("")
        text += [x[1] for x in extra]
        hbody.append("".join('<div class="%s">%s</div>' % (c, layout.esc(s)) for c, s in extra))
    return "\n".join(text), layout.html_doc(title, "".join(hbody))


def _render_vars(data):
    scope = "all devices" if data.get("all_devices") else "GPU memory only; --all-devices adds CPU"
    title = "gpumem vars: variables holding memory (%s)" % scope
    text = [title, ""]
    rows = data.get("rows", [])
    if not rows:
        msg = "No variable holds %s." % ("tensors or arrays" if data.get("all_devices") else "GPU memory")
        text.append(msg)
        body = layout.html_lines([msg], "dim")
    else:
        big = max(r.get("bytes", 0) for r in rows) or 1
        trows, hrows = [], []
        for r in rows:
            note = _var_note(r)
            trows.append(
                [
                    r["name"],
                    r.get("type", "?"),
                    r.get("device", "?"),
                    units.fmt_bytes(r.get("bytes")),
                    layout.text_bar(r.get("bytes"), r.get("bytes"), big, 12),
                    note,
                ]
            )
            hrows.append(
                [
                    r["name"],
                    r.get("type", "?"),
                    r.get("device", "?"),
                    units.fmt_bytes(r.get("bytes")),
                    ("html", layout.html_bar(r.get("bytes"), r.get("bytes"), big)),
                    note,
                ]
            )
        header = ["name", "type", "device", "bytes", "", "note"]
        text += layout.pad(trows, header)
        body = layout.html_table(header, hrows, numeric=(3,))
    foot = []
    more = data.get("more")
    if more:
        foot.append(
            "... and %d more variables holding %s (not shown; total below counts them)"
            % (more["rows"], units.fmt_bytes(more["bytes"]))
        )
    total = data.get("total_bytes", 0)
    nvars = data.get("variables", sum(1 for r in rows if not r.get("hidden")))
    holders = "%d variable%s" % (nvars, "" if nvars == 1 else "s")
    if any(r.get("hidden") for r in rows):
        holders = (holders + " and " if nvars else "") + "IPython's hidden references"
    foot.append("total: %s held by %s (shared storage counted once)" % (units.fmt_bytes(total), holders))
    foot += data.get("notes", [])
    text += [""] + foot
    body += layout.html_lines(foot, "dim")
    return "\n".join(text), layout.html_doc(title, body)


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
        title = "gpumem free: emptied the caches; no variable was touched"
    else:
        title = "gpumem free"
    text = [title, ""]
    body = []
    if data.get("error"):
        text.append("error: " + data["error"])
        body.append('<div class="err">%s</div>' % layout.esc("error: " + data["error"]))
        return "\n".join(text), layout.html_doc(title, "".join(body))
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
            rows.append([d["name"], d.get("type", "?"), d.get("device", "?"), units.fmt_bytes(d.get("bytes")), status])
        text.append(verb + ":")
        text += [
            "  " + x for x in layout.pad(rows, ["name", "type", "device", "bytes", "status" if not data.get("dry_run") else ""])
        ]
        body.append(
            "<div>%s:</div>" % layout.esc(verb)
            + layout.html_table(["name", "type", "device", "bytes", "status"], rows, numeric=(3,))
        )
    elif not data.get("cache_only"):
        msg = "no variable to delete"
        text.append(msg)
        body.append(layout.html_lines([msg], "dim"))
    hid = data.get("hidden", [])
    if hid:
        hverb = "would drop" if data.get("dry_run") else "dropped"
        lines = []
        for h in hid:
            if h.get("action") == "kept":
                lines.append(
                    "kept %s (%s)%s"
                    % (h["ref"], h.get("what", ""), (": " + units.fmt_bytes(h["bytes"])) if h.get("bytes") else "")
                )
            else:
                lines.append("%s %s (%s)" % (hverb, h["ref"], h.get("what", "")))
        text.append("IPython's hidden references:")
        text += ["  " + x for x in lines]
        body.append("<div>IPython's hidden references:</div>" + layout.html_lines(["  " + x for x in lines]))
    fws = data.get("frameworks", [])
    if fws:
        rows = []
        for f in fws:
            b, a = f.get("before", {}), f.get("after", {})
            ret = None
            if b.get("held") is not None and a.get("held") is not None:
                ret = b["held"] - a["held"]
            rows.append(
                [
                    f.get("label", f.get("name", "?")),
                    f.get("device", "?"),
                    "%s / %s" % (units.fmt_bytes(b.get("used")), units.fmt_bytes(b.get("held"))),
                    "%s / %s" % (units.fmt_bytes(a.get("used")), units.fmt_bytes(a.get("held"))),
                    "-" if ret is None else units.fmt_bytes(ret),
                ]
            )
        header = ["framework", "device", "before (in use / held)", "after (in use / held)", "returned to GPU"]
        if text[-1]:
            text.append("")
        text += layout.pad(rows, header)
        body.append(layout.html_table(header, rows, numeric=(2, 3, 4)))
    else:
        msg = "No framework held GPU memory before or after."
        if text[-1]:
            text.append("")
        text.append(msg)
        body.append(layout.html_lines([msg], "dim"))
    drv = data.get("driver")
    if drv and drv.get("before") is not None and drv.get("after") is not None:
        line = "driver (NVML): %s -> %s for this kernel (%s)" % (
            units.fmt_bytes(drv["before"]),
            units.fmt_bytes(drv["after"]),
            units.fmt_delta(drv["after"] - drv["before"]),
        )
        text.append(line)
        body.append(layout.html_lines([line]))
    notes = list(data.get("notes", []))
    if data.get("elapsed_ms") is not None:
        notes.append("took " + units.fmt_duration(data["elapsed_ms"] / 1000.0))
    if notes:
        text.append("")
        text += notes
        body.append(layout.html_lines(notes, "dim"))
    return "\n".join(text), layout.html_doc(title, "".join(body))


def _render_cell(data):
    title = "gpumem: this cell's GPU memory"
    text = [title, ""]
    body = []
    rows = []
    for f in data.get("frameworks", []):
        b, a = f.get("before", {}), f.get("after", {})
        du = None if a.get("used") is None or b.get("used") is None else a["used"] - b["used"]
        dh = None if a.get("held") is None or b.get("held") is None else a["held"] - b["held"]
        rows.append(
            [
                f.get("label", "?"),
                f.get("device", "?"),
                units.fmt_delta(du),
                units.fmt_delta(dh),
                "-" if f.get("peak") is None else units.fmt_bytes(f["peak"]),
                units.fmt_bytes(a.get("used")),
                "-" if a.get("held") is None else units.fmt_bytes(a.get("held")),
            ]
        )
    if rows:
        header = ["framework", "device", "Δ in use", "Δ held", "peak in use", "in use now", "held now"]
        text += layout.pad(rows, header)
        body.append(layout.html_table(header, rows, numeric=(2, 3, 4, 5, 6)))
    else:
        msg = "No framework held GPU memory before or after the cell."
        text.append(msg)
        body.append(layout.html_lines([msg], "dim"))
    notes = list(data.get("notes", []))
    if data.get("elapsed_ms") is not None:
        notes.append("cell ran " + units.fmt_duration(data["elapsed_ms"] / 1000.0))
    if notes:
        text += [""] + notes
        body.append(layout.html_lines(notes, "dim"))
    return "\n".join(text), layout.html_doc(title, "".join(body))


_HELP = [
    ("%gpumem", "this kernel's GPU memory per device and framework, the driver's figure, advice"),
    ("%gpumem vars [--all-devices]", "variables holding GPU memory, largest first (--all-devices: CPU tensors too)"),
    ("%gpumem free NAME ...", "delete the variables, drop IPython's hidden references to them, empty the caches"),
    ("%gpumem free --all [--keep NAME ...]", "delete every variable holding GPU memory except --keep, and hidden references"),
    ("%gpumem free", "only empty the frameworks' caches (gc + empty_cache); no variable is touched"),
    ("%gpumem free ... --dry-run", "show what would be deleted and dropped; free nothing"),
    ("%%gpumem", "(first line of a cell) run the cell, report its change in memory and its peak"),
    ("%gpumem top", "the notebooks and processes sharing this kernel's GPUs, biggest first (needs gpumem serve)"),
    (
        "%gpumem why [--device N] [--all-devices] [--budget S]",
        "every byte of this kernel's GPU memory in one row, with who holds it and the fix",
    ),
    (
        "%gpumem free --children [--pid N,...]",
        "end this kernel's idle GPU-holding worker processes (never the kernel; needs gpumem serve); "
        "--pid ends those workers even though they compute, and only them",
    ),
    ("%gpumem record on [--max-entries N]", "record PyTorch's memory history (off by default; `record off` stops it)"),
    ("%gpumem snapshot", "save PyTorch's memory snapshot (memory_viz's .pickle); gpumem serve draws it in JupyterLab"),
    ("%gpumem help", "this help"),
]


def _render_help(data):
    title = "gpumem magics (injected by gpumem %s)" % data.get("version", "")
    rows = [[a, b] for a, b in _HELP]
    foot = [
        "Hidden references: Out/_oh, _, __, ___, _N, the displayhook, last_execution_result, "
        "sys.last_* and the frames of a saved traceback keep objects alive after `del`.",
        "Only a kernel restart frees the CUDA context (about 0.5 GiB per GPU) and TensorFlow's memory.",
        "A cell that runs out of GPU memory gets a report under its traceback: who holds the GPU, and what would free it.",
    ]
    text = [title, ""] + layout.pad(rows, ["command", "what it does"]) + [""] + foot
    body = layout.html_table(["command", "what it does"], rows) + layout.html_lines(foot, "dim")
    return "\n".join(text), layout.html_doc(title, body)


def _render_top(data):
    title = "gpumem top: who holds the GPUs this kernel uses"
    if data.get("error"):
        return _render_error({"message": data["error"]})
    text, body = [title, ""], []
    for g in data.get("gpus", []):
        total = g.get("total", 0) or 0
        head = "GPU %s  %s  %s / %s used (%.0f%%)" % (
            g.get("index"),
            g.get("name", ""),
            units.fmt_bytes(g.get("used", 0)),
            units.fmt_bytes(total),
            100.0 * (g.get("used", 0) or 0) / total if total else 0.0,
        )
        rows = []
        for h in g.get("holders", []):
            mark = "  <- this kernel" if h.get("self") else ""
            rows.append([h.get("name", ""), h.get("user", ""), units.fmt_bytes(h.get("bytes", 0)) + mark])
        text.append(head)
        text += ["  " + line for line in layout.pad(rows, ["holder", "user", "memory"])] if rows else ["  (nothing listed)"]
        text.append("")
        body.append("<h4>%s</h4>" % layout.esc(head))
        body.append(layout.html_table(["holder", "user", "memory"], rows, numeric=(2,)))
    for note, cls in ((data.get("note"), "dim"), (data.get("simulated"), "dim")):
        if note:
            text.append(note)
            body.append(layout.html_lines([note], cls))
    if data.get("no_gpu"):
        line = "GPU n/a: " + data["no_gpu"]
        text.append(line)
        body.append(layout.html_lines([line], "warn"))
    elif not data.get("gpus"):
        line = "This kernel holds no GPU memory that gpumem serve knows of."
        text.append(line)
        body.append(layout.html_lines([line], "dim"))
    return "\n".join(text).rstrip(), layout.html_doc(title, "".join(body))


def _render_error(data):
    msg = data.get("message") or ("unknown report kind %r" % data.get("kind"))
    title = "gpumem: error"
    return title + ": " + msg, layout.html_doc(title, '<div class="err">%s</div>' % layout.esc(msg))

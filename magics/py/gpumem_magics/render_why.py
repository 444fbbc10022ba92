"""Renders the why and children data dicts (%gpumem why, %gpumem free
--children) as text/plain and text/html. Pure, like render.py, which
dispatches here."""

from . import layout, units

_WHY_LABELS = {
    "variables": "variable",
    "hidden": "IPython",
    "elsewhere": "held elsewhere",
    "c_level": "no Python holder",
    "cache": "cache",
    "untraceable": "untraceable",
    "outside": "outside the allocator",
    "child": "child process",
    "unexplained": "unexplained",
}


def render_why(data):
    title = "gpumem why: where this kernel's memory is (pid %s, %s)" % (data.get("pid", "?"), data.get("scope", ""))
    text, body = [title, ""], []
    rows = data.get("rows", [])
    trows = []
    for r in rows:
        trows.append(
            [
                _WHY_LABELS.get(r.get("category"), r.get("category", "?")),
                r.get("name", ""),
                r.get("device", "-"),
                units.fmt_bytes(r.get("bytes")),
                r.get("fix", ""),
            ]
        )
    header = ["row", "what", "device", "bytes", "fix"]
    if trows:
        lines = layout.pad(trows, header)
        text.append(lines[0])
        for line, r in zip(lines[1:], rows):
            text.append(line)
            if _detail(r):
                text.append("    " + _detail(r))
        hrows = [cells + [_detail(r)] for cells, r in zip(trows, rows)]
        body.append(layout.html_table(header + ["held by"], hrows, numeric=(3,)))
    else:
        msg = "No framework holds %s in this kernel." % ("memory" if data.get("scope") == "all devices" else "GPU memory")
        text.append(msg)
        body.append(layout.html_lines([msg], "dim"))
    foot = []
    total = sum(r.get("bytes") or 0 for r in rows)
    drv = data.get("driver")
    if drv and drv.get("error"):
        foot.append(("warn", "driver: %s" % drv["error"]))
    elif drv:
        foot.append(
            (
                "",
                "rows: %s; the driver's figure for this kernel and its children (NVML, via gpumem serve): %s"
                % (units.fmt_bytes(total), units.fmt_bytes(drv.get("bytes"))),
            )
        )
    else:
        foot.append(("", "rows: %s" % units.fmt_bytes(total)))
        if data.get("driver_hint"):
            foot.append(("dim", data["driver_hint"]))
    for sc in data.get("stray_contexts") or []:
        foot.append(
            ("warn", "GPU %s pid %s: %s: %s %s" % (sc.get("gpu"), sc.get("pid"), sc.get("label"), sc.get("why"), sc.get("avoid")))
        )
    if data.get("stopped"):
        st = data["stopped"]
        foot.append(
            (
                "warn",
                "stopped in %s after %s ms (budget %s s): the rows may miss holders; %%gpumem why --budget 10 looks longer"
                % (st.get("at"), st.get("elapsed_ms"), data.get("budget_s")),
            )
        )
    if data.get("unplaced"):
        foot.append(("warn", unplaced_line(data["unplaced"])))
    for a in data.get("advice") or []:
        foot.append(("warn", a))
    for n in data.get("notes") or []:
        foot.append(("dim", n))
    if data.get("elapsed_ms") is not None:
        foot.append(("dim", "took %d ms" % data["elapsed_ms"]))
    text.append("")
    text += [x[1] for x in foot]
    body.append("".join('<div class="%s">%s</div>' % (c, layout.esc(s)) for c, s in foot))
    return "\n".join(text), layout.html_doc(title, "".join(body))


def unplaced_line(u):
    """The bytes why could not place, per device, and why."""
    devs = ", ".join("%s on %s" % (units.fmt_bytes(d.get("bytes")), d.get("device")) for d in u.get("devices") or [])
    return "not placed: %s: %s" % (devs or "bytes not known", u.get("why", ""))


def stray_line(sc):
    """One stray-context flag as gpumem serve computed it."""
    return "GPU %s pid %s: %s: %s %s" % (sc.get("gpu"), sc.get("pid"), sc.get("label"), sc.get("why"), sc.get("avoid"))


def _detail(r):
    """The line under a row: the chain of what holds it, or its note."""
    chain = r.get("chain") or []
    if r.get("category") == "elsewhere" and len(chain) > 1:
        return "held by %s: %s" % (r.get("holder", "?"), " -> ".join(chain))
    return r.get("note", "")


def render_children(data):
    title = "gpumem free --children: this kernel's worker processes"
    text, body = [title, ""], []
    if data.get("error"):
        return render_error({"message": data["error"]})
    lines = []
    for t in data.get("teardown") or []:
        pids = ", ".join(str(p) for p in t.get("pids") or [])
        lines.append("ran %s%s" % (t.get("what"), (" (pids " + pids + ")") if pids else ""))
    for e in data.get("teardown_errors") or []:
        lines.append("teardown failed: %s" % e)
    rows = []
    for p in data.get("ended") or []:
        rows.append([str(p.get("pid")), p.get("what") or p.get("command", ""), units.fmt_bytes(p.get("bytes")), p.get("how", "")])
    for p in data.get("left") or []:
        rows.append(
            [
                str(p.get("pid")),
                p.get("what") or p.get("command", ""),
                units.fmt_bytes(p.get("bytes")),
                "left: " + p.get("reason", ""),
            ]
        )
    text += lines
    body.append(layout.html_lines(lines))
    if rows:
        header = ["pid", "process", "GPU memory", "outcome"]
        text += [""] + layout.pad(rows, header)
        body.append(layout.html_table(header, rows, numeric=(2,)))
    else:
        msg = "No child process of this kernel holds GPU memory."
        text.append(msg)
        body.append(layout.html_lines([msg], "dim"))
    running = [left_running_line(p) for p in data.get("left") or [] if p.get("confirm")]
    if running:
        text += [""] + running
        body.append(layout.html_lines(running))
    foot = []
    if data.get("returned_bytes") is not None:
        foot.append(
            "returned to the GPUs: %s (the driver's figure for this kernel: %s -> %s); the kernel itself was left running"
            % (units.fmt_bytes(data["returned_bytes"]), units.fmt_bytes(data.get("before")), units.fmt_bytes(data.get("after")))
        )
    foot += data.get("notes") or []
    text += [""] + foot
    body.append(layout.html_lines(foot, "dim"))
    return "\n".join(text), layout.html_doc(title, "".join(body))


def left_running_line(p):
    """The line for a worker gpumem serve left running for what it
    computes: "left running: pid 1234 python (DataLoader worker 0) computes
    at 90% SM on GPU 0; to end it: %gpumem free --children --pid 1234"."""
    argv = (p.get("command") or "").split()
    name = argv[0].rsplit("/", 1)[-1] if argv else "process"
    if p.get("what"):
        name += " (%s)" % p["what"]
    gpus = p.get("gpus") or []
    on = ("GPUs " if len(gpus) > 1 else "GPU ") + ", ".join(str(g) for g in gpus) if gpus else "a GPU"
    if p.get("compute") == "computing":
        sm = p.get("sm_percent")
        does = "computes at %d%% SM on %s" % (sm, on) if sm else "computes on %s" % on
        if sm == 0:
            does += " (0% SM just now)"
    else:
        does = "holds %s on %s and whether it computes is unknown" % (units.fmt_bytes(p.get("bytes")), on)
    return "left running: pid %s %s %s; to end it: %%gpumem free --children --pid %s" % (p.get("pid"), name, does, p.get("pid"))


def render_error(data):
    msg = data.get("message") or "unknown error"
    title = "gpumem: error"
    return title + ": " + msg, layout.html_doc(title, '<div class="err">%s</div>' % layout.esc(msg))

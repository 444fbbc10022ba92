"""Renders the out-of-memory report (kind "oom") and the data of %gpumem
record and %gpumem snapshot as text/plain and text/html. Pure: the data
dict is all it reads; the holders (their names too), the cache's figure
and the advice are gpumem serve's event's, shown as it sent them (the
kernel's own figures only when no event came)."""

from . import layout, units

_B = units.fmt_bytes


def render_oom(data):
    req = data.get("request") or {}
    ev = data.get("event")
    cell = req.get("cell") or {}
    where = ""
    if cell.get("execution_count"):
        where = " in cell [%s]" % cell["execution_count"]
        if cell.get("line"):
            where += ", line %s" % cell["line"]
        if cell.get("source"):
            where += ": " + cell["source"]
    title = "gpumem: out of memory" + where
    asked = _B(req["requested_bytes"]) if req.get("requested_bytes") else "an unknown amount"
    dev = (req.get("device") or {}).get("ordinal")
    on = " on cuda:%s" % dev if dev is not None else ""
    lines = [("", "asked for %s%s (%s)" % (asked, on, req.get("error") or data.get("label", "")))]
    k = (ev or {}).get("kernel") or req.get("kernel") or {}
    lines.append(("h", "this kernel"))
    cached = k.get("cached_bytes") or 0
    fig = "%s allocated by %s; cached %s" % (_B(k.get("allocated_bytes")), data.get("label", "the framework"), _B(cached))
    if cached:
        fig += " (releasable %s, fragmented %s)" % (_B(k.get("releasable_bytes")), _B(k.get("fragmented_bytes")))
    lines.append(("", fig))
    if k.get("ipython_bytes"):
        tb = " (%s of it in saved tracebacks, this one's included)" % _B(k["traceback_bytes"]) if k.get("traceback_bytes") else ""
        lines.append(
            ("warn", "held only by IPython: %s: %s%s" % (_B(k["ipython_bytes"]), ", ".join(k.get("ipython_refs") or []), tb))
        )
    else:
        lines.append(("dim", "held only by IPython: nothing on a GPU (the traceback pins no GPU memory)"))
    vs = k.get("variables") or []
    if vs:
        more = ", ..." if k.get("variables_truncated") else ""
        lines.append(("", "top holders: " + ", ".join("%s %s" % (v["name"], _B(v["bytes"])) for v in vs[:5]) + more))
    head = "this GPU"
    rows = []
    if ev and ev.get("gpu"):
        g = ev["gpu"]
        head = "GPU %s (%s%s): %s total, %s used, %s free" % (
            g.get("index"),
            g.get("name", ""),
            ", simulated" if g.get("simulated") else "",
            _B(g.get("total_bytes")),
            _B(g.get("used_bytes")),
            _B(g.get("free_bytes")),
        )
        for h in ev.get("holders") or []:
            rows.append([h.get("name") or "?", h.get("user") or "?", _B(h.get("bytes")), _holder_state(h), _holder_pids(h)])
    text = [title, "", lines[0][1], ""] + [t if c == "h" else "  " + t for c, t in lines[1:]]
    body = [layout.html_lines([lines[0][1]])]
    for c, t in lines[1:]:
        body.append(
            '<div class="%s">%s</div>' % (c if c != "h" else "", ("<b>%s</b>" % layout.esc(t)) if c == "h" else layout.esc(t))
        )
    text += ["", head]
    body.append("<div><b>%s</b></div>" % layout.esc(head))
    foot = []
    if ev:
        if rows:
            header = ["holder", "user", "memory", "state", "pids"]
            text += ["  " + x for x in layout.pad(rows, header)]
            body.append(layout.html_table(header, rows, numeric=(2,)))
        elif ev.get("gpu"):
            text.append("  no process holds memory on it")
        else:
            text.append("  gpumem serve could not tell which GPU this was")
        if ev.get("view") == "own" and any(h.get("kind") == "user" for h in ev.get("holders") or []):
            foot.append(("dim", "gpumem serve runs in shared mode: other users are shown as one holder each, their total."))
        if ev.get("advice"):
            foot.append(("warn", "advice: " + ev["advice"]))
    else:
        why = data.get("daemon_error") or (
            "gpumem serve is not running: this is what the kernel alone knows. Who else holds this GPU, and the advice, "
            "need `gpumem serve` beside Jupyter."
        )
        known = "who holds it is unknown to the kernel alone"
        if k.get("device_total_bytes"):
            known = "the driver says: %s total, %s free" % (_B(k["device_total_bytes"]), _B(k.get("device_free_bytes")))
        text.append("  " + known)
        body.append(layout.html_lines([known]))
        foot.append(("warn", why))
    if foot:
        text.append("")
        text += [t for _c, t in foot]
        body.append("".join('<div class="%s">%s</div>' % (c, layout.esc(t)) for c, t in foot))
    return "\n".join(text), layout.html_doc(title, "".join(body))


def _holder_state(h):
    if h.get("state") == "idle" and h.get("idle_seconds"):
        return "idle " + units.fmt_duration(h["idle_seconds"])
    return h.get("state") or ""


def _holder_pids(h):
    return ",".join(str(p) for p in h.get("pids") or [])


def render_record(data):
    title = "gpumem record"
    if data.get("error"):
        return title + ": " + data["error"], layout.html_doc(title, '<div class="err">%s</div>' % layout.esc(data["error"]))
    if data.get("armed") and not data.get("on"):
        msg = (
            "CUDA is not initialised in this kernel yet (gpumem never initialises it): PyTorch's memory history "
            "starts right after the first cell that uses the GPU, that cell's own allocations unrecorded. To record "
            "them too, run torch.cuda.init() first, then `%gpumem record on`."
        )
    elif data.get("on"):
        msg = (
            "PyTorch's memory history is on (the last %s allocator events, with Python stacks): `%%gpumem snapshot` "
            "saves it, and an out-of-memory error saves it by itself; `%%gpumem record off` stops it."
            % format(data.get("max_entries") or 0, ",")
        )
    else:
        msg = "PyTorch's memory history is off (`%gpumem record on [--max-entries N]` turns it on)."
    return title + ": " + msg, layout.html_doc(title, layout.html_lines([msg]))


def render_snapshot(data):
    title = "gpumem snapshot"
    if data.get("error"):
        return title + ": " + data["error"], layout.html_doc(title, '<div class="err">%s</div>' % layout.esc(data["error"]))
    lines = [
        "saved %s (%s in %s): pytorch.org/memory_viz opens it"
        % (data.get("path"), _B(data.get("bytes")), units.fmt_duration(data.get("seconds") or 0.0))
    ]
    if data.get("reason") == "oom":
        lines[0] = "after the out-of-memory error, " + lines[0]
    d = data.get("daemon")
    if d:
        lines.append("gpumem serve is reducing it (snapshot %s): the GPU memory panel in JupyterLab draws it" % d.get("id"))
    elif data.get("daemon_error"):
        lines.append(data["daemon_error"])
    if data.get("note"):
        lines.append(data["note"])
    text = [title, ""] + lines
    return "\n".join(text), layout.html_doc(title, layout.html_lines(lines))

"""Text and HTML building blocks of the renderings: padded columns, bars,
escaped tables. Pure."""

import html as _html


def esc(s):
    return _html.escape(str(s), quote=True)


def pad(rows, header):
    """Left-aligned text columns; the last column is not padded."""
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for r in table:
        cells = [r[i].ljust(widths[i]) if i < len(r) - 1 else r[i] for i in range(len(r))]
        out.append("  ".join(cells).rstrip())
    return out


def text_bar(used, held, scale, width=20):
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


def pct(part, scale):
    if not scale or scale <= 0 or not part:
        return 0.0
    return min(100.0, round(100.0 * part / scale, 1))


def html_bar(used, held, scale):
    if not scale or scale <= 0:
        return ""
    used = used or 0
    held = held if held is not None else used
    pu = pct(used, scale)
    ph = max(0.0, round(pct(held, scale) - pu, 1))
    return (
        '<div class="gpumem-bar" style="width:160px;height:10px;background:#e8e8e8;'
        'border-radius:2px;overflow:hidden;display:flex">'
        '<div style="width:%.1f%%;background:#d9534f"></div>'
        '<div style="width:%.1f%%;background:#f0ad4e"></div></div>' % (pu, ph)
    )


CSS = (
    "<style>.gpumem{font-family:var(--jp-code-font-family,monospace);font-size:12px}"
    ".gpumem table{border-collapse:collapse}"
    ".gpumem th,.gpumem td{padding:2px 8px;text-align:left;vertical-align:middle}"
    ".gpumem td.n{text-align:right}"
    ".gpumem .dim{color:#777}.gpumem .warn{color:#b35900}.gpumem .err{color:#c9302c}"
    "</style>"
)


def html_table(header, rows, numeric=()):
    h = ["<table><thead><tr>"]
    for i, c in enumerate(header):
        h.append("<th%s>%s</th>" % (' class="n"' if i in numeric else "", esc(c)))
    h.append("</tr></thead><tbody>")
    for r in rows:
        h.append("<tr>")
        for i, c in enumerate(r):
            # Cells given as ("html", s) are trusted markup made here.
            if isinstance(c, tuple) and c and c[0] == "html":
                h.append("<td>%s</td>" % c[1])
            else:
                h.append("<td%s>%s</td>" % (' class="n"' if i in numeric else "", esc(c)))
        h.append("</tr>")
    h.append("</tbody></table>")
    return "".join(h)


def html_lines(lines, cls=""):
    return "".join('<div class="%s">%s</div>' % (cls, esc(x)) for x in lines)


def html_doc(title, body):
    return '%s<div class="gpumem"><b>%s</b>%s</div>' % (CSS, esc(title), body)

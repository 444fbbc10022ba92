"""The hub admin page's view (hubadmin.py serves it): the root daemon's
finished report, grouped by the hub's users and servers, with the cull
arbiter's verdict for each server, rendered as HTML. Pure: no I/O, no
clock; every figure and sentence is the report's or hubpolicy's, this
module only places and formats them (units.py, the one format).

A notebook belongs to a hub server as the arbiter places it
(hubpolicy.members): the kernel's user, proven by the daemon, and the
server's URL path. A kernel of a hub user that no server lists is shown
under that user as "not listed by a server"; GPU memory of accounts the
hub does not know (a root job, a system service) is listed apart, so that
every byte on the box is on the page."""

import html
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Optional, Tuple

from . import hubpolicy
from .units import fmt_bytes, fmt_duration


@dataclass(frozen=True)
class NotebookRow:
    name: str  # the report's display_name
    path: str
    kernel_id: str
    connection_file: str
    bytes: int
    per_gpu: Tuple[Tuple[int, int], ...]  # (GPU index, bytes)
    state: str  # the daemon's compute verdict, "" without one
    reason: str
    planned: str  # gpumem's own cull, when one is due: "shutdown at ..."


@dataclass(frozen=True)
class ServerRow:
    name: str  # "" for the default server
    label: str  # "user/name", as the hub and the arbiter's log name it
    ready: bool
    last_activity: Optional[datetime]
    notebooks: Tuple[NotebookRow, ...]
    verdict: Optional[hubpolicy.Decision]  # None: the culler's timeout is not known here


@dataclass(frozen=True)
class UserRow:
    name: str
    admin: bool
    bytes: int
    per_gpu: Tuple[Tuple[int, int], ...]
    other_bytes: int  # in processes outside every kernel
    hoarded_gib_hours: Optional[float]
    servers: Tuple[ServerRow, ...]
    unlisted: Tuple[NotebookRow, ...]  # the user's kernels no server lists


@dataclass(frozen=True)
class GPURow:
    index: int
    name: str
    simulated: bool
    used: int
    total: int
    level: str
    sm_percent: Optional[int]


@dataclass(frozen=True)
class View:
    gpus: Tuple[GPURow, ...] = ()
    users: Tuple[UserRow, ...] = ()
    others: Tuple[Tuple[str, int], ...] = ()  # (account, bytes) the hub does not know
    hoard_window_seconds: int = 0
    error: str = ""  # why the daemon's facts are missing
    as_of: Optional[datetime] = None
    cull_limit: float = 0.0
    notes: Tuple[str, ...] = field(default_factory=tuple)


def _per_gpu(items):
    return tuple((g.get("index", 0), g.get("bytes") or 0) for g in items or [])


def notebook_row(nb, now):
    comp = nb.get("compute") or {}
    act = nb.get("activity") or {}
    planned = ""
    at = hubpolicy.parse_time(act.get("cull_at"))
    if at is not None:
        planned = "%s in %s (%s)" % (
            act.get("cull_action") or "cull",
            fmt_duration(max((at - now).total_seconds(), 0)),
            at.strftime("%H:%M:%S UTC"),
        )
    return NotebookRow(
        name=nb.get("display_name") or nb.get("kernel_id") or "?",
        path=nb.get("notebook") or "",
        kernel_id=nb.get("kernel_id") or "",
        connection_file=nb.get("connection_file") or "",
        bytes=nb.get("gpu_memory_bytes") or 0,
        per_gpu=_per_gpu(nb.get("per_gpu")),
        state=comp.get("state") or "",
        reason=comp.get("reason") or "",
        planned=planned,
    )


def _last_activity(server):
    return hubpolicy.parse_time(server.get("last_activity"))


def build(facts, hub_users, now, cull_limit, rules, system_user=None):
    """The page's view. facts: the arbiter's hubpolicy.Facts (the report,
    each kernel's server URL, what it saw of their idleness); hub_users:
    the hub API's user models (with their servers); now: aware datetime;
    cull_limit: the culler's timeout in seconds (0: unknown, no verdicts);
    rules: the arbiter's hubpolicy.Rules."""
    if facts.error:
        return View(error=facts.error, as_of=now, cull_limit=cull_limit)
    report = facts.report or {}
    account = system_user or (lambda n: n)
    totals = {u.get("user"): u for u in report.get("users") or []}
    hoarding = {h.get("user"): h for h in report.get("hoarding") or []}
    window = max([h.get("window_seconds") or 0 for h in hoarding.values()] or [0])
    users, known = [], set()
    for hu in sorted(hub_users, key=lambda u: u.get("name") or ""):
        name = hu.get("name") or ""
        sysname = account(name)
        known.add(sysname)
        servers, placed_files = [], set()
        for sname, sv in sorted((hu.get("servers") or {}).items()):
            model = dict(sv, name=sname, full_name="%s/%s" % (name, sname))
            _, _, path = hubpolicy.server_identity(model)
            placed, _ = hubpolicy.members(report, facts.server_urls, sysname, path)
            placed_files.update(nb.get("connection_file") for nb in placed)
            last = _last_activity(sv)
            verdict = None
            if cull_limit > 0:
                inactive = now - last if last is not None else None
                verdict = hubpolicy.decide(model, facts, inactive, cull_limit, now, rules, system_user)
            servers.append(
                ServerRow(
                    name=sname,
                    label="%s/%s" % (name, sname),
                    ready=bool(sv.get("ready")),
                    last_activity=last,
                    notebooks=tuple(notebook_row(nb, now) for nb in placed),
                    verdict=verdict,
                )
            )
        unlisted = tuple(
            notebook_row(nb, now)
            for nb in report.get("notebooks") or []
            if nb.get("user") == sysname and nb.get("connection_file") not in placed_files and nb.get("pids")
        )
        tot = totals.get(sysname) or {}
        hoard = hoarding.get(sysname)
        users.append(
            UserRow(
                name=name,
                admin=bool(hu.get("admin")),
                bytes=tot.get("gpu_memory_bytes") or 0,
                per_gpu=_per_gpu(tot.get("per_gpu")),
                other_bytes=tot.get("other_bytes") or 0,
                hoarded_gib_hours=hoard.get("gib_hours") if hoard else tot.get("hoarded_gib_hours"),
                servers=tuple(servers),
                unlisted=unlisted,
            )
        )
    others = tuple(
        (u.get("user") or "?", u.get("gpu_memory_bytes") or 0)
        for u in report.get("users") or []
        if u.get("user") not in known and (u.get("gpu_memory_bytes") or 0) > 0
    )
    gpus = tuple(
        GPURow(
            index=g.get("index", 0),
            name=g.get("name") or "GPU",
            simulated=bool(g.get("simulated")),
            used=g.get("memory_used_bytes") or 0,
            total=g.get("memory_total_bytes") or 0,
            level=g.get("level") or "",
            sm_percent=(g.get("utilization") or {}).get("sm_percent"),
        )
        for g in report.get("gpus") or []
    )
    notes = tuple(w for w in report.get("warnings") or [] if isinstance(w, str))
    return View(
        gpus=gpus,
        users=tuple(users),
        others=others,
        hoard_window_seconds=window,
        as_of=now,
        cull_limit=cull_limit,
        notes=notes,
    )


def to_json(view):
    """The view as JSON-ready data (times in RFC 3339)."""

    def fix(v):
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [fix(x) for x in v]
        return v

    return fix(asdict(view))


def find_notebook(view, user, connection_file, kernel_id):
    """The row of view for a free's target, or None: an action names only
    a kernel the page listed under that user."""
    for u in view.users:
        if u.name != user:
            continue
        rows = [nb for s in u.servers for nb in s.notebooks] + list(u.unlisted)
        for nb in rows:
            if nb.connection_file == connection_file and nb.kernel_id == kernel_id:
                return nb
    return None


def find_server(view, user, server):
    for u in view.users:
        if u.name == user:
            for s in u.servers:
                if s.name == server:
                    return s
    return None


# --- HTML ---

e = html.escape

STYLE = """
:root { color-scheme: light dark; --fg: #1b1f24; --muted: #57606a; --bg: #ffffff; --card: #f6f8fa;
  --line: #d0d7de; --warn: #9a6700; --crit: #cf222e; --ok: #1a7f37; --accent: #0969da; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --muted: #9198a1; --bg: #0d1117; --card: #161b22; --line: #30363d;
    --warn: #d29922; --crit: #f85149; --ok: #3fb950; --accent: #4493f8; } }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 0; padding: 16px 20px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 20px 0 8px; }
.muted { color: var(--muted); } .asof { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; width: 100%; table-layout: auto; }
th, td { text-align: left; vertical-align: top; padding: 6px 8px; border-bottom: 1px solid var(--line);
  overflow-wrap: break-word; }
th { font-weight: 600; color: var(--muted); font-size: 12px; white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; margin: 10px 0; }
.card h3 { font-size: 15px; margin: 0 0 6px; display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: baseline; }
.state-computing { color: var(--ok); font-weight: 600; } .state-idle { color: var(--warn); }
.level-warn { color: var(--warn); } .level-critical { color: var(--crit); font-weight: 600; }
.cull { color: var(--crit); } .keep { color: var(--ok); }
.flash { border: 1px solid var(--accent); border-radius: 8px; padding: 8px 12px; margin: 8px 0; }
.flash.failed { border-color: var(--crit); }
.error { border: 1px solid var(--crit); border-radius: 8px; padding: 8px 12px; }
form.inline { display: inline; margin: 0; }
button { font: inherit; padding: 3px 10px; border-radius: 6px; border: 1px solid var(--line);
  background: var(--bg); color: var(--fg); cursor: pointer; white-space: nowrap; }
button.danger { border-color: var(--crit); color: var(--crit); }
.reason { color: var(--muted); font-size: 12px; display: block; overflow-wrap: anywhere; }
"""


def fmt_gib_hours(v):
    """GiB·h as `gpumem ls --idle` writes them: one decimal below 1000."""
    return ("%.0f GiB·h" if v >= 999.95 else "%.1f GiB·h") % v


def _when(t, now):
    if t is None:
        return "never"
    return "%s ago" % fmt_duration(max((now - t).total_seconds(), 0))


def _gpus(per_gpu):
    return ", ".join("GPU %d: %s" % (i, fmt_bytes(b)) for i, b in per_gpu if b) or "none"


def _state(nb):
    if not nb.state:
        return '<span class="muted">no verdict</span>'
    return '<span class="state-%s">%s</span><span class="reason">%s</span>' % (e(nb.state), e(nb.state), e(nb.reason))


def _form(prefix, xsrf, fields, label, danger=False):
    hidden = "".join('<input type="hidden" name="%s" value="%s">' % (e(k), e(v)) for k, v in fields.items())
    return '<form class="inline" method="post" action="%saction">%s%s<button type="submit"%s>%s</button></form>' % (
        e(prefix),
        xsrf,
        hidden,
        ' class="danger"' if danger else "",
        e(label),
    )


def _notebook_rows(prefix, xsrf, user, rows, server_label):
    out = []
    for nb in rows:
        action = ""
        if nb.bytes:
            action = _form(
                prefix,
                xsrf,
                {"action": "free", "user": user, "kernel_id": nb.kernel_id, "connection_file": nb.connection_file},
                "Free cache…",
            )
        out.append(
            '<tr data-gpumem="notebook" data-kernel="%s" data-bytes="%d"><td><b>%s</b><span class="reason">%s</span></td>'
            '<td>%s</td><td class="num">%s<span class="reason">%s</span></td><td>%s</td><td>%s</td><td>%s</td></tr>'
            % (
                e(nb.kernel_id),
                nb.bytes,
                e(nb.name),
                e(nb.path),
                e(server_label),
                e(fmt_bytes(nb.bytes)),
                e(_gpus(nb.per_gpu)),
                _state(nb),
                e(nb.planned) or '<span class="muted">none</span>',
                action,
            )
        )
    return out


def _verdict(s):
    d = s.verdict
    if d is None:
        return '<span class="muted">the culler\'s timeout is not set here (--cull-timeout)</span>'
    cls = "cull" if d.cull else "keep"
    word = {"veto": "vetoed", "keep": "kept", "culler": "culled at the next round", "gpu-idle": "culled (GPU-idle)"}[d.rule]
    return '<span class="%s">%s</span><span class="reason">%s</span>' % (cls, e(word), e(d.reason))


def _user_card(view, prefix, xsrf, u):
    hoard = "none" if u.hoarded_gib_hours is None else fmt_gib_hours(u.hoarded_gib_hours)
    window = fmt_duration(view.hoard_window_seconds) if view.hoard_window_seconds else "the daemon's window"
    head = (
        '<h3><span>%s%s</span><span class="num">%s on the GPUs</span><span class="muted">%s</span>'
        '<span class="muted">held idle: %s in the last %s</span></h3>'
        % (
            e(u.name),
            " (admin)" if u.admin else "",
            e(fmt_bytes(u.bytes)),
            e(_gpus(u.per_gpu)),
            e(hoard),
            e(window),
        )
    )
    servers = []
    for s in u.servers:
        stop = _form(prefix, xsrf, {"action": "stop", "user": u.name, "server": s.name}, "Stop server…", danger=True)
        servers.append(
            '<tr data-gpumem="server" data-server="%s"><td><b>%s</b><span class="reason">%s</span></td>'
            "<td>%s</td><td>%s</td><td>%s</td></tr>"
            % (
                e(s.label),
                e(s.label),
                "ready" if s.ready else "starting or stopping",
                e(_when(s.last_activity, view.as_of)),
                _verdict(s),
                stop,
            )
        )
    server_table = (
        "<table><tr><th>Server</th><th>Last activity</th><th>The culler's plan</th><th></th></tr>%s</table>" % "".join(servers)
        if servers
        else '<p class="muted">No server running.</p>'
    )
    rows = []
    for s in u.servers:
        rows += _notebook_rows(prefix, xsrf, u.name, s.notebooks, s.label)
    rows += _notebook_rows(prefix, xsrf, u.name, u.unlisted, "not listed by a server")
    nb_table = (
        '<table><tr><th>Notebook</th><th>Server</th><th class="num">GPU memory</th><th>Computes</th>'
        "<th>gpumem's cull</th><th></th></tr>%s</table>" % "".join(rows)
        if rows
        else '<p class="muted">No kernel.</p>'
    )
    other = ""
    if u.other_bytes:
        other = '<p class="muted">%s in processes outside every kernel.</p>' % e(fmt_bytes(u.other_bytes))
    return '<section class="card" data-gpumem="user" data-user="%s">%s%s%s%s</section>' % (
        e(u.name),
        head,
        server_table,
        nb_table,
        other,
    )


def render(view, prefix, xsrf, admin, flash=None):
    """The page. prefix: the service's URL prefix; xsrf: the form field
    tornado writes (xsrf_form_html); flash: (ok, sentence) of the last
    action, or None."""
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name=viewport content="width=device-width, initial-scale=1">',
        "<title>gpumem: the GPU box</title><style>%s</style></head><body>" % STYLE,
        "<h1>GPU memory on this box</h1>",
        '<p class="asof">as of %s · signed in as %s (admin) · <a href="%s">refresh</a></p>'
        % (e(view.as_of.strftime("%H:%M:%S %Z") if view.as_of else "?"), e(admin), e(prefix)),
    ]
    if flash:
        ok, msg = flash
        parts.append('<p class="flash%s" role="status" data-gpumem="flash">%s</p>' % ("" if ok else " failed", e(msg)))
    if view.error:
        parts.append('<p class="error" data-gpumem="error">The gpumem daemon could not be asked: %s</p>' % e(view.error))
        parts.append("</body></html>")
        return "".join(parts)
    rows = []
    for g in view.gpus:
        sm = "?" if g.sm_percent is None else "%d%%" % g.sm_percent
        rows.append(
            '<tr data-gpumem="gpu"><td>GPU %d</td><td>%s%s</td>'
            '<td class="num level-%s">%s of %s</td><td class="num">%s</td></tr>'
            % (
                g.index,
                e(g.name),
                " (simulated)" if g.simulated else "",
                e(g.level),
                e(fmt_bytes(g.used)),
                e(fmt_bytes(g.total)),
                sm,
            )
        )
    parts.append(
        '<h2>GPUs</h2><table><tr><th>GPU</th><th>Model</th><th class="num">Used</th><th class="num">SM</th></tr>%s</table>'
        % "".join(rows)
    )
    parts.append("<h2>Users</h2>")
    if view.cull_limit > 0:
        parts.append(
            "<p class=\"muted\">The culler's plan is the gpumem arbiter's verdict at its timeout of %s.</p>"
            % e(fmt_duration(view.cull_limit))
        )
    shown = [u for u in view.users if u.servers or u.bytes or u.unlisted]
    parts += [_user_card(view, prefix, xsrf, u) for u in shown]
    rest = len(view.users) - len(shown)
    if rest:
        parts.append('<p class="muted">%d other user(s) of the hub run no server and hold no GPU memory.</p>' % rest)
    if view.others:
        parts.append(
            '<h2>Accounts the hub does not know</h2><table><tr><th>Account</th><th class="num">GPU memory</th></tr>%s</table>'
            % "".join('<tr><td>%s</td><td class="num">%s</td></tr>' % (e(a), e(fmt_bytes(b))) for a, b in view.others)
        )
    for n in view.notes:
        parts.append('<p class="muted">%s</p>' % e(n))
    parts.append("</body></html>")
    return "".join(parts)


def render_confirm(prefix, xsrf, admin, what, fields, button):
    """The confirmation of an action: what it does, to whom, and one button
    that does it (the form carries confirm=yes)."""
    hidden = dict(fields, confirm="yes")
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        "<title>gpumem: confirm</title><style>%s</style></head><body>"
        '<h1>Confirm</h1><p class="card" data-gpumem="confirm">%s</p>%s '
        '<a href="%s">Cancel</a><p class="asof">signed in as %s (admin); the action is logged.</p></body></html>'
        % (STYLE, e(what), _form(prefix, xsrf, hidden, button, danger=True), e(prefix), e(admin))
    )


def describe_free(user, nb):
    return "Free the caches of %s's notebook %s (%s, kernel %s)? It holds %s (%s). No variable is deleted." % (
        user,
        nb.name,
        nb.path or "no path",
        nb.kernel_id,
        fmt_bytes(nb.bytes),
        _gpus(nb.per_gpu),
    )


def describe_stop(user, s):
    held = sum(nb.bytes for nb in s.notebooks)
    names = ", ".join(nb.name for nb in s.notebooks) or "no kernel"
    return "Stop %s's server %s? Its kernels (%s) end and give back %s of GPU memory; unsaved work in them is lost." % (
        user,
        s.label,
        names,
        fmt_bytes(held),
    )

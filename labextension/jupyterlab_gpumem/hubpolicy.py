"""What the GPU-aware cull arbiter (hub.py) decides for one JupyterHub
server, from the root gpumem daemon's facts. Pure: no I/O, no clock; the
arbiter fetches the facts and logs the decision.

A hub server's kernels are the report's notebooks whose user (the owner
of the kernel's proven process, which no user can choose) is the server's
user, and whose server URL (the single-user server's, from its
/api/sessions) has the hub server's URL path: the user is the key across
users, the URL path only tells one user's servers apart. A kernel of the
user that no server lists (the daemon could not ask its server, or it runs
outside the hub) may be any of the user's servers': it keeps them all
while it may be in use, and it never makes one cullable.
"""

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Dict, Optional, Tuple
from urllib.parse import unquote, urlparse


@dataclass(frozen=True)
class Rules:
    """The arbiter's settings. The GPU-idle rule is off while
    gpu_idle_after is 0: on, it culls a server whose kernels hold at least
    gpu_idle_min_bytes of GPU memory and have computed nothing on any GPU
    for gpu_idle_after seconds, however recently it was used."""

    gpu_idle_after: float = 0.0
    gpu_idle_min_bytes: int = 0


@dataclass(frozen=True)
class Facts:
    """What the daemon said, fetched once for every server of a cull round.

    report: GET /api/v1/notebooks's reply (None when it could not be had);
    server_urls: connection file -> its kernel's server URL (GET
    /api/v1/kernels); idle_since: connection file -> since when the arbiter
    has seen its kernel judged idle (track); error: why there are no facts.
    """

    report: Optional[dict] = None
    server_urls: Dict[str, str] = field(default_factory=dict)
    idle_since: Dict[str, datetime] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class Decision:
    """One server's verdict and its evidence."""

    cull: bool
    rule: str  # "veto", "culler", "gpu-idle" or "keep"
    reason: str
    user: str = ""
    server: str = ""
    bytes: int = 0
    verdicts: Tuple[str, ...] = ()

    def line(self):
        """The culler's log line: what, why, and the evidence."""
        action = {"veto": "veto cull of", "keep": "keep", "culler": "allow cull of", "gpu-idle": "cull"}[self.rule]
        return "gpumem: %s %s: %s [user=%s server=%s gpu_memory_bytes=%d verdicts=%s rule=%s]" % (
            action,
            self.server or "?",
            self.reason,
            self.user or "?",
            self.server or "?",
            self.bytes,
            ",".join(self.verdicts) or "-",
            self.rule,
        )


def server_identity(server):
    """(hub user, server name, URL path) of a server model of the hub's
    API: full_name is "user/name" ("user/" for the default server) since
    JupyterHub 5; older hubs are read from url (".../user/<name>/[server/]")."""
    path = _norm_path(server.get("url") or "")
    full = server.get("full_name") or ""
    if "/" in full:
        user, name = full.split("/", 1)
        return user, name, path
    parts = [p for p in path.split("/") if p]
    if "user" in parts:
        i = len(parts) - 1 - parts[::-1].index("user")
        rest = parts[i + 1 :]
        if rest:
            return rest[0], (rest[1] if len(rest) > 1 else server.get("name") or ""), path
    return "", server.get("name") or "", path


def _norm_path(url):
    """The unquoted path of url, ending in one slash."""
    return unquote(urlparse(url).path).rstrip("/") + "/"


def members(report, server_urls, user, url_path):
    """The report's notebooks of user's server at url_path, and those of
    user that no server lists (placed, unplaced). A notebook with no
    process that no server lists (a connection file left behind) runs
    nothing: neither. One this server lists whose process the daemon has
    not proven yet (a kernel just started) is placed: its use is unknown."""
    placed, unplaced = [], []
    for nb in report.get("notebooks") or []:
        if nb.get("user") != user:
            continue
        url = server_urls.get(nb.get("connection_file") or "", "")
        if not url:
            if nb.get("pids"):
                unplaced.append(nb)
        elif _norm_path(url) == url_path:
            placed.append(nb)
    return placed, unplaced


def _name(nb):
    # Not the report's display_name: these reasons go to the hub's log and
    # its admin, who must tell two users' kernels and notebooks of one file
    # name apart: the whole id and path name the kernel there.
    return "kernel %s (%s)" % (nb.get("kernel_id", "?"), nb.get("notebook") or "no notebook path")


def in_use(nb, listed):
    """Why nb may be in use (a cell runs, its tree computes on a GPU, or
    nobody can say), or "" when the daemon knows it is not. listed: a
    server of the hub lists it (else nobody can say whether a cell runs)."""
    if not nb.get("pids"):
        return "%s: the daemon has not proven its process yet, so its GPU use is unknown" % _name(nb)
    act = nb.get("activity")
    if not listed or act is None:
        return "%s: no Jupyter server reports whether it runs a cell" % _name(nb)
    state = act.get("execution_state") or "unknown"
    if state != "idle":
        return "%s is %s%s" % (_name(nb), state, " (a cell runs)" if state == "busy" else "")
    comp = nb.get("compute")
    held = nb.get("gpu_memory_bytes") or 0
    if comp is None:
        return "%s holds GPU memory and the daemon gives no compute verdict" % _name(nb) if held else ""
    reason = comp.get("reason") or "no reason given"
    if comp.get("state") == "computing":
        return "%s computes on a GPU: %s" % (_name(nb), reason)
    if comp.get("state") != "idle" and held:
        return "%s holds GPU memory and whether it computes is unknown: %s" % (_name(nb), reason)
    return ""


def other_computing(report, user):
    """Why a GPU process of user outside every kernel (a terminal's job, or
    one started from a shell) computes now, or ""."""
    for p in report.get("other") or []:
        if p.get("user") != user:
            continue
        for g in p.get("per_gpu") or []:
            u = g.get("utilization") or {}
            if u.get("sm_percent", 0) > 0:
                return (
                    "pid %s (%s) of user %s computes on GPU %s outside any kernel (%d%% SM): maybe a terminal of this server"
                    % (
                        p.get("pid"),
                        p.get("command") or "?",
                        user,
                        g.get("index"),
                        u.get("sm_percent"),
                    )
                )
    return ""


def decide(server, facts, inactive, inactive_limit, now, rules, system_user=None):
    """The decision for one server.

    server: the hub API's server model (the hook's argument); facts: Facts;
    inactive: timedelta since its last activity (None: unknown);
    inactive_limit: the culler's timeout in seconds; now: the culler's
    clock (aware datetime); system_user: hub user name -> system account
    (LocalProcessSpawner's: the same name)."""
    hub_user, name, path = server_identity(server)
    label = "%s/%s" % (hub_user, name) if hub_user else path
    user = (system_user or (lambda n: n))(hub_user) if hub_user else ""
    ev = {"user": user, "server": label}

    def veto(reason, **more):
        return Decision(False, "veto", reason, **dict(ev, **more))

    if facts.error:
        return veto("cannot ask the gpumem daemon, so nothing is culled: " + facts.error)
    report = facts.report or {}
    if report.get("view") == "own":
        return veto(
            "the gpumem daemon shows this culler only its own user's kernels: run the culler as root "
            "(or as the daemon's user) so that it sees every user's; nothing is culled until then"
        )
    if not user:
        return veto("no user in the hub's server model (url %r): cannot find its kernels" % (server.get("url"),))
    placed, unplaced = members(report, facts.server_urls, user, path)
    held = sum(nb.get("gpu_memory_bytes") or 0 for nb in placed)
    verdicts = tuple(((nb.get("compute") or {}).get("state") or "none") for nb in placed + unplaced)
    ev.update(bytes=held, verdicts=verdicts)
    for nb, listed in [(nb, True) for nb in placed] + [(nb, False) for nb in unplaced]:
        why = in_use(nb, listed)
        if why:
            return veto(why if listed else why + "; it may be this server's")
    why = other_computing(report, user)
    if why:
        return veto(why)
    n = len(placed)
    worked = last_gpu_work(placed + unplaced)
    if (
        inactive is not None
        and inactive.total_seconds() >= inactive_limit
        and worked is not None
        and now - worked[0] < timedelta(seconds=inactive_limit)
    ):
        # GPU work is use, as the daemon's own culling counts it: a run
        # that left the GPU for a while (its data loading, an evaluation
        # on the CPU) is not idle since its notebook's last message.
        return Decision(
            False,
            "keep",
            "inactive for %s, but %s computed on a GPU %s ago (limit %s)"
            % (_td(inactive), _name(worked[1]), _td(now - worked[0]), _td(timedelta(seconds=inactive_limit))),
            **ev,
        )
    if inactive is not None and inactive.total_seconds() >= inactive_limit:
        return Decision(
            True,
            "culler",
            "inactive for %s (limit %s); %d kernel(s), none in use" % (_td(inactive), _td(timedelta(seconds=inactive_limit)), n),
            **ev,
        )
    gpu_idle = gpu_idle_for(placed, facts.idle_since, now)
    if rules.gpu_idle_after > 0 and held >= max(rules.gpu_idle_min_bytes, 1) and gpu_idle is not None:
        if gpu_idle.total_seconds() >= rules.gpu_idle_after:
            return Decision(
                True,
                "gpu-idle",
                "holds %d bytes of GPU memory (at least %d) and computed nothing on any GPU for %s (limit %s)"
                % (held, rules.gpu_idle_min_bytes, _td(gpu_idle), _td(timedelta(seconds=rules.gpu_idle_after))),
                **ev,
            )
    return Decision(
        False,
        "keep",
        "inactive for %s (limit %s)%s"
        % (_td(inactive), _td(timedelta(seconds=inactive_limit)), _gpu_idle_note(rules, held, gpu_idle)),
        **ev,
    )


def _gpu_idle_note(rules, held, gpu_idle):
    if rules.gpu_idle_after <= 0:
        return ""
    if held < max(rules.gpu_idle_min_bytes, 1):
        return "; GPU-idle rule: holds %d bytes, less than %d" % (held, rules.gpu_idle_min_bytes)
    if gpu_idle is None:
        return "; GPU-idle rule: not judged yet"
    return "; GPU-idle rule: computed nothing for %s of %s" % (_td(gpu_idle), _td(timedelta(seconds=rules.gpu_idle_after)))


def last_gpu_work(notebooks):
    """(when, notebook) of the latest GPU work the daemon saw among
    notebooks (its last_computed_at), or None."""
    out = None
    for nb in notebooks:
        at = parse_time((nb.get("compute") or {}).get("last_computed_at"))
        if at is not None and (out is None or at > out[0]):
            out = (at, nb)
    return out


def gpu_idle_for(placed, idle_since, now):
    """How long every kernel of placed that holds GPU memory has computed
    nothing (the shortest of theirs), or None when one was not seen idle."""
    spans = []
    for nb in placed:
        if not nb.get("gpu_memory_bytes"):
            continue
        since = idle_since.get(nb.get("connection_file") or "")
        if since is None:
            return None
        spans.append(now - since)
    return min(spans) if spans else None


def track(idle_since, report, now):
    """The new idle_since from the last one and a fresh report: for each
    kernel, since when it has been judged idle without a break. A kernel
    judged anything else starts again from now; a kernel seen for the first
    time starts from now too (the arbiter saw nothing before), or from the
    daemon's last_computed_at when later."""
    out = {}
    for nb in report.get("notebooks") or []:
        key = nb.get("connection_file") or ""
        if not key or not nb.get("pids"):
            continue
        comp = nb.get("compute") or {}
        if comp.get("state") != "idle":
            out[key] = now
            continue
        since = idle_since.get(key, now)
        last = parse_time(comp.get("last_computed_at"))
        out[key] = max(since, last) if last is not None else since
    return out


def _td(td):
    """HH:MM:SS, as the culler writes durations."""
    if td is None:
        return "unknown"
    s = max(int(td.total_seconds()), 0)
    return "%02d:%02d:%02d" % (s // 3600, s % 3600 // 60, s % 60)


_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(s):
    """An RFC 3339 time of the daemon (Go's: nanoseconds, Z) as an aware
    datetime; None for none. Python before 3.11 reads neither Z nor more
    than six digits of a fraction."""
    if not s:
        return None
    t = _FRACTION.sub(r"\1", s.replace("Z", "+00:00"))
    try:
        d = datetime.fromisoformat(t)
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)

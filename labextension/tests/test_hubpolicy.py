"""hubpolicy: the GPU-aware cull arbiter's decision for one hub server, from
the daemon's report. Pure: tables of server models, reports and clocks."""

from datetime import datetime, timedelta, timezone

import pytest
from jupyterlab_gpumem.hubpolicy import Facts, Rules, decide, parse_time, server_identity, track

GiB = 1 << 30
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def nb(kid, user="alice", state="idle", compute="idle", held=0, reason="", pids=(100,), last_computed=None):
    n = {
        "kernel_id": kid,
        "connection_file": "/home/%s/rt/kernel-%s.json" % (user, kid),
        "notebook": "/home/%s/%s.ipynb" % (user, kid),
        "user": user,
        "pids": list(pids),
        "gpu_memory_bytes": held,
    }
    if state is not None:
        n["activity"] = {"execution_state": state, "last_activity": "2026-12-01T11:00:00Z"}
    if compute is not None:
        n["compute"] = {"state": compute, "reason": reason or "judged %s" % compute}
        if last_computed:
            n["compute"]["last_computed_at"] = last_computed
    return n


def facts(*notebooks, urls=None, other=(), view="", idle_since=None, error=""):
    report = {"notebooks": list(notebooks), "other": list(other)}
    if view:
        report["view"] = view
    if urls is None:  # every kernel listed by its user's default server
        urls = {n["connection_file"]: "http://127.0.0.1:4%d/user/%s/" % (i, n["user"]) for i, n in enumerate(notebooks)}
    return Facts(report=report, server_urls=urls, idle_since=idle_since or {}, error=error)


ALICE = {"name": "", "full_name": "alice/", "url": "/user/alice/", "ready": True}
ALICE_GPU = {"name": "gpu", "full_name": "alice/gpu", "url": "/user/alice/gpu/", "ready": True}
GPU_IDLE = Rules(gpu_idle_after=3600, gpu_idle_min_bytes=4 * GiB)
SINCE_2H = {"/home/alice/rt/kernel-k.json": NOW - 2 * HOUR}


@pytest.mark.parametrize(
    "name, server, f, inactive, rules, want_cull, want_rule, want_in_reason",
    [
        (
            "idle past the limit: the culler's rule",
            ALICE,
            facts(nb("k", held=8 * GiB)),
            2 * HOUR,
            Rules(),
            True,
            "culler",
            "inactive for 02:00:00",
        ),
        (
            "GPU work within the limit is use: kept",
            ALICE,
            facts(nb("k", held=8 * GiB, last_computed="2026-12-01T11:40:00Z")),
            2 * HOUR,
            Rules(),
            False,
            "keep",
            "but kernel k (/home/alice/k.ipynb) computed on a GPU 00:20:00 ago (limit 01:00:00)",
        ),
        (
            "GPU work before the limit: the culler's rule",
            ALICE,
            facts(nb("k", held=8 * GiB, last_computed="2026-12-01T10:40:00Z")),
            2 * HOUR,
            Rules(),
            True,
            "culler",
            "inactive for 02:00:00",
        ),
        (
            "idle within the limit: kept",
            ALICE,
            facts(nb("k", held=8 * GiB)),
            0.5 * HOUR,
            Rules(),
            False,
            "keep",
            "inactive for 00:30:00",
        ),
        ("no kernel at all: the culler's rule", ALICE, facts(), 2 * HOUR, Rules(), True, "culler", "0 kernel(s)"),
        ("a cell runs: veto", ALICE, facts(nb("k", state="busy")), 9 * HOUR, Rules(), False, "veto", "is busy (a cell runs)"),
        ("kernel starting: veto", ALICE, facts(nb("k", state="starting")), 9 * HOUR, Rules(), False, "veto", "is starting"),
        (
            "its tree computes: veto with the daemon's reason",
            ALICE,
            facts(nb("k", compute="computing", held=30 * GiB, reason="pid 7 computed in 5 of 6 readings")),
            9 * HOUR,
            GPU_IDLE,
            False,
            "veto",
            "computes on a GPU: pid 7 computed in 5 of 6 readings",
        ),
        (
            "unknown work, memory held: veto",
            ALICE,
            facts(nb("k", compute="unknown", held=GiB)),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "is unknown",
        ),
        (
            "unknown work, nothing held: culler's rule",
            ALICE,
            facts(nb("k", compute="unknown")),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "no verdict, memory held: veto",
            ALICE,
            facts(nb("k", compute=None, held=GiB)),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "no compute verdict",
        ),
        (
            "no server lists the kernel: veto",
            ALICE,
            facts(nb("k"), urls={}),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "may be this server's",
        ),
        (
            "listed but no activity: veto",
            ALICE,
            facts(nb("k", state=None)),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "whether it runs a cell",
        ),
        (
            "listed by the server, its process not proven yet (a kernel just started): veto",
            ALICE,
            facts(nb("k", pids=())),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "has not proven its process yet",
        ),
        (
            "a file without a process runs nothing",
            ALICE,
            facts(nb("k", state=None, pids=()), urls={}),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "bob's training keeps bob, not alice",
            ALICE,
            facts(nb("k", held=8 * GiB), nb("b", user="bob", state="busy", compute="computing", held=30 * GiB)),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "alice's other server's training does not keep this one",
            ALICE,
            facts(
                nb("k", held=8 * GiB),
                nb("t", compute="computing", held=30 * GiB),
                urls={
                    "/home/alice/rt/kernel-k.json": "http://127.0.0.1:1/user/alice/",
                    "/home/alice/rt/kernel-t.json": "http://127.0.0.1:2/user/alice/gpu/",
                },
            ),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "the named server with the training is kept",
            ALICE_GPU,
            facts(
                nb("k", held=8 * GiB),
                nb("t", compute="computing", held=30 * GiB),
                urls={
                    "/home/alice/rt/kernel-k.json": "http://127.0.0.1:1/user/alice/",
                    "/home/alice/rt/kernel-t.json": "http://127.0.0.1:2/user/alice/gpu/",
                },
            ),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "kernel t",
        ),
        (
            "a server URL claiming alice's path is not alice's kernel",
            ALICE,
            facts(
                nb("m", user="mallory", state="busy"), urls={"/home/mallory/rt/kernel-m.json": "http://127.0.0.1:9/user/alice/"}
            ),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "alice's terminal job computes: veto",
            ALICE,
            facts(
                other=[
                    {
                        "pid": 55,
                        "user": "alice",
                        "command": "python train.py",
                        "per_gpu": [{"index": 0, "bytes": GiB, "utilization": {"sm_percent": 80}}],
                    }
                ]
            ),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "pid 55 (python train.py) of user alice computes on GPU 0",
        ),
        (
            "bob's computing process does not keep alice",
            ALICE,
            facts(
                other=[
                    {
                        "pid": 56,
                        "user": "bob",
                        "command": "x",
                        "per_gpu": [{"index": 0, "bytes": GiB, "utilization": {"sm_percent": 80}}],
                    }
                ]
            ),
            9 * HOUR,
            Rules(),
            True,
            "culler",
            "",
        ),
        (
            "cannot ask: veto with why",
            ALICE,
            Facts(error="nothing serves /run/gpumem/gpumem.sock"),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "cannot ask the gpumem daemon",
        ),
        (
            "not an admin: veto with what to do",
            ALICE,
            facts(nb("k"), view="own"),
            9 * HOUR,
            Rules(),
            False,
            "veto",
            "run the culler as root",
        ),
        ("no user in the model: veto", {"url": "/elsewhere/", "name": ""}, facts(), 9 * HOUR, Rules(), False, "veto", "no user"),
        ("unknown inactivity: kept", ALICE, facts(nb("k")), None, Rules(), False, "keep", "inactive for unknown"),
        # The GPU-idle rule: recent use does not save a server that holds
        # memory and computed nothing for the set time.
        (
            "GPU-idle: culled early",
            ALICE,
            facts(nb("k", held=8 * GiB), idle_since=SINCE_2H),
            MINUTE,
            GPU_IDLE,
            True,
            "gpu-idle",
            "computed nothing on any GPU for 02:00:00",
        ),
        (
            "GPU-idle: below the memory threshold",
            ALICE,
            facts(nb("k", held=2 * GiB), idle_since=SINCE_2H),
            MINUTE,
            GPU_IDLE,
            False,
            "keep",
            "less than",
        ),
        (
            "GPU-idle: not idle long enough",
            ALICE,
            facts(nb("k", held=8 * GiB), idle_since={"/home/alice/rt/kernel-k.json": NOW - 0.5 * HOUR}),
            MINUTE,
            GPU_IDLE,
            False,
            "keep",
            "computed nothing for 00:30:00 of 01:00:00",
        ),
        ("GPU-idle: never seen idle yet", ALICE, facts(nb("k", held=8 * GiB)), MINUTE, GPU_IDLE, False, "keep", "not judged yet"),
        (
            "GPU-idle off: only the culler's rule",
            ALICE,
            facts(nb("k", held=8 * GiB), idle_since=SINCE_2H),
            MINUTE,
            Rules(),
            False,
            "keep",
            "",
        ),
        (
            "GPU-idle: a running cell still vetoes",
            ALICE,
            facts(nb("k", state="busy", held=8 * GiB), idle_since=SINCE_2H),
            MINUTE,
            GPU_IDLE,
            False,
            "veto",
            "busy",
        ),
        (
            "GPU-idle: bytes of another server's kernels do not count",
            ALICE,
            facts(
                nb("k", held=2 * GiB),
                nb("u", held=8 * GiB),
                urls={
                    "/home/alice/rt/kernel-k.json": "http://127.0.0.1:1/user/alice/",
                    "/home/alice/rt/kernel-u.json": "http://127.0.0.1:2/user/alice/gpu/",
                },
                idle_since=SINCE_2H,
            ),
            MINUTE,
            GPU_IDLE,
            False,
            "keep",
            "less than",
        ),
    ],
)
def test_decide(name, server, f, inactive, rules, want_cull, want_rule, want_in_reason):
    d = decide(server, f, inactive, 3600, NOW, rules)
    assert (d.cull, d.rule) == (want_cull, want_rule), (name, d)
    assert want_in_reason in d.reason, (name, d.reason)
    line = d.line()
    # Every decision's line carries its evidence.
    for part in ("user=", "server=", "gpu_memory_bytes=", "verdicts=", "rule=" + want_rule):
        assert part in line, (name, line)


def test_evidence():
    d = decide(ALICE, facts(nb("k", held=8 * GiB), nb("j", compute="idle", held=GiB)), 2 * HOUR, 3600, NOW, Rules())
    assert (d.user, d.server, d.bytes, d.verdicts) == ("alice", "alice/", 9 * GiB, ("idle", "idle"))
    assert d.line().startswith("gpumem: allow cull of alice/: inactive for 02:00:00 (limit 01:00:00)")


def test_system_user():
    """A hub whose names are not the accounts' maps them."""
    f = facts(nb("k", state="busy"), urls={"/home/alice/rt/kernel-k.json": "http://127.0.0.1:1/user/Alice/"})
    d = decide({"full_name": "Alice/", "url": "/user/Alice/"}, f, 9 * HOUR, 3600, NOW, Rules(), str.lower)
    assert d.rule == "veto" and d.user == "alice"


@pytest.mark.parametrize(
    "server, want",
    [
        ({"full_name": "alice/", "url": "/user/alice/"}, ("alice", "", "/user/alice/")),
        (
            {"full_name": "alice/gpu box", "url": "/hub-prefix/user/alice/gpu%20box/"},
            ("alice", "gpu box", "/hub-prefix/user/alice/gpu box/"),
        ),
        ({"url": "/user/bob/", "name": ""}, ("bob", "", "/user/bob/")),  # before JupyterHub 5: no full_name
        ({"url": "/prefix/user/bob/lab/", "name": "lab"}, ("bob", "lab", "/prefix/user/bob/lab/")),
        ({"url": "https://bob.hub.example/user/bob/", "full_name": "bob/"}, ("bob", "", "/user/bob/")),  # subdomains
        ({"url": "/nothing/", "name": ""}, ("", "", "/nothing/")),
    ],
)
def test_server_identity(server, want):
    assert server_identity(server) == want


def test_track():
    k = "/home/alice/rt/kernel-k.json"
    r = {"notebooks": [nb("k", held=GiB)]}
    # First sighting: from now.
    s = track({}, r, NOW)
    assert s == {k: NOW}
    # Still idle later: the start stands.
    assert track(s, r, NOW + HOUR) == {k: NOW}
    # The daemon saw it compute between two rounds: from then.
    r2 = {"notebooks": [nb("k", held=GiB, last_computed="2026-12-01T12:30:00.123456789Z")]}
    assert track(s, r2, NOW + HOUR) == {k: datetime(2026, 12, 1, 12, 30, 0, 123456, tzinfo=timezone.utc)}
    # Judged computing or unknown: starts again.
    for state in ("computing", "unknown"):
        r3 = {"notebooks": [nb("k", compute=state, held=GiB)]}
        assert track(s, r3, NOW + HOUR) == {k: NOW + HOUR}
    # Gone: forgotten.
    assert track(s, {"notebooks": []}, NOW + HOUR) == {}


@pytest.mark.parametrize(
    "s, want",
    [
        ("2026-12-01T21:10:24.123456789Z", datetime(2026, 12, 1, 21, 10, 24, 123456, tzinfo=timezone.utc)),
        ("2026-12-01T21:10:24Z", datetime(2026, 12, 1, 21, 10, 24, tzinfo=timezone.utc)),
        ("2026-12-01T22:10:24+01:00", datetime(2026, 12, 1, 21, 10, 24, tzinfo=timezone.utc)),
        ("", None),
        (None, None),
        ("yesterday", None),
    ],
)
def test_parse_time(s, want):
    assert parse_time(s) == want

"""hubview: the hub admin page's view of the golden report (the report the
Go tests write), placed by the hub's users and servers as the cull arbiter
places kernels, and its HTML. Pure: tables of hub user models and clocks."""

import json
from datetime import datetime, timezone

import pytest
from harness import REPO
from jupyterlab_gpumem import hubview
from jupyterlab_gpumem.hubpolicy import Facts, Rules

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
GOLDEN = json.loads((REPO / "testdata" / "report" / "golden-report.json").read_text())
# alice's default server lists train.ipynb; eval.ipynb is listed by none;
# bob's named server "gpu" lists finetune.ipynb.
URLS = {
    "/run/user/1000/jupyter/kernel-a.json": "http://127.0.0.1:40001/user/alice/",
    "/run/user/1001/jupyter/kernel-c.json": "http://127.0.0.1:40002/user/bob/gpu/",
}


def user(name, servers=None, admin=False):
    return {"name": name, "admin": admin, "servers": servers or {}}


def server(url, last="2026-03-02T11:30:00Z", ready=True):
    return {"url": url, "ready": ready, "last_activity": last}


HUB = [
    user("bob", {"gpu": server("/user/bob/gpu/")}),
    user("alice", {"": server("/user/alice/", "2026-03-02T10:00:00Z")}),
    user("erin"),
    user("root-admin", admin=True),
]


def build(report=GOLDEN, hub=HUB, limit=3600, urls=URLS):
    return hubview.build(Facts(report=report, server_urls=urls), hub, NOW, limit, Rules())


def test_notebooks_are_placed_by_user_and_server_url():
    v = build()
    assert [u.name for u in v.users] == ["alice", "bob", "erin", "root-admin"]
    alice, bob = v.users[0], v.users[1]
    assert [(s.label, [nb.name for nb in s.notebooks]) for s in alice.servers] == [("alice/", ["train.ipynb"])]
    assert [nb.name for nb in alice.unlisted] == ["eval.ipynb"]
    assert [(s.label, [nb.name for nb in s.notebooks]) for s in bob.servers] == [("bob/gpu", ["finetune.ipynb"])]
    # The report's own figures, not sums of the page's.
    assert alice.bytes == 56358862848 and alice.per_gpu == ((0, 43473960960), (1, 12884901888))
    assert alice.hoarded_gib_hours == 31.25 and v.hoard_window_seconds == 86400
    assert bob.servers[0].notebooks[0].state == "computing"
    # carol runs a process outside the hub; dave's kernel is not a hub user's.
    assert v.others == (("carol", 8589934592), ("dave", 4294967296))
    assert [g.level for g in v.gpus] == ["warn", "ok"]


@pytest.mark.parametrize(
    "name, limit, rule, reason",
    [
        ("bob", 3600, "veto", "is busy (a cell runs)"),
        # alice's unlisted eval.ipynb may be her server's: it vetoes.
        ("alice", 3600, "veto", "no Jupyter server reports whether it runs a cell; it may be this server's"),
    ],
)
def test_each_server_carries_the_arbiters_verdict(name, limit, rule, reason):
    v = build(limit=limit)
    s = next(u for u in v.users if u.name == name).servers[0]
    assert s.verdict.rule == rule and reason in s.verdict.reason


def test_no_timeout_no_verdict():
    v = build(limit=0)
    assert all(s.verdict is None for u in v.users for s in u.servers)
    assert "--cull-timeout" in hubview.render(v, "/services/gpumem/", "", "root-admin")


def test_gpumems_own_cull_is_said_with_its_time():
    train = build().users[0].servers[0].notebooks[0]
    assert train.planned == "shutdown in 2 h 5 min (14:05:00 UTC)"


def test_a_failed_fetch_is_said_and_shows_nothing_else():
    v = hubview.build(Facts(error="nothing serves /run/gpumem/gpumem.sock"), HUB, NOW, 3600, Rules())
    page = hubview.render(v, "/p/", "", "root-admin")
    assert "could not be asked: nothing serves /run/gpumem/gpumem.sock" in page
    assert "alice" not in page


def test_actions_name_only_what_the_page_lists_under_that_user():
    v = build()
    a = GOLDEN["notebooks"][0]  # alice's train.ipynb
    assert hubview.find_notebook(v, "alice", a["connection_file"], a["kernel_id"]).name == "train.ipynb"
    # Another user's name, another file of the same id, or a kernel the page
    # does not list: nothing is acted on.
    assert hubview.find_notebook(v, "bob", a["connection_file"], a["kernel_id"]) is None
    assert hubview.find_notebook(v, "alice", "/tmp/kernel-a.json", a["kernel_id"]) is None
    assert hubview.find_notebook(v, "alice", a["connection_file"], "other") is None
    assert hubview.find_server(v, "bob", "gpu").label == "bob/gpu"
    assert hubview.find_server(v, "bob", "") is None
    assert hubview.find_server(v, "erin", "") is None


def test_the_page_escapes_what_users_name():
    report = json.loads(json.dumps(GOLDEN))
    report["notebooks"][0]["display_name"] = "<img src=x onerror=alert(1)>.ipynb"
    page = hubview.render(build(report=report), "/services/gpumem/", '<input name="_xsrf">', "root-admin")
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;.ipynb" in page
    # Users with no server and no GPU memory are counted, not listed.
    assert 'data-user="erin"' not in page and "2 other user(s) of the hub" in page


def test_confirmations_say_what_the_action_does():
    v = build()
    nb = v.users[0].servers[0].notebooks[0]
    assert hubview.describe_free("alice", nb) == (
        "Free the caches of alice's notebook train.ipynb (/home/alice/train.ipynb, kernel "
        "4c1f2e0a-6b7d-4e21-9a3c-1d2e3f405162)? It holds 40.5 GiB (GPU 0: 40.5 GiB). No variable is deleted."
    )
    assert hubview.describe_stop("bob", v.users[1].servers[0]) == (
        "Stop bob's server bob/gpu? Its kernels (finetune.ipynb) end and give back 16.5 GiB of GPU memory; "
        "unsaved work in them is lost."
    )
    html = hubview.render_confirm("/p/", '<input name="_xsrf">', "root-admin", "Stop it?", {"action": "stop"}, "Stop")
    assert 'name="confirm" value="yes"' in html and 'name="_xsrf"' in html


def test_the_view_is_json():
    data = json.loads(json.dumps(hubview.to_json(build())))
    assert data["users"][1]["servers"][0]["verdict"]["rule"] == "veto"
    assert data["as_of"] == "2026-03-02T12:00:00+00:00"


def test_gib_hours_as_the_cli_writes_them():
    assert [hubview.fmt_gib_hours(x) for x in (0, 31.25, 999.94, 999.95, 1512.4)] == [
        "0.0 GiB·h",
        "31.2 GiB·h",
        "999.9 GiB·h",
        "1000 GiB·h",
        "1512 GiB·h",
    ]

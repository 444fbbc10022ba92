"""Kernel subshells (JEP 91) and %gpumem: what they would give, and cost.

Run with the current stack's python (ipykernel >= 7), from the repository
root, after `go build -o bin/gpumem ./cmd/gpumem`:

    .venv/current/bin/python scripts/gpuhost/measure_subshells.py bin/gpumem

It starts a real JupyterLab server (127.0.0.1, temporary dirs, a token),
opens a notebook session, injects the magics with `gpumem attach`, and then:
  1. reads kernel_info's supported_features;
  2. creates a subshell on the control channel (timed);
  3. runs a 4 s busy cell on the main shell and, 0.5 s in, `%gpumem` and
     `%gpumem vars` in the subshell: does the reply come before the cell
     ends, and how long does it take;
  4. samples the server's execution_state (GET /api/kernels/<id>, what
     JupyterLab's kernel indicator follows through the server) every 50 ms
     while the cell runs, and the iopub status messages with their parents;
  5. times the same magics on the main shell of an idle kernel, and the
     kernel's threads and RSS before and after the subshell.
It prints one report; docs/runs/2026-11-30/subshells-current-stack.txt keeps a run.
"""

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from jupyter_client import BlockingKernelClient


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    gpumem = os.path.abspath(sys.argv[1])
    base = tempfile.mkdtemp(prefix="gpumem-subshells-")
    env = dict(os.environ)
    for k in ("runtime", "config", "data", "home", "nb"):
        os.makedirs(os.path.join(base, k))
    env.update(
        JUPYTER_RUNTIME_DIR=os.path.join(base, "runtime"),
        JUPYTER_CONFIG_DIR=os.path.join(base, "config"),
        JUPYTER_DATA_DIR=os.path.join(base, "data"),
        HOME=os.path.join(base, "home"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    port, token = free_port(), os.urandom(8).hex()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ip=127.0.0.1",
            "--port=%d" % port,
            "--ServerApp.token=" + token,
            "--ServerApp.root_dir=" + os.path.join(base, "nb"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = "http://127.0.0.1:%d/" % port
    try:
        run(gpumem, env, url, token, base)
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(base, ignore_errors=True)


def api(url, token, method, path, body=None):
    req = urllib.request.Request(
        url + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": "token " + token, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def run(gpumem, env, url, token, base):
    deadline = time.monotonic() + 60
    while True:
        try:
            api(url, token, "GET", "api/status")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with open(os.path.join(base, "nb", "sub.ipynb"), "w") as f:
        f.write('{"cells":[],"metadata":{},"nbformat":4,"nbformat_minor":5}')
    sess = api(url, token, "POST", "api/sessions", {"path": "sub.ipynb", "type": "notebook", "kernel": {"name": "python3"}})
    kid = sess["kernel"]["id"]
    cf = os.path.join(base, "runtime", "kernel-%s.json" % kid)
    while not os.path.exists(cf):
        time.sleep(0.05)
    kc = BlockingKernelClient(connection_file=cf)
    kc.load_connection_file()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)

    import ipykernel
    import IPython
    import jupyter_client
    import jupyter_server
    import jupyterlab

    print(
        "versions: jupyterlab %s, jupyter_server %s, jupyter_client %s, ipykernel %s, IPython %s"
        % (
            jupyterlab.__version__,
            jupyter_server.__version__,
            jupyter_client.__version__,
            ipykernel.__version__,
            IPython.__version__,
        )
    )
    kc.kernel_info()
    info = kc.get_shell_msg(timeout=10)["content"]
    feats = info.get("supported_features", [])
    print("kernel_info supported_features:", feats)
    if "kernel subshells" not in feats:
        print("no subshells: nothing more to measure")
        return

    out = subprocess.run([gpumem, "attach", cf], env=env, capture_output=True, text=True, timeout=120)
    print("gpumem attach:", out.stdout.strip() or out.stderr.strip())
    pid = kernel_pid(kc)
    threads0, rss0 = proc_threads_rss(pid)

    # Create a subshell (control channel).
    t0 = time.perf_counter()
    m = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(m)
    reply = wait_parent(kc.get_control_msg, m["header"]["msg_id"], 10)
    sid = reply["content"]["subshell_id"]
    print("create_subshell_request: %.1f ms, subshell %s" % ((time.perf_counter() - t0) * 1e3, sid))
    threads1, rss1 = proc_threads_rss(pid)
    print("kernel threads %d -> %d, RSS %.1f -> %.1f MiB" % (threads0, threads1, rss0 / 2**20, rss1 / 2**20))

    # Idle kernel, main shell: the reference cost.
    for code in ("%gpumem", "%gpumem vars --all-devices"):
        t0 = time.perf_counter()
        r = kc.execute_interactive(code, timeout=60, store_history=False, output_hook=lambda m: None)
        print("idle main shell: %-28s %6.1f ms (%s)" % (code, (time.perf_counter() - t0) * 1e3, r["content"]["status"]))

    # Drain iopub, then watch it on a thread while the busy cell runs.
    while True:
        try:
            kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
    statuses, states, stop = [], [], threading.Event()

    def watch_iopub():
        while not stop.is_set():
            try:
                msg = kc.get_iopub_msg(timeout=0.05)
            except queue.Empty:
                continue
            if msg["msg_type"] == "status":
                statuses.append(
                    (
                        time.perf_counter(),
                        msg["content"]["execution_state"],
                        msg["parent_header"].get("msg_type"),
                        msg["parent_header"].get("subshell_id"),
                    )
                )

    def watch_server():
        while not stop.is_set():
            states.append((time.perf_counter(), api(url, token, "GET", "api/kernels/" + kid)["execution_state"]))
            time.sleep(0.05)

    threads = [threading.Thread(target=watch_iopub), threading.Thread(target=watch_server)]
    for t in threads:
        t.start()
    cell_start = time.perf_counter()
    busy = kc.execute("import time\n_t = time.time()\nwhile time.time() - _t < 4: pass", store_history=False)
    time.sleep(0.5)
    sub_times = []
    for code in ("%gpumem", "%gpumem vars --all-devices"):
        m = kc.session.msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": False,
            },
        )
        m["header"]["subshell_id"] = sid
        t0 = time.perf_counter()
        kc.shell_channel.send(m)
        r = wait_parent(kc.get_shell_msg, m["header"]["msg_id"], 30)
        sub_times.append((code, time.perf_counter() - t0, r["content"]["status"], time.perf_counter() - cell_start))
    main_reply = wait_parent(kc.get_shell_msg, busy, 30)
    cell_end = time.perf_counter()
    time.sleep(0.3)
    stop.set()
    for t in threads:
        t.join()
    for code, took, status, at in sub_times:
        print(
            "subshell during a busy cell: %-28s %6.1f ms (%s), answered %.2f s into the 4 s cell" % (code, took * 1e3, status, at)
        )
    print("main cell: %s after %.2f s" % (main_reply["content"]["status"], cell_end - cell_start))
    print("iopub status messages while the cell ran (t from cell start, state, parent, subshell):")
    for at, state, parent, sub in statuses:
        print("  %6.2f s  %-5s %-16s %s" % (at - cell_start, state, parent, sub or "main"))
    wrong = [(at - cell_start, s) for at, s in states if cell_start + 0.1 < at < cell_end - 0.1 and s != "busy"]
    print(
        "server execution_state samples during the cell: %d, not 'busy' in %d%s"
        % (
            len([1 for at, _ in states if cell_start < at < cell_end]),
            len(wrong),
            (" (first at %.2f s: %s)" % wrong[0]) if wrong else "",
        )
    )
    m = kc.session.msg("delete_subshell_request", {"subshell_id": sid})
    kc.control_channel.send(m)
    wait_parent(kc.get_control_msg, m["header"]["msg_id"], 10)
    kc.stop_channels()


def kernel_pid(kc):
    msgs = []
    kc.execute_interactive(
        "import os; print(os.getpid())",
        timeout=30,
        store_history=False,
        output_hook=lambda m: msgs.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
    )
    return int("".join(msgs).strip())


def proc_threads_rss(pid):
    threads = rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return threads, rss


def wait_parent(get, msg_id, timeout):
    deadline = time.monotonic() + timeout
    while True:
        msg = get(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


if __name__ == "__main__":
    main()

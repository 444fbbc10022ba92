"""The server extension's handlers against real Jupyter servers, a real
gpumem serve (simulated GPU) and real kernels."""

import importlib.util
import os

import httpx
from harness import GiB, need, wait_for


def require_extension():
    need(
        importlib.util.find_spec("jupyterlab_gpumem") is not None,
        "jupyterlab_gpumem is not installed in this Python (run labextension/scripts/build.sh)",
    )


def test_needs_jupyter_auth(stack):
    require_extension()
    lab = stack.server()
    for method, path in [
        ("GET", "gpumem/api/v1/state"),
        ("POST", "gpumem/api/v1/kernels/abc/free"),
        ("GET", "gpumem/api/v1/kernels/abc/vars"),
    ]:
        r = httpx.request(method, lab.url + path, timeout=10)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    # Cookie-less POST with a wrong token: refused too.
    r = httpx.post(
        lab.url + "gpumem/api/v1/kernels/abc/free",
        headers={"Authorization": "token nope"},
        timeout=10,
    )
    assert r.status_code == 403


def test_no_daemon_is_one_clear_status(stack):
    require_extension()
    lab = stack.server()
    st = lab.state()
    assert st["status"] == "no_daemon", st
    assert "gpumem serve" in st["message"] and str(stack.socket) in st["message"], st


def test_only_this_servers_kernels(stack):
    require_extension()
    lab = stack.server()
    other = stack.server(app="jupyter_server")  # another server, same user, same runtime dir
    lab.notebook("mine.ipynb")
    other.notebook("theirs.ipynb")
    mine = lab.start_session("mine.ipynb")
    theirs = other.start_session("theirs.ipynb")
    stack.start_daemon()
    pm, pt = stack.kernel_pid(mine), stack.kernel_pid(theirs)
    stack.set_gpu({pm: 2 * GiB, pt: 5 * GiB})

    def view():
        st = lab.state()
        if st["status"] == "ok" and st["notebooks"] and st["notebooks"][0]["gpu_memory_bytes"] == 2 * GiB and st["others"]:
            return st

    st = wait_for("the state to show both kernels' figures", view, timeout=30)
    assert [nb["kernel_id"] for nb in st["notebooks"]] == [mine]
    assert st["notebooks"][0]["path"] == "mine.ipynb"
    assert st["notebooks"][0]["peak_bytes"] == 2 * GiB
    # The other server's kernel is only part of its user's total.
    assert len(st["others"]) == 1 and st["others"][0]["notebooks"] == 1 and st["others"][0]["gpu_memory_bytes"] == 5 * GiB
    assert theirs not in str(st), "the other server's kernel id must not reach this server's browser"
    # Its total, and its bytes on each GPU it uses: this server's kernel only.
    assert {s["id"] for s in st["series"]["notebooks"]} == {mine}
    assert sorted(s.get("gpu", -1) for s in st["series"]["notebooks"]) == [-1, 0]
    assert st["gpus"][0]["simulated"] is True and st["gpus"][0]["memory_used_bytes"] == 7 * GiB
    assert st["alert_threshold"] == 0.8

    # Incremental: since=now gives at most the last points.
    later = lab.get("gpumem/api/v1/state", params={"since": st["now"]}).json()
    assert all(p[0] >= st["now"] for s in later["series"]["gpus"] for p in s["points"])

    # Free and vars: this server's kernels only.
    r = lab.post(f"gpumem/api/v1/kernels/{theirs}/free")
    assert r.status_code == 403, r.text
    r = lab.get(f"gpumem/api/v1/kernels/{theirs}/vars")
    assert r.status_code == 403, r.text
    r = lab.post(f"gpumem/api/v1/kernels/{mine}/free")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["free"]["cache_only"] is True, body
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/vars", params={"all_devices": "1"})
    assert r.status_code == 200, r.text
    assert r.json()["vars"]["kind"] == "vars", r.json()

    # Keep it: this server's kernels only; a daemon that culls nothing
    # says so in its own words.
    assert lab.post(f"gpumem/api/v1/kernels/{theirs}/keep").status_code == 403
    r = lab.post(f"gpumem/api/v1/kernels/{mine}/keep")
    assert r.status_code == 200 and r.json()["status"] == "error", r.text
    assert "culls no kernel" in r.json()["message"], r.json()

    # Why and free workers: this server's kernels only, too.
    assert lab.get(f"gpumem/api/v1/kernels/{theirs}/why").status_code == 403
    assert lab.post(f"gpumem/api/v1/kernels/{theirs}/children/free").status_code == 403
    r = lab.get(f"gpumem/api/v1/kernels/{mine}/why")
    assert r.status_code == 200, r.text
    why = r.json()["why"]
    assert why["kind"] == "why" and why["driver"]["bytes"] == 2 * GiB and "rows:" in why["text"], why
    r = lab.post(f"gpumem/api/v1/kernels/{mine}/children/free")
    assert r.status_code == 200, r.text
    assert r.json()["children"]["kind"] == "children" and r.json()["children"]["ended"] == [], r.json()
    # Confirmed pids are passed on, checked: a bad list is refused here, and
    # a pid of no worker of the kernel (init) ends nothing.
    assert lab.post(f"gpumem/api/v1/kernels/{mine}/children/free", {"pids": ["x"]}).status_code == 400
    r = lab.post(f"gpumem/api/v1/kernels/{mine}/children/free", {"pids": [1]})
    assert r.status_code == 200, r.text
    rep = r.json()["children"]
    assert rep["ended"] == [] and [p["pid"] for p in rep["left"]] == [1], rep
    assert "not a process of this kernel's tree" in rep["left"][0]["reason"], rep

    # A bad since is the caller's error, not the daemon's.
    assert lab.get("gpumem/api/v1/state", params={"since": "yesterday"}).status_code == 400

    # The daemon goes away: one status line again, no HTTP error.
    stack.stop_daemon()
    st = lab.state()
    assert st["status"] == "no_daemon", st


def gone(pid):
    """Whether pid has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def run_cell(stack, kernel_id, code):
    """Runs code in the kernel (through its connection file) and returns
    what it printed."""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(connection_file=str(stack.runtime / f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        out = []
        reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        kc.stop_channels()


def test_end_a_job_left_running(stack):
    """A job started from a notebook computes on the GPU: after a restart
    gpumem serve leaves it running and says so (an event with its
    sentence); "End it" ends it, for this server's kernels only."""
    require_extension()
    lab = stack.server()
    other = stack.server(app="jupyter_server")
    lab.notebook("train.ipynb")
    other.notebook("theirs.ipynb")
    kid = lab.start_session("train.ipynb")
    theirs = other.start_session("theirs.ipynb")
    stack.start_daemon("--interval=200ms", "--reclaim-grace=500ms")
    pid = stack.kernel_pid(kid)
    job = int(
        run_cell(
            stack,
            kid,
            "import subprocess, sys\n"
            "_j = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
            "print(_j.pid)",
        ).strip()
    )
    try:
        stack.set_gpu({pid: GiB, job: 4 * GiB}, sm_by_pid={job: 90})

        def counted():
            st = lab.state()
            if st["status"] == "ok" and st["notebooks"] and job in st["notebooks"][0]["pids"]:
                return st

        first = wait_for("the job counted in the notebook", counted, timeout=30)
        assert first["notebooks"][0]["utilization"]["sm_percent"] == 90, first["notebooks"][0]
        r = lab.post(f"api/kernels/{kid}/restart")
        assert r.status_code == 200, r.text

        def left():
            st = lab.get("gpumem/api/v1/state", params={"events_after": "0"}).json()
            evs = [e for e in st.get("events", []) if e.get("kind") == "left_running" and e.get("pid") == job]
            if evs and st.get("left_running"):
                return st, evs[0]

        st, ev = wait_for("the job left running, and said so", left, timeout=30)
        assert ev["message"].startswith(f"a job started from train.ipynb (pid {job}, `"), ev
        assert ev["message"].endswith("is still computing on GPU 0 with 4.0 GiB: left running"), ev
        assert not gone(job)

        # Another server's kernel, and a body that is not a list of pids: refused.
        assert lab.post(f"gpumem/api/v1/kernels/{theirs}/orphans/end").status_code == 403
        assert lab.post(f"gpumem/api/v1/kernels/{kid}/orphans/end", {"pids": ["x"]}).status_code == 400
        r = lab.post(f"gpumem/api/v1/kernels/{kid}/orphans/end", {"pids": [job]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["end"]["processes"][0]["ended"] is True, body
        wait_for("the job ended", lambda: gone(job), timeout=15)
    finally:
        try:
            os.kill(job, 9)
        except ProcessLookupError:
            pass

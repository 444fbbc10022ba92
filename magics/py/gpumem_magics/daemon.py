"""Talking to gpumem serve's local API (a unix socket): the driver's
(NVML) figure for this kernel, %gpumem top, the join of %gpumem why's
data with the driver's per-process figures, ending this kernel's worker
processes, and the requests of the out-of-memory report and of snapshots
(sidecar_post)."""

import os

from . import state

# sidecar_get's status when nobody serves the socket.
NOT_RUNNING = -1
# Its status when the socket may be served by someone other than root or
# this kernel's user (vouch.py): nothing was sent; the reply is the line.
UNTRUSTED = -2


def not_running(sock):
    """The one sentence for "gpumem serve is not running", as the JupyterLab
    panel says it when it cannot say more (labextension's
    supervision.reason_nothing_listens)."""
    return (
        f"gpumem serve is not running: nothing listens on {sock}: JupyterLab with jupyterlab-gpumem "
        "installed starts it; elsewhere run `gpumem serve` beside JupyterLab, as the same user"
    )


class _NotRunning(Exception):
    pass


class _Untrusted(Exception):
    pass


def driver_usage(timeout=0.5, fresh=False):
    """Asks gpumem serve (its unix socket API) for this kernel's processes'
    GPU memory: GET /api/v1/kernels/<id> when the Go side passed the kernel
    id (the only request a kernel may make in shared mode), else GET
    /api/v1/notebooks matched by pid. fresh asks for a reading taken now
    rather than the last sample (a report before and after a free).

    Returns None when no sidecar is configured, else a dict with bytes,
    per_gpu and pids, or with error."""
    sock = state.sidecar_socket()
    if not sock:
        return None
    import json

    kid = state.config.get("kernel_id")
    pid = os.getpid()

    def get(path):
        status, body = sidecar_get(path, timeout)
        if status == NOT_RUNNING:
            raise _NotRunning()
        if status == UNTRUSTED:
            raise _Untrusted(request_error(status, body))
        if status == 0:
            raise OSError(body.decode("utf-8", "replace"))
        return status, body

    try:
        if kid:
            from urllib.parse import quote

            status, body = get("/api/v1/kernels/" + quote(kid, safe="") + ("?fresh=1" if fresh else ""))
            if status == 404:
                return {"error": "gpumem serve does not know this kernel (%s) yet" % kid}
            if status != 200:
                return {"error": "gpumem serve answered %d: %s" % (status, api_error(body))}
            nbs, rep = [json.loads(body.decode("utf-8"))], None
        else:
            status, body = get("/api/v1/notebooks")
            if status != 200:
                return {"error": "gpumem serve answered %d: %s" % (status, api_error(body))}
            rep = json.loads(body.decode("utf-8"))
            nbs = rep.get("notebooks") or []
    except _NotRunning:
        return {"error": not_running(sock)}
    except _Untrusted as e:
        return {"error": str(e)}
    except Exception as e:
        return {"error": "gpumem serve did not answer on %s (%s)" % (sock, state.short_exc(e))}
    usage = {"bytes": 0, "per_gpu": [], "pids": [pid]}
    for nb in nbs:
        if (kid and nb.get("kernel_id") == kid) or pid in (nb.get("pids") or []):
            usage = notebook_usage(nb)
            break
    if rep is None and not usage["per_gpu"]:
        # No figure for this kernel: whether the daemon sees a GPU at all
        # is in its report (asked only then: a kernel with figures makes one
        # request).
        rep = _report(timeout)
    if rep is not None:
        usage.update(gpu_note(rep))
    return usage


def _report(timeout):
    """gpumem serve's report (GET /api/v1/notebooks), None when it cannot
    be had: what it says of the GPUs is only a note."""
    import json

    status, body = sidecar_get("/api/v1/notebooks", timeout)
    if status != 200:
        return None
    try:
        return json.loads(body.decode("utf-8"))
    except ValueError:
        return None


# The next step when gpumem serve gives no reason of its own (a shared
# daemon shows a user no warnings); its own reasons carry theirs.
NO_GPU_STEP = ": on a machine with NVIDIA GPUs, check that nvidia-smi works where gpumem serve runs"

SIMULATED = (
    "These GPU figures are simulated (gpumem serve reads a simulated-GPU file, GPUMEM_FAKE_GPU): "
    "they are not this machine's GPUs."
)


def gpu_note(rep):
    """What gpumem serve's report (GET /api/v1/notebooks) says when it has
    no real GPU figure, in one sentence: {"no_gpu": ...} when it sees no
    GPU, why in the daemon's own words (its warnings, such as "no NVIDIA
    driver found", which say the next step), else the next step here; {"simulated": ...} when its GPUs
    are simulated; {} otherwise. Pure."""
    gpus = rep.get("gpus") or []
    if not gpus:
        why = "; ".join(rep.get("warnings") or [])
        return {"no_gpu": why or "gpumem serve sees no GPU on this machine" + NO_GPU_STEP}
    if all(g.get("simulated") for g in gpus):
        return {"simulated": SIMULATED}
    return {}


def notebook_usage(nb):
    """The driver's figures for a notebook of gpumem serve's report, as
    %gpumem shows them. Pure."""
    return {
        "bytes": int(nb.get("gpu_memory_bytes") or 0),
        "per_gpu": [{"index": g.get("index"), "bytes": int(g.get("bytes") or 0)} for g in nb.get("per_gpu") or []],
        "pids": [int(p) for p in nb.get("pids") or []],
        "stray_contexts": nb.get("stray_contexts") or [],
        # Absent (None) when the GPU cannot say: unknown, never 0.
        "utilization": nb.get("utilization"),
        "compute": nb.get("compute"),
    }


def api_error(body):
    try:
        import json

        return str(json.loads(body.decode("utf-8")).get("error"))[:200]
    except Exception:
        return body[:200].decode("utf-8", "replace")


DRIVER_HINT = (
    "The driver's figure for this kernel (what nvidia-smi counts, CUDA context included) "
    "needs the sidecar: run `gpumem serve`, then `gpumem attach` this kernel."
)


def top_data(timeout=1.0):
    """The notebooks (or, in shared mode, the users) holding memory on the
    GPUs this kernel uses, from gpumem serve."""
    if not state.sidecar_socket():
        return {"kind": "top", "error": "%gpumem top needs the sidecar: run `gpumem serve` beside Jupyter"}
    import json

    mine = driver_usage(timeout)
    if mine is None or mine.get("error"):
        return {"kind": "top", "error": (mine or {}).get("error", "gpumem serve did not answer")}
    my_gpus = {g["index"] for g in mine.get("per_gpu", []) if g.get("bytes")}
    status, body = sidecar_get("/api/v1/notebooks", timeout)
    if status != 200:
        return {"kind": "top", "error": request_error(status, body)}
    return top_view(json.loads(body.decode("utf-8")), my_gpus, state.config.get("kernel_id"))


def top_view(rep, gpus_used, kernel_id):
    """%gpumem top's data from gpumem serve's report (GET
    /api/v1/notebooks): the holders of the GPUs in gpus_used (indices), as
    the daemon ranked and named them; kernel_id's own row marked. Pure."""
    note = ""
    if rep.get("view") == "own":
        # A shared daemon shows a user their own holders, and the other
        # users as one holder each.
        note = "gpumem serve runs in shared mode: other users' notebooks are shown as per-user totals."
    gpus = []
    for g in rep.get("gpus") or []:
        if g.get("index") not in gpus_used:
            continue
        holders = []
        for h in g.get("holders") or []:
            name = h.get("name", "")
            if h.get("kind") == "process" and h.get("command"):
                name = "%s: %s" % (name, h["command"])
            elif h.get("kind") == "user":
                n = h.get("notebooks", 0)
                name = "%s (%d notebook%s)" % (name, n, "" if n == 1 else "s")
            holder = {"name": name, "user": h.get("user", ""), "bytes": int(h.get("bytes", 0))}
            if h.get("kind") == "notebook":
                holder["self"] = h.get("kernel_id") == kernel_id
            holders.append(holder)
        gpus.append(
            {
                "index": g.get("index"),
                "name": g.get("name", ""),
                "used": g.get("memory_used_bytes", 0),
                "total": g.get("memory_total_bytes", 0),
                "holders": holders,
            }
        )
    return dict({"kind": "top", "gpus": gpus, "note": note}, **gpu_note(rep))


def why_join(data, timeout=5.0):
    """%gpumem why's data joined by gpumem serve with the driver's figures
    (POST /api/v1/kernels/<id>/why); without the sidecar, data with a hint."""
    if not state.sidecar_socket() or not state.config.get("kernel_id"):
        return dict(data, driver_hint=DRIVER_HINT)
    joined, err = _post_kernel("why", data, timeout)
    if err:
        return dict(data, driver={"error": err})
    return joined


def children_before(timeout=10.0):
    """Asks gpumem serve to read this kernel's tree's figures now, before
    its teardown (POST /api/v1/kernels/<id>/children/before): what the
    teardown ends is known only from figures read before it. (reply, error):
    the reply's left_running are the workers it would leave running for
    what they compute; (None, None) without the sidecar."""
    if not state.sidecar_socket() or not state.config.get("kernel_id"):
        return None, None
    return _post_kernel("children/before", None, timeout)


def free_children(timeout=90.0, pids=None):
    """Asks gpumem serve to end this kernel's GPU-holding worker processes
    (POST /api/v1/kernels/<id>/children/free): the idle ones, or only pids,
    confirmed by the user, whatever they compute. None without the
    sidecar."""
    if not state.sidecar_socket() or not state.config.get("kernel_id"):
        return None
    rep, err = _post_kernel("children/free", {"pids": list(pids)} if pids else None, timeout)
    return {"error": err} if err else rep


def request_error(status, reply):
    """What a failed sidecar_request says to the user, in one sentence:
    nobody serves the socket (the panel's words), it did not answer, or
    what it answered."""
    if status == NOT_RUNNING:
        return not_running(state.sidecar_socket())
    if status == UNTRUSTED:
        return "gpumem: " + reply.decode("utf-8", "replace")
    if status == 0:
        return "gpumem serve did not answer on %s (%s)" % (state.sidecar_socket(), reply.decode("utf-8", "replace")[:200])
    return "gpumem serve answered %d: %s" % (status, api_error(reply))


def _post_kernel(what, body, timeout):
    import json
    from urllib.parse import quote

    path = "/api/v1/kernels/%s/%s" % (quote(state.config["kernel_id"], safe=""), what)
    raw = None if body is None else json.dumps(body).encode("utf-8")
    status, reply = sidecar_request("POST", path, timeout, raw)
    if status != 200:
        return None, request_error(status, reply)
    try:
        return json.loads(reply.decode("utf-8")), None
    except ValueError as e:
        return None, "gpumem serve's reply is not JSON: %s" % state.short_exc(e)


def sidecar_get(path, timeout):
    return sidecar_request("GET", path, timeout)


def sidecar_post(path, body, timeout):
    """POSTs body (a dict, as JSON) to gpumem serve; (status, reply bytes),
    status 0 when it did not answer."""
    import json

    return sidecar_request("POST", path, timeout, json.dumps(body).encode("utf-8"))


def sidecar_request(method, path, timeout, body=None):
    """(status, reply bytes): NOT_RUNNING when nobody serves the socket,
    UNTRUSTED (the reply: the line why) when root or this kernel's user may
    not be what serves it, 0 when it did not answer."""
    import http.client

    from . import vouch

    sock = state.sidecar_socket()

    class _UnixConn(http.client.HTTPConnection):
        def connect(self):
            # The path, then the peer of this very connection (vouch.py).
            self.sock = vouch.Voucher().connect(sock, timeout)

    conn = _UnixConn("local-gpumem.sock", timeout=timeout)
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except vouch.Untrusted as e:
        return UNTRUSTED, str(e).encode()
    except (FileNotFoundError, ConnectionRefusedError) as e:
        # No socket, or one that nobody listens on: the daemon is not running.
        return NOT_RUNNING, str(e).encode()
    except Exception as e:
        return 0, str(e).encode()
    finally:
        conn.close()

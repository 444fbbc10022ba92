"""What this server's users may see of the daemon's history reply: this
server's kernels in full, everyone else only as per-user totals. Pure."""


def _bytes_on(per_gpu):
    return {int(g.get("index", 0)): int(g.get("bytes", 0)) for g in per_gpu or []}


def server_view(history, own_kernels, paths, known_kernels=()):
    """Shapes GET /api/v1/history's reply for the browser.

    own_kernels: the kernel ids of this server's kernel manager.
    paths: kernel id -> the notebook's path relative to the server's root
    (from its sessions), for "Open".
    known_kernels: kernel ids this server ran earlier (shut down since): the
    processes gpumem serve left running for them are still this server's
    to hear about and end.
    """
    report = history.get("report") or {}
    notebooks, others = [], {}

    def other(user):
        u = others.get(user)
        if u is None:
            u = others[user] = {
                "user": user,
                "notebooks": 0,
                "processes": 0,
                "bytes": 0,
                "per_gpu": {},
            }
        return u

    for nb in report.get("notebooks") or []:
        kid = nb.get("kernel_id", "")
        if kid in own_kernels:
            nb = dict(nb)
            nb["path"] = paths.get(kid, "")
            notebooks.append(nb)
            continue
        u = other(nb.get("user") or "unknown")
        u["notebooks"] += 1
        u["bytes"] += int(nb.get("gpu_memory_bytes", 0))
        for idx, b in _bytes_on(nb.get("per_gpu")).items():
            u["per_gpu"][idx] = u["per_gpu"].get(idx, 0) + b
    for p in report.get("other") or []:
        u = other(p.get("user") or "unknown")
        u["processes"] += 1
        for idx, b in _bytes_on(p.get("per_gpu")).items():
            u["bytes"] += b
            u["per_gpu"][idx] = u["per_gpu"].get(idx, 0) + b
    # Other users' totals, when the daemon shows this server's user only
    # their own notebooks (shared mode).
    for t in history.get("users") or []:
        u = other(t.get("user") or "unknown")
        u["notebooks"] += int(t.get("notebooks", 0))
        u["processes"] += int(t.get("other_processes", 0))
        u["bytes"] += int(t.get("gpu_memory_bytes", 0))
        for idx, b in _bytes_on(t.get("per_gpu")).items():
            u["per_gpu"][idx] = u["per_gpu"].get(idx, 0) + b
    users = sorted(others.values(), key=lambda u: (-u["bytes"], u["user"]))
    for u in users:
        u["per_gpu"] = [{"index": i, "bytes": b} for i, b in sorted(u["per_gpu"].items())]
    return {
        "status": "ok",
        "now": history.get("now", 0),
        "step_seconds": history.get("step_seconds", 1),
        "alert_threshold": history.get("alert_threshold", 0),
        "gpus": report.get("gpus") or [],
        "notebooks": notebooks,
        "others": users,
        "warnings": report.get("warnings") or [],
        "series": {
            "gpus": history.get("gpus") or [],
            "notebooks": [s for s in history.get("notebooks") or [] if s.get("id") in own_kernels],
            "notebook_sm": [s for s in history.get("notebook_sm") or [] if s.get("id") in own_kernels],
        },
        "events": [
            e
            for e in history.get("events") or []
            if e.get("kernel_id") in own_kernels or (e.get("kind") == "left_running" and e.get("kernel_id") in known_kernels)
        ],
        "left_running": [
            lr
            for lr in report.get("left_running") or []
            if lr.get("kernel_id") in own_kernels or lr.get("kernel_id") in known_kernels
        ],
        "last_event": history.get("last_event", 0),
    }


def no_daemon(daemon_status):
    """The reply when nothing serves the socket: the supervisor's status
    (supervision.describe) says why, in one line."""
    text = daemon_status.get("text", "")
    if daemon_status.get("case") != "not_running":
        # It served a moment ago (the supervisor checks once a second).
        text = "gpumem serve stopped answering; " + text
    return {"status": "no_daemon", "message": text, "daemon": daemon_status}


def daemon_error(status, message, socket):
    if status == 403:
        text = f"gpumem serve at {socket} refused this server ({message}): run gpumem serve as the user who runs JupyterLab."
    else:
        text = "gpumem serve at %s answered %d: %s" % (socket, status, message)
    return {"status": "error", "message": text}

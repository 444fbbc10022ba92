"""What this server's users may see of the daemon's history reply: this
server's kernels in full, everyone else only as the daemon's per-user
totals. A filter by identity, pure: every figure and sentence is gpumem
serve's."""


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
    notebooks = []
    for nb in report.get("notebooks") or []:
        kid = nb.get("kernel_id", "")
        if kid in own_kernels:
            nb = dict(nb)
            nb["path"] = paths.get(kid, "")
            notebooks.append(nb)
    return {
        "status": "ok",
        "now": history.get("now", 0),
        "step_seconds": history.get("step_seconds", 1),
        "alert_threshold": history.get("alert_threshold", 0),
        # Who holds each GPU names other servers' notebooks and processes'
        # commands: the alerts carry what this server shows of them.
        "gpus": [{k: v for k, v in g.items() if k not in ("holders", "holders_by_user")} for g in report.get("gpus") or []],
        "notebooks": notebooks,
        # Asked with kernels= (this server's): the daemon totals the rest.
        "others": history.get("others") or [],
        "alerts": own_alerts(report.get("alerts"), own_kernels, known_kernels),
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


def own_alerts(alerts, own_kernels, known_kernels=()):
    """The daemon's alerts this server shows: every GPU's (listing only this
    server's kernels, which its "free cache" action frees), and a kernel's
    own when the kernel is this server's (or was: a process left running)."""
    out = []
    for a in alerts or []:
        mine = [k for k in a.get("kernels") or [] if k in own_kernels]
        ran = [k for k in a.get("kernels") or [] if k in known_kernels]
        if a.get("kind") == "threshold" or mine or (a.get("kind") == "left_running" and ran):
            out.append(dict(a, kernels=mine))
    return out


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
    elif status == 422:
        # The daemon's refusal of what was asked: its sentence says why.
        text = f"gpumem serve: {message}"
    else:
        text = "gpumem serve at %s answered %d: %s" % (socket, status, message)
    return {"status": "error", "message": text}

"""The pre_run_cell hook that prints, once per alert, gpumem serve's line
about a GPU this kernel uses being nearly full or this kernel being culled."""

import os

from . import state

_alert_state = {"mtime": None, "shown": set(), "refused": None}


def _alert_file():
    """The file gpumem serve told this kernel to read; else, beside the
    socket, this user's own file of a shared daemon (its dir there), or a
    private daemon's one file."""
    f = state.config.get("alert_file")
    if f:
        return f
    sock = state.sidecar_socket()
    if not sock:
        return None
    per_user = os.path.join(os.path.dirname(sock), "gpumem-alerts")
    if os.path.isdir(per_user):
        return os.path.join(per_user, "%d.json" % os.getuid())
    return os.path.join(os.path.dirname(sock), "gpumem-alerts.json")


def alert_hook(*_args):
    """pre_run_cell: prints, once per alert, gpumem serve's line about a GPU
    this kernel uses being nearly full, or about this kernel being culled
    unless used: the daemon's sentence as it wrote it, after the one
    "gpumem: " that says whose line it is. It costs one stat() per cell; it
    never raises into the user's cell."""
    try:
        path = _alert_file()
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime == _alert_state["mtime"]:
            return
        _alert_state["mtime"] = mtime
        import json

        from . import vouch

        # Whoever writes the file writes the line printed in the notebook:
        # root's or this user's only (the daemon's), as for its socket.
        try:
            vouch.Voucher().check_path(path, what="alert file")
        except vouch.Untrusted as e:
            if _alert_state["refused"] != str(e):  # said once, not every cell
                _alert_state["refused"] = str(e)
                print("gpumem: " + str(e))
            return
        _alert_state["refused"] = None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        kid = state.config.get("kernel_id")
        for a in doc.get("alerts") or []:
            aid = a.get("id")
            if aid in _alert_state["shown"] or (kid and kid not in (a.get("kernels") or [])):
                continue
            _alert_state["shown"].add(aid)
            print("gpumem: " + str(a.get("message", "")))
    except Exception:
        pass

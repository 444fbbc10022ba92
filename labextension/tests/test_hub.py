"""GPUArbiter's I/O against a real gpumem serve (simulated GPU), a real
JupyterLab and a real kernel: the facts it fetches, what it remembers of a
kernel's idleness from one round to the next, that a new daemon makes it
start again, and the veto when nothing serves the socket. The culler's
clock is played by the arbiter's clock argument."""

import asyncio
import getpass
import logging
from datetime import datetime, timedelta, timezone

from harness import GiB, wait_for
from jupyterlab_gpumem.hub import GPUArbiter


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def judged(stack, kid, state, held):
    """Waits until the daemon judges kid's tree state while it holds held,
    its server reporting it idle (the daemon's own requests on attach make
    it busy for a moment)."""

    def check():
        for nb in stack.daemon_get("/api/v1/notebooks").json()["notebooks"]:
            act = nb.get("activity") or {}
            if nb["kernel_id"] != kid or nb["gpu_memory_bytes"] != held or act.get("execution_state") != "idle":
                continue
            if (nb.get("compute") or {}).get("state") == state:
                return nb

    return wait_for("the daemon to judge kernel %s %s, holding %d" % (kid, state, held), check, timeout=60)


def test_arbiter_against_the_daemon(stack):
    lab = stack.server(app="jupyter_server")
    lab.notebook("hoard.ipynb")
    kid = lab.start_session("hoard.ipynb")
    flags = ("--interval=300ms", "--compute-window=2s")
    stack.start_daemon(*flags)
    stack.set_gpu({stack.kernel_pid(kid): 8 * GiB})
    judged(stack, kid, "idle", 8 * GiB)

    now = [datetime.now(timezone.utc)]
    log = logging.getLogger("test_hub_arbiter")
    lines = Lines()
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    arbiter = GPUArbiter(
        socket=str(stack.socket), gpu_idle_after=3600, gpu_idle_min_bytes=4 * GiB, cache_seconds=0, log=log, clock=lambda: now[0]
    )
    # This server, as the hub would name it: this user's, at base URL /.
    server = {"name": "", "full_name": getpass.getuser() + "/", "url": "/", "ready": True}

    def ask():
        return asyncio.run(arbiter(inactive=timedelta(minutes=1), inactive_limit=8 * 3600, server=server))

    assert ask() is False
    assert "GPU-idle rule: computed nothing for 00:00:00 of 01:00:00" in lines.lines[-1], lines.lines
    assert "gpu_memory_bytes=%d" % (8 * GiB) in lines.lines[-1]
    now[0] += timedelta(hours=2)
    assert ask() is True, lines.lines
    assert "computed nothing on any GPU for 02:00:00" in lines.lines[-1]

    # A new daemon saw none of it: the arbiter starts again.
    stack.stop_daemon()
    stack.start_daemon(*flags)
    judged(stack, kid, "idle", 8 * GiB)
    assert ask() is False, lines.lines
    assert "computed nothing for 00:00:00" in lines.lines[-1], lines.lines

    # Its kernel computes: vetoed, with the daemon's reason.
    stack.set_gpu({stack.kernel_pid(kid): 8 * GiB}, sm_by_pid={stack.kernel_pid(kid): 70})
    judged(stack, kid, "computing", 8 * GiB)
    now[0] += timedelta(hours=30)
    assert asyncio.run(arbiter(inactive=timedelta(hours=30), inactive_limit=3600, server=server)) is False
    assert "computes on a GPU: " in lines.lines[-1] and "rule=veto" in lines.lines[-1], lines.lines

    # Nothing serves the socket: vetoed, saying so.
    stack.stop_daemon()
    assert asyncio.run(arbiter(inactive=timedelta(hours=30), inactive_limit=3600, server=server)) is False
    assert any("nothing serves %s" % stack.socket in line and "every cull is vetoed" in line for line in lines.lines), lines.lines
    assert "veto cull of" in lines.lines[-1] and "cannot ask the gpumem daemon" in lines.lines[-1], lines.lines


def test_bad_settings_are_refused():
    for kwargs in ({"gpu_idle_after": -1}, {"gpu_idle_min_bytes": -1}):
        try:
            GPUArbiter(**kwargs)
        except ValueError as e:
            assert "0 or more" in str(e)
        else:
            raise AssertionError("GPUArbiter(%r) was accepted" % (kwargs,))


def test_what_an_unreachable_socket_says():
    a = GPUArbiter(socket="/run/gpumem/gpumem.sock")
    assert "may not be opened by this culler" in a._unreachable(PermissionError(13, "Permission denied"))
    said = a._unreachable(ConnectionRefusedError(111, "Connection refused"))
    assert said.startswith("nothing serves /run/gpumem/gpumem.sock ([Errno 111] Connection refused): start the root daemon"), said

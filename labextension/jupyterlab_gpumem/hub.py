"""A GPU-aware arbiter for jupyterhub-idle-culler 2.x: its
cull_arbiter_hook, asking the root gpumem daemon (`gpumem serve
--all-users --socket-mode shared`) about each server before a cull.

In the culler's config file (idle_culler_config.py in its working dir, or
--config=FILE):

    from jupyterlab_gpumem.hub import GPUArbiter
    c.IdleCuller.cull_arbiter_hook = GPUArbiter(gpu_idle_after=3600, gpu_idle_min_bytes=8 << 30)

It vetoes a cull while a kernel of the server runs a cell or a process of
its tree computes on a GPU, allows the culler's own rule otherwise and,
with gpu_idle_after set, culls earlier a server holding at least
gpu_idle_min_bytes that computed nothing on any GPU for that long. When it
cannot ask the daemon, or the daemon shows it only its own user's kernels
(the culler must run as root or as the daemon's user), it vetoes and says
why. The decision is hubpolicy.decide's; this module fetches its facts
once a round, keeps what it saw of each kernel's idleness across rounds,
and logs every decision with its evidence.
"""

import asyncio
import logging
import os
import socket as sockets
import struct
import time
from datetime import datetime, timezone

import httpx

from . import hubpolicy
from .daemon import Daemon, DaemonError, NoDaemon

# Where docs/shared-host.md puts the root daemon's socket.
DEFAULT_SOCKET = "/run/gpumem/gpumem.sock"


def culler_now():
    """The culler's clock, jupyterhub_idle_culler.utcnow, looked up at each
    call: a patch of it (the culler's own tests travel in time so) moves the
    arbiter's GPU-idle clock with the culler's inactivity."""
    try:
        import jupyterhub_idle_culler
    except ImportError:
        return datetime.now(timezone.utc)
    return jupyterhub_idle_culler.utcnow()


def daemon_instance(path, timeout):
    """The daemon process serving path, as (pid, start time): its
    SO_PEERCRED (that of the process that listens) and /proc/<pid>/stat's
    field 22. A new daemon knows nothing of the GPU work the last one saw,
    so what the arbiter remembers of each kernel's idleness is dropped."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        cred = s.getsockopt(sockets.SOL_SOCKET, sockets.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", cred)[0]
    try:
        with open("/proc/%d/stat" % pid) as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = ""
    return pid, start


class GPUArbiter:
    """The hook: an async callable (inactive, inactive_limit, server) ->
    whether to cull, as jupyterhub-idle-culler 2.x calls it.

    socket: the daemon's (default $GPUMEM_SOCKET, else DEFAULT_SOCKET);
    gpu_idle_after: seconds without GPU work after which a server holding at
    least gpu_idle_min_bytes is culled (0: the GPU-idle rule is off);
    system_user: hub user name -> the system account its kernels run as
    (default: the same name, as LocalProcessSpawner has it); timeout: per
    request to the daemon; cache_seconds: how long one fetch serves a round's
    servers; log: default the culler's own logger; clock: default the
    culler's."""

    def __init__(
        self,
        socket=None,
        gpu_idle_after=0,
        gpu_idle_min_bytes=0,
        system_user=None,
        timeout=10.0,
        cache_seconds=5.0,
        log=None,
        clock=None,
    ):
        if gpu_idle_after < 0 or gpu_idle_min_bytes < 0:
            raise ValueError("GPUArbiter: gpu_idle_after and gpu_idle_min_bytes must be 0 or more (seconds, bytes)")
        self.socket = socket or os.environ.get("GPUMEM_SOCKET") or DEFAULT_SOCKET
        self.rules = hubpolicy.Rules(gpu_idle_after=float(gpu_idle_after), gpu_idle_min_bytes=int(gpu_idle_min_bytes))
        self.system_user = system_user
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        # traitlets names an Application's logger after its class.
        self.log = log or logging.getLogger("IdleCuller")
        self.clock = clock or culler_now
        self._idle_since = {}
        self._instance = None  # the daemon whose facts _idle_since rests on
        self._facts = None
        self._fetched_at = 0.0
        self._lock = None

    async def __call__(self, inactive, inactive_limit, server, **kwargs):
        try:
            facts = await self.facts()
            d = hubpolicy.decide(server, facts, inactive, inactive_limit, self.clock(), self.rules, self.system_user)
        except Exception as e:  # noqa: BLE001  (a bug here must veto, never cull)
            self.log.exception(
                "gpumem: veto cull of %s: the arbiter failed (%r): nothing is culled on missing facts", server.get("url"), e
            )
            return False
        (self.log.warning if d.rule == "veto" and (facts.error or d.user == "") else self.log.info)("%s", d.line())
        return d.cull

    async def facts(self):
        """The daemon's facts for this round: one fetch serves the servers
        the culler asks about within cache_seconds (it asks about them all
        at once)."""
        # A lock of this loop: one made in another (a test's earlier
        # asyncio.run) cannot be waited on here.
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        async with self._lock[1]:
            if self._facts is None or time.monotonic() - self._fetched_at >= self.cache_seconds:
                self._facts = await self._fetch()
                self._fetched_at = time.monotonic()
            return self._facts

    async def _fetch(self):
        # A client per fetch: a round's event loop may not be the next one's.
        daemon = Daemon(self.socket, timeout=self.timeout)
        try:
            if not os.path.exists(self.socket):
                raise NoDaemon(self.socket)
            try:
                instance = await asyncio.to_thread(daemon_instance, self.socket, self.timeout)
            except OSError as e:
                raise NoDaemon(self.socket) from e
            report = await daemon.request("GET", "/api/v1/notebooks")
            kernels = await daemon.request("GET", "/api/v1/kernels")
        except NoDaemon as e:
            return self._failed(self._unreachable(e.__cause__))
        except DaemonError as e:
            return self._failed("the daemon at %s answered %d: %s" % (self.socket, e.status, e.message))
        except (httpx.HTTPError, OSError, ValueError) as e:
            return self._failed("asking the daemon at %s failed: %r" % (self.socket, e))
        finally:
            await daemon.close()
        if not isinstance(report, dict) or not isinstance(kernels, dict):
            return self._failed("the daemon at %s sent no report (%s)" % (self.socket, type(report).__name__))
        if instance != self._instance:
            self._idle_since, self._instance = {}, instance
        urls = {k.get("connection_file", ""): k.get("server_url", "") for k in kernels.get("kernels") or []}
        self._idle_since = hubpolicy.track(self._idle_since, report, self.clock())
        return hubpolicy.Facts(report=report, server_urls=urls, idle_since=dict(self._idle_since))

    def _unreachable(self, cause):
        """What to say of a socket that could not be reached."""
        sock = self.socket
        if isinstance(cause, PermissionError):
            how = "run the culler as root, or the daemon with --socket-mode shared"
            return "%s may not be opened by this culler (uid %d): %s" % (sock, os.geteuid(), how)
        how = "start the root daemon (gpumem serve --all-users --socket-mode shared --socket %s)" % sock
        return "nothing serves %s (%s): %s" % (sock, cause or "no such socket", how)

    def _failed(self, error):
        # What the daemon said before the gap does not cover the gap.
        self._idle_since, self._instance = {}, None
        self.log.warning("gpumem: %s; every cull is vetoed until the daemon answers", error)
        return hubpolicy.Facts(error=error)

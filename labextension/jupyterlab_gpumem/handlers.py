"""Handlers under {base_url}gpumem/api/v1/: Jupyter's authentication and
XSRF checks apply (APIHandler), then the request goes to the daemon.

The browser never sees an HTTP error for "the daemon is not running": the
reply is 200 with a status the front end shows in one line, so nothing is
logged in the browser's console.
"""

import asyncio
import json
import re

import tornado.web
from jupyter_server.utils import url_path_join

from . import snapshots, view
from .base import KERNEL_ID, BaseHandler, KernelHandler
from .daemon import Daemon


class StateHandler(BaseHandler):
    """GET state?since=&events_after=&wait=: GPUs, this server's notebooks,
    other users' totals, the series since a time and new events. With wait=1
    the daemon answers after its next sample (long poll).

    Tabs asking the same question at the same time share one request to the
    daemon and one reply: every tab of a server waits for the same next
    sample, so however many tabs are open the daemon sees about one request
    a sample from this server."""

    @tornado.web.authenticated
    async def get(self):
        params = {}
        if self.get_argument("wait", "") == "1":
            params["wait"] = "1"
        for name in ("since", "events_after"):
            v = self.get_argument(name, "")
            if v:
                if not re.fullmatch(r"\d{1,12}", v):
                    raise tornado.web.HTTPError(400, f"{name} must be a whole number")
                params[name] = v
        shared = self.settings["gpumem_inflight"]
        key = tuple(sorted(params.items()))
        task = shared.get(key)
        if task is None:
            task = asyncio.ensure_future(self._state(params))
            shared[key] = task

            def forget(t, key=key):
                if shared.get(key) is t:
                    del shared[key]

            task.add_done_callback(forget)
        status, body = await asyncio.shield(task)
        self.reply(status, body)

    async def _state(self, params):
        own = self.own_kernel_ids()
        # The daemon totals everyone else per user: this server's kernels
        # are the ones it leaves out.
        params = dict(params, kernels=",".join(sorted(own)))
        hist, failed = await self.daemon_json("GET", "/api/v1/history", params=params)
        if failed:
            return failed
        paths = {}
        for s in await self.session_manager.list_sessions():
            k = (s.get("kernel") or {}).get("id")
            if k:
                paths[k] = s.get("path", "")
        body = view.server_view(hist, own, paths, self.known_kernel_ids())
        body["daemon_requests"] = self.daemon.requests
        body["daemon"] = self.daemon_status
        return 200, body


class FreeHandler(KernelHandler):
    """POST kernels/{id}/free: cache-only free (no variable is touched)."""

    @tornado.web.authenticated
    async def post(self, kernel_id):
        self.check_own(kernel_id)
        # No body is sent: the daemon then frees caches only.
        rep = await self.call_daemon("POST", f"/api/v1/kernels/{kernel_id}/free", timeout=60)
        if rep is not None:
            self.reply(200, {"status": "ok", "free": rep})


class KeepHandler(KernelHandler):
    """POST kernels/{id}/keep: the cull warning's "Keep it". The daemon
    counts it as use of the kernel, and says so in its sentence."""

    @tornado.web.authenticated
    async def post(self, kernel_id):
        self.check_own(kernel_id)
        rep = await self.call_daemon("POST", f"/api/v1/kernels/{kernel_id}/keep", timeout=10)
        if rep is not None:
            self.reply(200, {"status": "ok", "keep": rep})


def pids_body(raw, what):
    """The {"pids": [...]} body of a request that ends processes, or None
    for none named; HTTPError 400 for anything else."""
    if not raw:
        return None
    try:
        req = json.loads(raw)
        pids = req.get("pids", [])
        if not isinstance(pids, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids):
            raise ValueError("pids must be a list of process ids")
    except (ValueError, AttributeError) as e:
        raise tornado.web.HTTPError(400, f"{what}: {e}") from e
    return {"pids": pids} if pids else None


class ChildrenHandler(KernelHandler):
    """POST kernels/{id}/children/free, body {"pids": [...]} (optional): end
    the kernel's idle GPU-holding worker processes, or the pids the user
    confirmed (computing or not), never the kernel, through the daemon."""

    @tornado.web.authenticated
    async def post(self, kernel_id):
        self.check_own(kernel_id)
        body = pids_body(self.request.body, "children/free")
        rep = await self.call_daemon("POST", f"/api/v1/kernels/{kernel_id}/children/free", timeout=120, body=body)
        if rep is not None:
            self.reply(200, {"status": "ok", "children": rep})


class EndOrphansHandler(KernelHandler):
    """POST kernels/{id}/orphans/end, body {"pids": [...]} (optional): ends
    processes gpumem serve left running for one of this server's kernels
    (now or earlier). The daemon checks each as reclaim does, and the
    caller: this server's user."""

    @tornado.web.authenticated
    async def post(self, kernel_id):
        if kernel_id not in self.known_kernel_ids():
            raise tornado.web.HTTPError(403, f"kernel {kernel_id} is not one of this server's kernels")
        body = pids_body(self.request.body, "orphans/end")
        rep = await self.call_daemon("POST", f"/api/v1/kernels/{kernel_id}/orphans/end", timeout=60, body=body)
        if rep is not None:
            self.reply(200, {"status": "ok", "end": rep})


class QueryHandler(KernelHandler):
    """GET kernels/{id}/vars, /summary or /why: read silently through the
    daemon."""

    @tornado.web.authenticated
    async def get(self, kernel_id, what):
        self.check_own(kernel_id)
        params = {"all_devices": "1"} if what in ("vars", "why") and self.get_argument("all_devices", "") == "1" else None
        rep = await self.call_daemon("GET", f"/api/v1/kernels/{kernel_id}/{what}", params=params, timeout=30)
        if rep is not None:
            self.reply(200, {"status": "ok", what: rep})


def setup_handlers(serverapp, supervisor):
    web_app = serverapp.web_app
    web_app.settings["gpumem_daemon"] = Daemon(supervisor.socket)
    web_app.settings["gpumem_supervisor"] = supervisor
    web_app.settings["gpumem_inflight"] = {}
    web_app.settings["gpumem_known_kernels"] = {}
    base = url_path_join(web_app.settings["base_url"], "gpumem", "api", "v1")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "state"), StateHandler),
            (url_path_join(base, "kernels", KERNEL_ID, "free"), FreeHandler),
            (url_path_join(base, "kernels", KERNEL_ID, "keep"), KeepHandler),
            (url_path_join(base, "kernels", KERNEL_ID, "orphans", "end"), EndOrphansHandler),
            (
                url_path_join(base, "kernels", KERNEL_ID, r"(?P<what>vars|summary|why)"),
                QueryHandler,
            ),
            (url_path_join(base, "kernels", KERNEL_ID, "children", "free"), ChildrenHandler),
        ]
        + snapshots.handlers(base),
    )

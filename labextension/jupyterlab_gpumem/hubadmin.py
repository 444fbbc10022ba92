"""The hub admins' page of the whole GPU box: a JupyterHub service, signed
in through the hub's OAuth and open to the hub's admins alone, that shows
every user, their servers and notebooks, the GPU memory each holds per
GPU, what computes, what was held idle over the daemon's window and what
the culler plans, from the root gpumem daemon's finished report
(hubview.py places it); its actions (free a notebook's caches, stop a
server) go through gpumem's API and the hub's, each confirmed, then
logged with the admin's name.

In jupyterhub_config.py (the hub run as root; see docs/shared-host.md):

    c.JupyterHub.services.append({
        "name": "gpumem",
        "url": "http://127.0.0.1:10101",
        "command": [sys.executable, "-m", "jupyterlab_gpumem.hubadmin", "--cull-timeout=28800"],
        "oauth_no_confirm": True,
    })
    c.JupyterHub.load_roles.append({
        "name": "gpumem", "services": ["gpumem"],
        "scopes": ["list:users", "read:users", "read:servers", "admin:servers"],
    })

Admins reach it at /services/gpumem/ (the hub's admin role holds
access:services). Anyone else gets 403: the hub refuses them the service,
and the service asks the hub, with its own token, whether the signed-in
user is an admin before it answers anything.
"""

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timezone
from urllib.parse import quote, urlparse

import httpx
from tornado import ioloop, web
from tornado.httpserver import HTTPServer

from . import hubview
from .daemon import Daemon, DaemonError, NoDaemon
from .hub import DEFAULT_SOCKET, GPUArbiter

log = logging.getLogger("gpumem-admin")


class HubAPI:
    """The hub's REST API, with the service's own token."""

    def __init__(self, api_url, token, timeout=10.0):
        self._client = httpx.AsyncClient(
            base_url=api_url.rstrip("/") + "/",
            headers={"Authorization": "token " + token},
            timeout=timeout,
            trust_env=False,
        )

    async def get(self, path, **params):
        r = await self._client.get(path, params=params)
        r.raise_for_status()
        return r.json()

    async def users(self):
        """Every user model, servers included (the hub pages its list)."""
        out, limit = [], 200
        while True:
            page = await self.get("users", offset=len(out), limit=limit)
            out += page
            if len(page) < limit:
                return out

    async def is_admin(self, name):
        return bool((await self.get("users/" + quote(name, safe=""))).get("admin"))

    async def stop(self, user, server):
        """Asks the hub to stop user's server (the default one for ""); its
        status: 204 stopped, 202 stopping."""
        path = "users/%s/server" % quote(user, safe="")
        if server:
            path = "users/%s/servers/%s" % (quote(user, safe=""), quote(server, safe=""))
        r = await self._client.delete(path)
        r.raise_for_status()
        return r.status_code


class Admin:
    """The service's state: the arbiter (its facts and what it saw of each
    kernel's idleness), the hub's API and the culler's timeout."""

    def __init__(self, arbiter, hub, cull_limit):
        self.arbiter = arbiter
        self.hub = hub
        self.cull_limit = cull_limit

    async def view(self):
        now = datetime.now(timezone.utc)
        facts = await self.arbiter.facts()
        users = await self.hub.users()
        return hubview.build(facts, users, now, self.cull_limit, self.arbiter.rules, self.arbiter.system_user)

    async def free(self, nb):
        daemon = Daemon(self.arbiter.socket, timeout=self.arbiter.timeout)
        try:
            # No body: caches only, no variable is deleted.
            return await daemon.request(
                "POST",
                "/api/v1/kernels/%s/free" % quote(nb.kernel_id, safe=""),
                params={"connection_file": nb.connection_file},
                timeout=120,
            )
        finally:
            await daemon.close()


def _hub_oauth_base():
    # Imported here: jupyterhub is the hub's dependency, not every
    # JupyterLab's, and only this service needs it.
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated

    return HubOAuthenticated, HubOAuthCallbackHandler


HubOAuthenticated, HubOAuthCallbackHandler = _hub_oauth_base()

FLASH = "gpumem-admin-flash"


class AdminHandler(HubOAuthenticated, web.RequestHandler):
    """Signed in through the hub, then an admin as the hub says, or 403."""

    def initialize(self, admin, prefix):
        self.admin = admin
        self.prefix = prefix

    async def who(self):
        user = self.current_user
        name = (user or {}).get("name", "")
        if not name or (user or {}).get("kind", "user") != "user" or not await self.admin.hub.is_admin(name):
            log.warning(
                "gpumem-admin: refused %s %s to %r: not one of the hub's admins", self.request.method, self.request.path, name
            )
            raise web.HTTPError(
                403, "the GPU box page is for the hub's admins; your own notebooks are in JupyterLab's GPU memory panel"
            )
        return name

    def write_error(self, status_code, **kwargs):
        reason = self._reason
        exc = kwargs.get("exc_info")
        if exc and isinstance(exc[1], web.HTTPError) and exc[1].log_message:
            reason = exc[1].log_message
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish("%d: %s\n" % (status_code, reason))

    def page(self, html):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
        self.finish(html)


class PageHandler(AdminHandler):
    @web.authenticated
    async def get(self):
        name = await self.who()
        flash = None
        raw = self.get_signed_cookie(FLASH, max_age_days=1)
        if raw:
            self.clear_cookie(FLASH, path=self.prefix)
            try:
                ok, msg = json.loads(raw)
                flash = (bool(ok), str(msg))
            except ValueError:
                flash = None
        view = await self.admin.view()
        self.page(hubview.render(view, self.prefix, self.xsrf_form_html(), name, flash))


class ViewHandler(AdminHandler):
    """The page's view as JSON, for an admin's scripts."""

    @web.authenticated
    async def get(self):
        await self.who()
        view = await self.admin.view()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(hubview.to_json(view)))


class ActionHandler(AdminHandler):
    """POST action=free|stop: without confirm=yes, the confirmation page;
    with it, the action, logged, then back to the page with its outcome."""

    @web.authenticated
    async def post(self):
        name = await self.who()
        action = self.get_body_argument("action", "")
        user = self.get_body_argument("user", "")
        confirmed = self.get_body_argument("confirm", "") == "yes"
        view = await self.admin.view()
        if action == "free":
            kid = self.get_body_argument("kernel_id", "")
            cf = self.get_body_argument("connection_file", "")
            nb = hubview.find_notebook(view, user, cf, kid)
            if nb is None:
                return self.done(False, "%s's kernel %s (%s) is no longer on the page: nothing was freed" % (user, kid, cf))
            fields = {"action": "free", "user": user, "kernel_id": kid, "connection_file": cf}
            if not confirmed:
                return self.confirm(name, hubview.describe_free(user, nb), fields, "Free the caches")
            await self.free(name, user, nb)
        elif action == "stop":
            server = self.get_body_argument("server", "")
            s = hubview.find_server(view, user, server)
            if s is None:
                return self.done(False, "%s has no server %r running: nothing was stopped" % (user, server))
            if not confirmed:
                fields = {"action": "stop", "user": user, "server": server}
                return self.confirm(name, hubview.describe_stop(user, s), fields, "Stop the server")
            await self.stop(name, user, s)
        else:
            raise web.HTTPError(400, "unknown action %r: want free or stop" % action)

    def confirm(self, admin, what, fields, button):
        self.page(hubview.render_confirm(self.prefix, self.xsrf_form_html(), admin, what, fields, button))

    async def free(self, admin, user, nb):
        try:
            reply = await self.admin.free(nb)
        except (NoDaemon, DaemonError, httpx.HTTPError, OSError) as e:
            msg = getattr(e, "message", "") or str(e) or type(e).__name__
            log.warning("gpumem-admin: %s's free of %s's %s (kernel %s) failed: %s", admin, user, nb.name, nb.kernel_id, msg)
            return self.done(False, "Freeing %s's %s failed: %s" % (user, nb.name, msg))
        summary = (reply or {}).get("summary") or "done"
        log.info(
            "gpumem-admin: %s freed the caches of %s's %s (kernel %s, %s): %s",
            admin,
            user,
            nb.name,
            nb.kernel_id,
            nb.connection_file,
            summary,
        )
        self.done(True, "Freed the caches of %s's %s: %s" % (user, nb.name, summary))

    async def stop(self, admin, user, s):
        try:
            status = await self.admin.hub.stop(user, s.name)
        except httpx.HTTPError as e:
            log.warning("gpumem-admin: %s's stop of %s's server %s failed: %s", admin, user, s.label, e)
            return self.done(False, "Stopping %s's server %s failed: %s" % (user, s.label, e))
        held = sum(nb.bytes for nb in s.notebooks)
        word = "stopped" if status == 204 else "is stopping"
        log.info(
            "gpumem-admin: %s stopped %s's server %s (held %d bytes): the hub answered %d", admin, user, s.label, held, status
        )
        self.done(True, "%s's server %s %s (it held %s)." % (user, s.label, word, hubview.fmt_bytes(held)))

    def done(self, ok, msg):
        self.set_signed_cookie(FLASH, json.dumps([ok, msg]), path=self.prefix, httponly=True, samesite="Lax")
        self.redirect(self.prefix)


def make_app(admin, prefix, cookie_secret):
    def route(path, handler):
        return (prefix + path, handler, {"admin": admin, "prefix": prefix})

    return web.Application(
        [
            route("", PageHandler),
            route("api/view", ViewHandler),
            route("action", ActionHandler),
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
        ],
        cookie_secret=cookie_secret,
        xsrf_cookies=True,
    )


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m jupyterlab_gpumem.hubadmin",
        description="The hub admins' page of the GPU box, run by JupyterHub as a service (see docs/shared-host.md).",
    )
    p.add_argument("--socket", default=os.environ.get("GPUMEM_SOCKET") or DEFAULT_SOCKET, help="the root daemon's socket")
    p.add_argument("--cull-timeout", type=float, default=0, help="the idle culler's --timeout in seconds, for its plan")
    p.add_argument("--gpu-idle-after", type=float, default=0, help="the arbiter's gpu_idle_after, as the culler sets it")
    p.add_argument("--gpu-idle-min-bytes", type=int, default=0, help="the arbiter's gpu_idle_min_bytes")
    p.add_argument("--poll", type=float, default=60, help="seconds between the daemon's facts when nobody looks")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    env = {
        k: os.environ.get(k, "")
        for k in ("JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_SERVICE_PREFIX", "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN")
    }
    missing = [k for k, v in env.items() if not v]
    if missing:
        sys.exit(
            "gpumem-admin: %s not set: run it as a JupyterHub service (c.JupyterHub.services, "
            "docs/shared-host.md), which sets them" % ", ".join(missing)
        )
    if args.cull_timeout < 0 or args.poll <= 0:
        sys.exit("gpumem-admin: --cull-timeout must be 0 or more and --poll more than 0 (seconds)")
    # The arbiter's own warnings speak of culls; the page shows the error.
    quiet = logging.getLogger("gpumem-admin.facts")
    quiet.setLevel(logging.ERROR)
    arbiter = GPUArbiter(
        socket=args.socket,
        gpu_idle_after=args.gpu_idle_after,
        gpu_idle_min_bytes=args.gpu_idle_min_bytes,
        log=quiet,
    )
    admin = Admin(arbiter, HubAPI(env["JUPYTERHUB_API_URL"], env["JUPYTERHUB_API_TOKEN"]), args.cull_timeout)
    prefix = env["JUPYTERHUB_SERVICE_PREFIX"].rstrip("/") + "/"
    app = make_app(admin, prefix, os.urandom(32))
    url = urlparse(env["JUPYTERHUB_SERVICE_URL"])
    HTTPServer(app, xheaders=True).listen(url.port or 80, url.hostname or "127.0.0.1")
    # What the arbiter saw of each kernel's idleness needs its facts now and
    # then, not only when an admin looks.
    ioloop.PeriodicCallback(arbiter.facts, args.poll * 1000).start()
    log.info("gpumem-admin: serving %s on %s, asking the daemon at %s", prefix, env["JUPYTERHUB_SERVICE_URL"], args.socket)
    ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()

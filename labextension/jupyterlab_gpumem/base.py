"""The base of gpumem's handlers under {base_url}gpumem/api/v1/: the
daemon's client, this server's kernels, one way to reply and one to ask
the daemon (never an HTTP error for "the daemon is not running"). Both the
handlers' modules build on it."""

import json

import tornado.web
from jupyter_server.base.handlers import APIHandler

from . import view
from .daemon import DaemonError, NoDaemon, UntrustedDaemon

KERNEL_ID = r"(?P<kernel_id>[0-9a-fA-F-]{1,64})"
KNOWN_KERNELS = 4096


class BaseHandler(APIHandler):
    @property
    def daemon(self):
        return self.settings["gpumem_daemon"]

    @property
    def daemon_status(self):
        """Which daemon serves this server, as the supervisor last saw it."""
        return self.settings["gpumem_supervisor"].status

    def own_kernel_ids(self):
        return set(self.kernel_manager.list_kernel_ids())

    def known_kernel_ids(self):
        """This server's kernels now and those it ran since it started (at
        most the last KNOWN_KERNELS): a kernel shut down may have left a
        job running that its user wants to hear about and end."""
        known = self.settings["gpumem_known_kernels"]
        for k in self.own_kernel_ids():
            known.pop(k, None)
            known[k] = True
        while len(known) > KNOWN_KERNELS:
            known.pop(next(iter(known)))
        return set(known)

    def reply(self, status, body):
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    async def daemon_json(self, method, path, params=None, timeout=None, body=None):
        """(the daemon's JSON, None), or (None, (status, body)) to reply with:
        one status line for the browser, never an HTTP error but a 404 of a
        kernel."""
        try:
            data = await self.daemon.request(method, path, params=params, timeout=timeout, body=body)
            return data, None
        except UntrustedDaemon as e:
            # Its own line (the path, who serves it, what to do), whatever
            # the supervisor's last check said.
            return None, (200, {"status": "no_daemon", "message": str(e), "daemon": self.daemon_status})
        except NoDaemon:
            return None, (200, view.no_daemon(self.daemon_status))
        except DaemonError as e:
            if e.status == 404 and "/kernels/" in path:
                return None, (404, {"status": "error", "message": e.message})
            return None, (200, dict(view.daemon_error(e.status, e.message, self.daemon.path), daemon=self.daemon_status))
        except Exception as e:  # noqa: BLE001  (a timeout, a broken reply: one status line, never a 500)
            self.log.warning("gpumem: %s %s: %s", method, path, e)
            return None, (
                200,
                {"status": "error", "message": f"gpumem serve did not answer: {e}", "daemon": self.daemon_status},
            )

    async def call_daemon(self, method, path, params=None, timeout=None, body=None):
        """The daemon's JSON, or None after replying with the status line."""
        data, failed = await self.daemon_json(method, path, params=params, timeout=timeout, body=body)
        if failed:
            self.reply(*failed)
        return data


class KernelHandler(BaseHandler):
    """Kernel actions, for this server's kernels only."""

    def check_own(self, kernel_id):
        if kernel_id not in self.own_kernel_ids():
            raise tornado.web.HTTPError(403, f"kernel {kernel_id} is not one of this server's kernels")

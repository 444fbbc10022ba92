"""Handlers of memory snapshots and the out-of-memory report, for this
server's kernels only: the list and the reduction, as the daemon gives them,
and the raw pickle (pytorch.org/memory_viz opens it), streamed through."""

import httpx
import tornado.web
from jupyter_server.utils import url_path_join

from .base import KERNEL_ID, KernelHandler
from .daemon import NoDaemon

SNAPSHOT_ID = r"(?P<snapshot_id>s[0-9]{1,12})"


class SnapshotsHandler(KernelHandler):
    """GET kernels/{id}/snapshots: the kernel's snapshots."""

    @tornado.web.authenticated
    async def get(self, kernel_id):
        self.check_own(kernel_id)
        rep = await self.call_daemon("GET", f"/api/v1/kernels/{kernel_id}/snapshots", timeout=10)
        if rep is not None:
            self.reply(200, {"status": "ok", "snapshots": rep})


class SnapshotHandler(KernelHandler):
    """GET kernels/{id}/snapshots/{sid}: one snapshot and its reduction."""

    @tornado.web.authenticated
    async def get(self, kernel_id, snapshot_id):
        self.check_own(kernel_id)
        rep = await self.call_daemon("GET", f"/api/v1/kernels/{kernel_id}/snapshots/{snapshot_id}", timeout=30)
        if rep is not None:
            self.reply(200, {"status": "ok", "snapshot": rep})


class SnapshotRawHandler(KernelHandler):
    """GET kernels/{id}/snapshots/{sid}/raw: the pickle, as a download."""

    @tornado.web.authenticated
    async def get(self, kernel_id, snapshot_id):
        self.check_own(kernel_id)
        path = f"/api/v1/kernels/{kernel_id}/snapshots/{snapshot_id}/raw"
        try:
            async with self.daemon.stream(path, timeout=300) as r:
                if r.status_code != 200:
                    body = (await r.aread())[:300].decode("utf-8", "replace")
                    raise tornado.web.HTTPError(404 if r.status_code == 404 else 502, f"gpumem serve: {body}")
                self.set_header("Content-Type", "application/octet-stream")
                self.set_header("Cache-Control", "no-store")
                name = f"gpumem-snapshot-{snapshot_id}.pickle"
                self.set_header("Content-Disposition", f'attachment; filename="{name}"')
                async for chunk in r.aiter_bytes(1 << 20):
                    self.write(chunk)
                    await self.flush()
        except NoDaemon:
            raise tornado.web.HTTPError(503, "gpumem serve is not running") from None
        except httpx.HTTPError as e:
            raise tornado.web.HTTPError(502, f"gpumem serve did not answer: {e}") from None
        self.finish()


def handlers(base):
    """The routes, under base (…/gpumem/api/v1)."""
    k = url_path_join(base, "kernels", KERNEL_ID, "snapshots")
    return [
        (k, SnapshotsHandler),
        (url_path_join(k, SNAPSHOT_ID), SnapshotHandler),
        (url_path_join(k, SNAPSHOT_ID, "raw"), SnapshotRawHandler),
    ]

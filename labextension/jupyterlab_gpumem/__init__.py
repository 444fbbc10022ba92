"""JupyterLab front end of gpumem: GPU memory by notebook.

The wheel holds the gpumem binary, the prebuilt JupyterLab extension
(labextension/) and this Jupyter server extension: it starts and supervises
`gpumem serve` when nothing serves the daemon's socket (supervisor.py), and
its handlers forward to that socket. The daemon computes everything; this
package only filters what the browser may see (this server's kernels, other
users as totals) and says which daemon serves it.
"""

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyterlab-gpumem"}]


def _jupyter_server_extension_points():
    return [{"module": "jupyterlab_gpumem"}]


def _load_jupyter_server_extension(serverapp):
    import os

    from tornado.ioloop import IOLoop

    from .daemon import socket_path
    from .handlers import setup_handlers
    from .supervisor import Gpumem, Supervisor

    config = Gpumem(parent=serverapp)
    sock = socket_path(serverapp.runtime_dir)
    supervisor = Supervisor(config, serverapp.runtime_dir, sock, bool(os.environ.get("GPUMEM_SOCKET")), serverapp.log)
    setup_handlers(serverapp, supervisor)
    # The first check runs once the server's loop does.
    IOLoop.current().add_callback(supervisor.start)
    serverapp.log.info(
        "jupyterlab_gpumem %s: forwarding %sgpumem/api/v1/ to gpumem serve at %s (autostart %s)",
        __version__,
        serverapp.base_url,
        sock,
        "on" if config.autostart else "off",
    )


def _unload_jupyter_server_extension(serverapp):
    supervisor = serverapp.web_app.settings.get("gpumem_supervisor")
    if supervisor is not None:
        supervisor.stop()

"""JupyterLab front end of gpumem: GPU memory by notebook.

The wheel holds the prebuilt JupyterLab extension (labextension/) and this
Jupyter server extension, whose handlers forward to the gpumem serve daemon's
unix socket. The daemon computes everything; this package only filters what
the browser may see (this server's kernels, other users as totals).
"""

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "jupyterlab-gpumem"}]


def _jupyter_server_extension_points():
    return [{"module": "jupyterlab_gpumem"}]


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp)
    serverapp.log.info(
        "jupyterlab_gpumem: forwarding %sgpumem/api/v1/ to gpumem serve",
        serverapp.base_url,
    )

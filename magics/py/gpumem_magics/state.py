"""What the package knows of the kernel it runs in: the IPython shell,
gpumem's config (set by the bootstrap through magic.configure), the
injected version, and the helpers every module shares."""

import os
import sys

SCHEMA = 1
MIME = "application/vnd.gpumem.v1+json"
GIB = 1 << 30
MIB = 1 << 20

# A sentinel for "no such attribute or key", distinct from None.
MISSING = object()

shell = None
config = {}
version = "dev"  # the bootstrap's config replaces it with the bundle's hash


def configure(shell_, config_):
    """Binds the package to shell and the Go side's config."""
    global shell, config, version
    shell = shell_
    config = dict(config_ or {})
    version = config.get("version", version)


def mod(name):
    """A module the user already imported, or None: gpumem never imports a
    framework itself."""
    return sys.modules.get(name)


def short_exc(e):
    s = "%s: %s" % (type(e).__name__, e)
    return s if len(s) <= 200 else s[:197] + "..."


def sidecar_socket():
    """gpumem serve's API socket: from the injection, else $GPUMEM_SOCKET."""
    return config.get("sidecar_socket") or os.environ.get("GPUMEM_SOCKET")

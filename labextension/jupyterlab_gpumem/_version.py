"""The package's version: the wheel's metadata, whose version comes from
package.json (the one place it is written)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jupyterlab-gpumem")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "unknown"

"""The gpumem serve daemon as this server sees it: where its socket is, and
an HTTP client over it that vouches for every new connection (vouch.py):
a socket root or this server's user does not serve is never used."""

import contextlib
import os

import httpcore
import httpx

from . import vouch

SOCKET_NAME = "gpumem.sock"
# The Host the daemon expects from a socket client: it refuses foreign ones.
SOCKET_HOST = "local-gpumem.sock"


def socket_path(runtime_dir, environ=None):
    """The daemon's socket, found as the gpumem CLI finds it: $GPUMEM_SOCKET,
    else gpumem.sock in the Jupyter runtime dir."""
    env = os.environ if environ is None else environ
    explicit = env.get("GPUMEM_SOCKET", "")
    if explicit:
        return explicit
    return os.path.join(runtime_dir, SOCKET_NAME)


class NoDaemon(Exception):
    """Nobody serves the socket: gpumem serve is not running."""


class UntrustedDaemon(NoDaemon):
    """The socket is served, or may be, by someone other than root or this
    server's user: nothing was sent to it. str() is the one line to show."""


class _VouchedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend for a unix socket, vouched for: the path
    before the connect, the peer on the connection itself, so that every
    connection the pool opens is checked and none is swapped in between."""

    def __init__(self, voucher):
        self._voucher = voucher
        self._inner = httpcore.AnyIOBackend()

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        self._voucher.check_path(path)
        stream = await self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)
        try:
            self._voucher.check_peer(path, stream.get_extra_info("socket"))
        except BaseException:
            await stream.aclose()
            raise
        return stream

    async def sleep(self, seconds):
        await self._inner.sleep(seconds)


class VouchedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over the daemon's socket, its connection pool built
    on _VouchedBackend (httpx takes no network backend of its own: the pool
    it made is replaced; a test pins that requests go through this one)."""

    def __init__(self, path, limits, voucher):
        super().__init__(uds=path, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            uds=path,
            network_backend=_VouchedBackend(voucher),
        )


class DaemonError(Exception):
    """The daemon answered with an error status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Daemon:
    """A client of the daemon's local API. One per server; connections are
    reused across requests."""

    def __init__(self, path, timeout=5.0, voucher=None):
        self.path = path
        self.requests = 0  # made so far: the cost benchmark reads it
        # Each open tab holds one waiting request (wait=1): many tabs need
        # many connections.
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=50)
        self._client = httpx.AsyncClient(
            transport=VouchedTransport(path, limits, voucher or vouch.Voucher()),
            base_url="http://" + SOCKET_HOST,
            timeout=timeout,
            trust_env=False,
        )

    async def close(self):
        await self._client.aclose()

    async def request(self, method, path, params=None, timeout=None, body=None):
        """Calls the daemon; returns the decoded JSON of a 200 reply. body,
        when given, is sent as JSON."""
        if not os.path.exists(self.path):
            raise NoDaemon(self.path)
        kwargs = {"params": params}
        if body is not None:
            kwargs["json"] = body
        if timeout is not None:
            kwargs["timeout"] = timeout
        self.requests += 1
        try:
            r = await self._client.request(method, path, **kwargs)
        except vouch.Untrusted as e:
            raise UntrustedDaemon("gpumem: " + str(e)) from None
        except (httpx.ConnectError, FileNotFoundError, ConnectionRefusedError) as e:
            raise NoDaemon(self.path) from e
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text[:200]}
        if r.status_code != 200:
            msg = body.get("error", "") if isinstance(body, dict) else ""
            raise DaemonError(r.status_code, msg or "HTTP %d" % r.status_code)
        return body

    @contextlib.asynccontextmanager
    async def stream(self, path, timeout=None):
        """An async context manager over the daemon's reply to GET path,
        streamed (a memory snapshot's raw pickle)."""
        if not os.path.exists(self.path):
            raise NoDaemon(self.path)
        self.requests += 1
        kwargs = {} if timeout is None else {"timeout": timeout}
        try:
            async with self._client.stream("GET", path, **kwargs) as r:
                yield r
        except vouch.Untrusted as e:
            raise UntrustedDaemon("gpumem: " + str(e)) from None

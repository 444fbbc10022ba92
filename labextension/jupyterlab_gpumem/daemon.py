"""The gpumem serve daemon as this server sees it: where its socket is, and
an HTTP client over it."""

import os

import httpx

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


class DaemonError(Exception):
    """The daemon answered with an error status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Daemon:
    """A client of the daemon's local API. One per server; connections are
    reused across requests."""

    def __init__(self, path, timeout=5.0):
        self.path = path
        self.requests = 0  # made so far: the cost benchmark reads it
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=path),
            base_url="http://" + SOCKET_HOST,
            timeout=timeout,
            trust_env=False,
            # Each open tab holds one waiting request (wait=1): many tabs
            # need many connections.
            limits=httpx.Limits(max_connections=2000, max_keepalive_connections=50),
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

    def stream(self, path, timeout=None):
        """An async context manager over the daemon's reply to GET path,
        streamed (a memory snapshot's raw pickle)."""
        if not os.path.exists(self.path):
            raise NoDaemon(self.path)
        self.requests += 1
        kwargs = {} if timeout is None else {"timeout": timeout}
        return self._client.stream("GET", path, **kwargs)

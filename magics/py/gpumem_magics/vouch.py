"""Whether gpumem serve's socket may be trusted, before a word of it is
believed: whoever serves it writes the figures and the alerts' text that a
user reads and acts on. Trusted: a daemon of root's or of this process's
user, as sidecar/api's Go client decides (vouch.go: the reasons, the order,
the sentences). A socket is used only when

1. the file itself (lstat: never a symbolic link in its place) is root's or
   the user's;
2. its dir is root's or the user's and neither group nor others may write
   it (sticky or not: the daemon never listens in such a dir);
3. once connected, the peer (SO_PEERCRED) is root or the user: checked on
   the connection the requests then use, so a swap cannot slip between.

This file has a twin, byte for byte: jupyterlab_gpumem/vouch.py (the server
extension) and gpumem_magics/vouch.py (the magics, injected into kernels,
where the server extension's package is not importable). A test keeps them
equal; one table of cases (sidecar/api/testdata/vouch-cases.json) runs on
both and on the Go client. Standard library only.
"""

import os
import socket
import stat
import struct

ADVICE = "unset GPUMEM_SOCKET or point it at your own daemon"


class Untrusted(Exception):
    """A socket (or a file beside it) refused: str() is its one line,
    naming the path, what was found and what to do."""

    def __init__(self, path, reason):
        super().__init__(f"not using {path}: {reason}; {ADVICE}")
        self.path = path
        self.reason = reason


def user_name(uid):
    """uid's login name, "" when it has none."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return ""


def peer_uid(sock):
    """The uid of the process at the other end of a connected unix socket."""
    _, uid, _ = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII")))
    return uid


class Voucher:
    """The checks, with where their facts come from: tests (run as root,
    whom every check trusts) give any owner, mode and peer. A fact not
    given is the system's, looked up when the Voucher is made."""

    def __init__(self, uid=None, lstat=None, stat_=None, peer=None, name=None):
        self.uid = os.geteuid() if uid is None else uid
        self.lstat = lstat or os.lstat
        self.stat = stat_ or os.stat
        self.peer = peer or peer_uid
        self.name = name or user_name

    def trusted(self, uid):
        return uid == 0 or uid == self.uid

    def who(self, uid):
        n = self.name(uid)
        return f"uid {uid} ({n})" if n else f"uid {uid}"

    def check_path(self, path, what="socket"):
        """Checks 1 and 2; raises Untrusted. A missing file raises the
        lstat's OSError as is (nobody serves it); a file that is no socket
        passes, and the connect then finds nobody listening. what names the
        file in the sentences: "socket", or e.g. "alert file"."""
        st = self.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise Untrusted(path, f"it is a symbolic link, not the {what} itself")
        if not self.trusted(st.st_uid):
            label = "socket file" if what == "socket" else what
            raise Untrusted(path, f"the {label} belongs to {self.who(st.st_uid)}, not to root or you")
        d = os.path.dirname(path) or "."
        dst = self.stat(d)
        if not self.trusted(dst.st_uid):
            raise Untrusted(path, f"its dir {d} belongs to {self.who(dst.st_uid)}, not to root or you")
        if dst.st_mode & 0o022:
            raise Untrusted(path, "its dir %s is writable by group or others (mode %04o)" % (d, dst.st_mode & 0o7777))

    def check_peer(self, path, sock):
        """Check 3, on the connected socket; raises Untrusted."""
        uid = self.peer(sock)
        if not self.trusted(uid):
            raise Untrusted(path, f"it is served by {self.who(uid)}, not by root or you")

    def connect(self, path, timeout):
        """A blocking unix socket connected to path and vouched for. Raises
        Untrusted, or the connect's OSError (FileNotFoundError,
        ConnectionRefusedError: nobody serves it)."""
        self.check_path(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            self.check_peer(path, s)
        except BaseException:
            s.close()
            raise
        return s

"""Starts and supervises `gpumem serve` for this Jupyter server when nothing
serves the daemon's socket, and says which daemon serves it.

- It starts the daemon for the server's user, on the server's runtime dir,
  with --exit-with-parent: the daemon ends what the server's kernels left
  and exits when the server does (Ctrl-C, SIGTERM or SIGKILL).
- A daemon that already serves the socket is used as it is, never doubled
  and never stopped, when it is root's or the server's user's (vouch.py);
  a socket anyone else may serve is refused, said in the status, and no
  daemon is started for it. Two servers of one user share one daemon (the daemon
  locks its runtime dir); when it goes away, the next check of either
  server starts a new one.
- After a crash it starts the daemon again with backoff, and logs one line.
- After an upgrade replaced the binary with another version, it restarts
  the daemon it started (only that one).

The decisions and their wording are in supervision.py; this module does the
I/O, on the server's event loop (one check a second).
"""

import asyncio
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sysconfig
import time

from traitlets import Bool, List, Unicode
from traitlets.config import Configurable

from . import supervision as sv
from . import vouch

LOG_NAME = "gpumem-serve.log"
LOG_MAX_BYTES = 10 << 20
CHECK_SECONDS = 1.0
STOP_GRACE_SECONDS = 10.0


class Gpumem(Configurable):
    """gpumem's settings, in jupyter_server_config.py as c.Gpumem.<name>."""

    autostart = Bool(
        True,
        config=True,
        help="""Start `gpumem serve` for this server's user on its runtime dir when
        nothing serves the daemon's socket, and supervise it. A daemon that already
        serves it (a systemd unit, the root daemon, another server's) is used as it is.""",
    )
    serve_args = List(
        Unicode(),
        config=True,
        help="""Extra flags for the `gpumem serve` this server starts, e.g.
        ["--cull-idle=3h", "--cull-min-memory=8GiB", "--cull-action=shutdown"].""",
    )
    binary = Unicode(
        "",
        config=True,
        help="""The gpumem binary to start. Default: the one pip installed beside
        this Python (jupyterlab-gpumem's wheel), else `gpumem` on PATH.""",
    )


def default_binary():
    """The gpumem pip installed beside this Python, else gpumem on PATH ('' if none)."""
    beside = os.path.join(sysconfig.get_path("scripts"), "gpumem")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("gpumem") or ""


def probe(path, voucher=None):
    """Who serves the unix socket at path: ('served', pid, uid), ('none', 0, 0),
    ('refused', 0, error text), or ('untrusted', 0, the line saying why) when
    root or this server's user may not be what serves it (vouch.py). pid is
    0 when the daemon is in a pid namespace this process does not see."""
    try:
        s = (voucher or vouch.Voucher()).connect(path, 1.0)
    except vouch.Untrusted as e:
        return ("untrusted", 0, str(e))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return ("none", 0, 0)
    except PermissionError as e:
        return ("refused", 0, e.strerror or str(e))
    except OSError as e:
        return ("none", 0, str(e))
    try:
        pid, uid, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return ("served", pid, uid)
    except OSError as e:
        return ("none", 0, str(e))
    finally:
        s.close()


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def last_line(path, limit=4096):
    """The log's last line that says something, for a one-line reason."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def binary_version(binary):
    """`gpumem version --json` of the binary: ("0.1.0", "1a2b3c4d5e6f"), or
    ("", "") when it does not say."""
    try:
        out = subprocess.run([binary, "version", "--json"], capture_output=True, timeout=10, check=True).stdout
        v = json.loads(out)
        return (str(v["version"]), str(v["commit"]))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return ("", "")


def file_identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Supervisor:
    """One server's view of the daemon, and the daemon it started, if any."""

    def __init__(self, config, runtime_dir, socket_path, explicit_socket, log):
        self.config = config
        self.runtime_dir = runtime_dir
        self.socket = socket_path
        self.explicit_socket = explicit_socket
        self.log = log
        self.log_path = os.path.join(runtime_dir, LOG_NAME)
        self.child = None  # the daemon this server started (subprocess.Popen)
        self.child_started = 0.0
        self.child_binary = ""
        self.child_version = ("", "")  # (version, commit) of the binary it runs
        self.child_identity = None  # the binary file's, when started
        self.stopping_until = 0.0  # asked to stop (an upgrade): SIGKILL after this
        self.failures = 0
        self.next_start = 0.0
        self.restarts = 0
        self.served_by = None  # (pid, uid) of a daemon not ours, at the last check
        self.status = sv.describe(sv.NOT_RUNNING, reason="checking the daemon's socket")
        self.untrusted = None  # the line said at the last check, while it holds
        self.voucher = None  # vouch.Voucher's checks of the system (tests give others)
        self._task = None

    # --- the loop ---------------------------------------------------------

    def start(self):
        """Runs the checks on the current event loop until stop()."""
        self._task = asyncio.ensure_future(self._run())

    def stop(self):
        """Stops checking. The daemon this server started is left running:
        it ends the kernels' orphans and exits once the server has."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self):
        while True:
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001  (the next check tries again; the server must not suffer)
                self.log.exception("gpumem: checking the daemon failed")
            await asyncio.sleep(CHECK_SECONDS)

    # --- one check --------------------------------------------------------

    def check(self, now):
        """Looks at the child and the socket once, starts or restarts the
        daemon when that is due, and updates self.status."""
        if self.child is not None and self.child.poll() is not None:
            self._child_exited(now)
        if self.child is not None and self.stopping_until and now > self.stopping_until:
            self.child.kill()
        state, pid, detail = probe(self.socket, self.voucher)
        if state == "untrusted":
            # Never "a daemon already serves", and no daemon of ours either:
            # the socket stays whoever's it is, said in one line.
            if self.untrusted != detail:
                self.log.warning("gpumem: %s", detail)
            self.untrusted = detail
            self.served_by = None
            self.status = sv.untrusted(detail)
            return
        self.untrusted = None
        if state == "refused":
            self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_refused(self.socket, detail))
            return
        if state == "served":
            if self.child is not None and pid == self.child.pid:
                # (failures count on: only a daemon that ran a minute starts them again)
                self.status = sv.describe(
                    sv.STARTED, pid=pid, user=user_name(os.geteuid()), version=self.child_version[0], commit=self.child_version[1]
                )
                self._check_upgrade()
                return
            if self.served_by != (pid, detail):
                self.log.info(
                    "gpumem: using gpumem serve (pid %d, user %s) that already serves %s", pid, user_name(detail), self.socket
                )
            self.served_by = (pid, detail)
            self.failures = 0
            self.status = sv.describe(sv.SHARED, pid=pid, user=user_name(detail))
            return
        if self.served_by is not None:
            self.log.info("gpumem: gpumem serve (pid %d) that served %s is gone", self.served_by[0], self.socket)
            self.served_by = None
            self.next_start = 0.0  # not ours: no backoff
        if self.child is not None:
            reason = sv.reason_starting(self.child.pid, now - self.child_started, self.log_path)
            self.status = sv.describe(sv.NOT_RUNNING, reason=reason)
            return
        if not self.config.autostart:
            self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_autostart_off(self.socket))
            return
        if self.explicit_socket:
            self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_explicit_socket(self.socket))
            return
        if now < self.next_start:
            return  # the reason given at the exit still holds
        self._start_child(now)

    def _start_child(self, now):
        binary = self.config.binary or default_binary()
        if not binary or not os.access(binary, os.X_OK):
            self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_no_binary(binary or "gpumem on PATH"))
            return
        version = binary_version(binary)
        argv = [
            binary,
            "serve",
            f"--exit-with-parent={os.getpid()}",
            f"--socket={self.socket}",
            "--log-format=console",
            *self.config.serve_args,
        ]
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=self.runtime_dir)
        env.pop("GPUMEM_SOCKET", None)
        os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
        self._rotate_log()
        with open(self.log_path, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: started by the Jupyter server pid {os.getpid()}\n".encode())
            out.flush()
            try:
                # Its own session: a Ctrl-C in the server's terminal does not
                # reach it (it leaves after the server, having reclaimed).
                self.child = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as e:
                self.failures += 1
                self.next_start = now + sv.backoff_seconds(self.failures)
                self.status = sv.describe(sv.NOT_RUNNING, reason=f"starting {binary} failed: {e}")
                self.log.warning("gpumem: starting %s failed: %s", binary, e)
                return
        self.child_started = now
        self.child_binary = binary
        self.child_version = version
        self.child_identity = file_identity(binary)
        self.stopping_until = 0.0
        self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_starting(self.child.pid))
        if self.restarts == 0 and self.failures == 0:
            self.log.info(
                "gpumem: started gpumem serve %s (commit %s, pid %d) for %s; its log: %s",
                version[0] or "(version unknown)",
                version[1] or "unknown",
                self.child.pid,
                self.runtime_dir,
                self.log_path,
            )

    def _child_exited(self, now):
        code, pid = self.child.returncode, self.child.pid
        ran = now - self.child_started
        self.child = None
        if self.stopping_until:  # we asked it to stop (an upgrade): start the new one at once
            self.stopping_until = 0.0
            self.next_start = 0.0
            return
        # Its last words are the log's last line when it exited on its own;
        # one killed by a signal said nothing about it.
        words = last_line(self.log_path) if code > 0 else ""
        self.restarts += 1
        self.failures = sv.failures_after_exit(self.failures, ran)
        wait = sv.backoff_seconds(self.failures)
        self.next_start = now + wait
        if sv.exit_kind(words) == "taken":
            # Once is a race another server's daemon won (the next check
            # finds it serving); twice in a row, a daemon that holds the
            # dir but serves another socket.
            if self.failures == 2:
                self.log.warning("gpumem: %s", sv.reason_taken(self.runtime_dir, self.socket, wait))
            self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_taken(self.runtime_dir, self.socket, wait))
            return
        self.log.warning("gpumem: %s", sv.exit_line(pid, code, ran, words, wait, self.log_path))
        self.status = sv.describe(sv.NOT_RUNNING, reason=sv.reason_exited(code, words, wait))

    def _check_upgrade(self):
        """Restarts the daemon this server started when its binary was
        replaced by another version (pip install -U)."""
        if self.stopping_until:
            return
        ident = file_identity(self.child_binary)
        if ident is None or ident == self.child_identity:
            return
        self.child_identity = ident
        new = binary_version(self.child_binary)
        if not new[0] or new == self.child_version:
            return
        self.log.info(
            "gpumem: %s is now gpumem %s (commit %s), was %s (commit %s): "
            "restarting the gpumem serve this server started (pid %d)",
            self.child_binary,
            *new,
            *self.child_version,
            self.child.pid,
        )
        self.stopping_until = time.monotonic() + STOP_GRACE_SECONDS
        try:
            self.child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _rotate_log(self):
        try:
            if os.path.getsize(self.log_path) > LOG_MAX_BYTES:
                os.replace(self.log_path, self.log_path + ".1")
        except OSError:
            pass

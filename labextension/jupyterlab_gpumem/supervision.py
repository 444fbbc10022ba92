"""What the supervisor of `gpumem serve` decides, and how it says it. Pure:
supervisor.py does the I/O (the socket, the process, the clock) and hands
the facts to these functions.

The three cases a server can be in, each with the sentence the panel shows
(the front end only renders it):
  started      this server started the daemon that serves the socket
  shared       another process serves it (a systemd unit, the root daemon,
               another JupyterLab of the user): used as it is
  not_running  nothing serves it, and why; or what serves it is not
               trusted (root's or this server's user's: vouch.py), and the
               line that says so
"""

from .units import fmt_duration

STARTED, SHARED, NOT_RUNNING = "started", "shared", "not_running"

# A daemon that ran this long before it exited is restarted at once: the
# backoff is for one that keeps failing.
HEALTHY_SECONDS = 60.0
BACKOFF_MAX_SECONDS = 30.0

# What `gpumem serve` says when another daemon holds the runtime dir or
# serves the socket (the existing lock): not a crash, another daemon won.
TAKEN_MARK = "another gpumem daemon is serving"


def backoff_seconds(failures):
    """Seconds before the next start after failures exits in a row: 1, 2,
    4, ... up to 30."""
    if failures <= 0:
        return 0.0
    return min(BACKOFF_MAX_SECONDS, float(2 ** (failures - 1)))


def exit_kind(last_line):
    """'taken' when the daemon stopped because another one holds its
    runtime dir or socket, else 'crash'."""
    return "taken" if TAKEN_MARK in (last_line or "") else "crash"


def failures_after_exit(failures, ran_seconds):
    """The count of exits in a row after one more: a daemon that ran long
    enough starts the count again."""
    return 1 if ran_seconds >= HEALTHY_SECONDS else failures + 1


def exit_line(pid, code, ran_seconds, last_line, retry_seconds, log_path):
    """The one line the server logs when the daemon it started exits."""
    status = f"status {code}" if code >= 0 else f"signal {-code}"
    words = f": {last_line}" if last_line else ""
    return (
        f"gpumem serve (pid {pid}) exited with {status} after {fmt_duration(ran_seconds)}{words}; "
        f"starting it again in {fmt_duration(retry_seconds)} (its log: {log_path})"
    )


def describe(case, pid=0, user="", version="", commit="", reason=""):
    """The status the browser shows: data, and the one sentence for it."""
    if case == STARTED:
        v = f" {version}" if version else ""
        text = f"gpumem serve{v} (pid {pid}): started by this server"
    elif case == SHARED:
        who = f"pid {pid}" if pid > 0 else "pid not visible from here"
        if user:
            who += f", user {user}"
        text = f"gpumem serve ({who}): shared, started outside this server"
    else:
        text = f"gpumem serve is not running: {reason}"
    return {"case": case, "pid": pid, "user": user, "version": version, "commit": commit, "text": text}


def reason_nothing_listens(socket):
    """Why, as a kernel sees it: it cannot tell whether a server would
    start the daemon. The injected magics say the same sentence
    (gpumem_magics.daemon.not_running; a test pins the two together)."""
    return (
        f"nothing listens on {socket}: JupyterLab with jupyterlab-gpumem installed starts it; "
        "elsewhere run `gpumem serve` beside JupyterLab, as the same user"
    )


def reason_autostart_off(socket):
    return (
        f"autostart is off (c.Gpumem.autostart = False) and nothing listens on {socket}: "
        "start `gpumem serve` beside JupyterLab, as the same user"
    )


def reason_explicit_socket(socket):
    return (
        f"nothing answers on GPUMEM_SOCKET={socket}; this server starts no daemon for a socket "
        "named there (the daemon that serves it, such as the root daemon, is started by its admin)"
    )


def reason_no_binary(where):
    return f"no gpumem binary at {where}: `pip install jupyterlab-gpumem` puts one beside this Python, or set c.Gpumem.binary"


# A daemon that has not served its socket this long after its start is
# named as such (it is left running: it may be slow, not stuck).
STARTING_SECONDS = 30.0


def reason_starting(pid, seconds=0.0, log_path=""):
    if seconds < STARTING_SECONDS:
        return f"starting it (pid {pid})"
    return f"gpumem serve (pid {pid}) has not served its socket {fmt_duration(seconds)} after it started: see its log, {log_path}"


def reason_exited(code, last_line, retry_seconds):
    status = f"status {code}" if code >= 0 else f"signal {-code}"
    words = f" ({last_line})" if last_line else ""
    return f"it exited with {status}{words}; starting it again in {fmt_duration(retry_seconds)}"


def reason_taken(runtime_dir, socket, retry_seconds):
    return (
        f"another gpumem daemon holds the runtime dir {runtime_dir} but nothing answers on {socket} "
        "(a root --all-users daemon? point GPUMEM_SOCKET at its socket); "
        f"trying again in {fmt_duration(retry_seconds)}"
    )


def untrusted(sentence):
    """The status when the socket may be served by someone other than root
    or this server's user (vouch.Untrusted's line): not running, as far as
    this server is concerned, and never "a daemon already serves"."""
    d = describe(NOT_RUNNING, reason=sentence)
    d["text"] = "gpumem: " + sentence
    return d


def reason_refused(socket, err):
    return f"a daemon listens on {socket} but refuses this server ({err})"

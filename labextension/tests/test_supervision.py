"""supervision: the supervisor's decisions and sentences. Pure."""

import pytest
from jupyterlab_gpumem import supervision as sv


@pytest.mark.parametrize(
    "failures, want",
    [(0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (6, 30), (60, 30)],
)
def test_backoff(failures, want):
    assert sv.backoff_seconds(failures) == want


@pytest.mark.parametrize(
    "failures, ran, want",
    [
        (0, 0.5, 1),  # the first exit
        (3, 2.0, 4),  # keeps failing: the backoff grows
        (5, 61.0, 1),  # ran a minute: the count starts again
    ],
)
def test_failures_after_exit(failures, ran, want):
    assert sv.failures_after_exit(failures, ran) == want


@pytest.mark.parametrize(
    "line, want",
    [
        (
            "gpumem serve: runtime dir /r: another gpumem daemon is serving this runtime dir: stop it, or watch other dirs",
            "taken",
        ),
        ("gpumem serve: another gpumem daemon is serving /r/gpumem.sock", "taken"),
        ("gpumem serve: socket path /x is 120 bytes long, Linux allows 107: choose a shorter socket path", "crash"),
        ("", "crash"),
        (None, "crash"),
    ],
)
def test_exit_kind(line, want):
    assert sv.exit_kind(line) == want


def test_exit_line_is_one_line_naming_status_words_wait_and_log():
    line = sv.exit_line(4242, 1, 3.2, "gpumem serve: boom", 4, "/r/gpumem-serve.log")
    assert "\n" not in line
    assert line == (
        "gpumem serve (pid 4242) exited with status 1 after 3 s: gpumem serve: boom; "
        "starting it again in 4 s (its log: /r/gpumem-serve.log)"
    )
    assert "exited with signal 9 after 10 s;" in sv.exit_line(7, -9, 10, "", 1, "/l")


@pytest.mark.parametrize(
    "args, want",
    [
        (
            dict(case=sv.STARTED, pid=12, user="ann", version="0.1.0", commit="abc"),
            "gpumem serve 0.1.0 (pid 12): started by this server",
        ),
        (dict(case=sv.STARTED, pid=12), "gpumem serve (pid 12): started by this server"),
        (dict(case=sv.SHARED, pid=34, user="root"), "gpumem serve (pid 34, user root): shared, started outside this server"),
        (
            dict(case=sv.SHARED, pid=0, user="bob"),
            "gpumem serve (pid not visible from here, user bob): shared, started outside this server",
        ),
        (dict(case=sv.NOT_RUNNING, reason="starting it (pid 5)"), "gpumem serve is not running: starting it (pid 5)"),
    ],
)
def test_describe(args, want):
    d = sv.describe(**args)
    assert d["text"] == want
    assert d["case"] == args["case"]
    assert set(d) == {"case", "pid", "user", "version", "commit", "text"}


def test_reasons_name_the_thing_and_what_to_do():
    assert "/r/gpumem.sock" in sv.reason_autostart_off("/r/gpumem.sock")
    assert "c.Gpumem.autostart" in sv.reason_autostart_off("/s")
    assert "GPUMEM_SOCKET=/run/gpumem/gpumem.sock" in sv.reason_explicit_socket("/run/gpumem/gpumem.sock")
    assert "pip install jupyterlab-gpumem" in sv.reason_no_binary("/env/bin/gpumem")
    assert "c.Gpumem.binary" in sv.reason_no_binary("/env/bin/gpumem")
    r = sv.reason_exited(2, "gpumem serve: bad flag", 8)
    assert r == "it exited with status 2 (gpumem serve: bad flag); starting it again in 8 s"
    r = sv.reason_taken("/r", "/r/gpumem.sock", 30)
    assert "/r" in r and "/r/gpumem.sock" in r and "GPUMEM_SOCKET" in r and "30 s" in r


def test_a_daemon_slow_to_serve_is_named_with_its_log():
    assert sv.reason_starting(5, 3.0, "/r/gpumem-serve.log") == "starting it (pid 5)"
    r = sv.reason_starting(5, 31.0, "/r/gpumem-serve.log")
    assert r == "gpumem serve (pid 5) has not served its socket 31 s after it started: see its log, /r/gpumem-serve.log"

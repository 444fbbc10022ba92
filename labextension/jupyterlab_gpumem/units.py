"""Byte counts and durations for people, as every face of gpumem writes
them: bytes in binary (IEC) units with one decimal, durations in at most
two short units ("3 h 5 min"). The twins of Go's units.Bytes and
units.Duration, tested against the same table (testdata/formats.json at
the repository's root). The magics and the server extension each ship
this file (a test keeps the two copies equal): each package installs
alone. Pure."""

import math


def fmt_bytes(n):
    """Human bytes, binary units, one decimal: 0 B, 512 B, 1.5 KiB, 2.0 GiB
    (a tie to the even tenth, as Go's strconv rounds: "%.1f" does)."""
    if n is None:
        return "?"
    n = int(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return "%s%d B" % (sign, n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if n < 1024 or unit == "PiB":
            return "%s%.1f %s" % (sign, n, unit)
    return "%s%d B" % (sign, n)


def fmt_delta(n):
    if n is None:
        return "?"
    return ("+" if n > 0 else "") + fmt_bytes(n)


def _round(x):
    """Half away from zero for x >= 0, as Go's Duration.Round and
    JavaScript's Math.round do (Python's round() goes to even)."""
    return int(math.floor(x + 0.5))


def _two(a, unit_a, b, unit_b):
    return "%d %s %d %s" % (a, unit_a, b, unit_b) if b else "%d %s" % (a, unit_a)


def fmt_duration(seconds):
    """A duration for people, in at most two units, the second left out
    when 0, rounded to the smaller unit shown: 250 ms, 45 s, 1 min 30 s,
    3 h 5 min, 27 h 13 min, 2 d 3 h (hours up to 48); "0 s" for none (or
    less), "?" when unknown."""
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if math.isnan(seconds) or math.isinf(seconds):
        return "?"
    ms = _round(seconds * 1000)
    if ms <= 0:
        return "0 s"
    if ms < 1000:
        return "%d ms" % ms
    s = _round(seconds)
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return _two(s // 60, "min", s % 60, "s")
    m = _round(seconds / 60)
    if m < 48 * 60:
        return _two(m // 60, "h", m % 60, "min")
    h = _round(seconds / 3600)
    return _two(h // 24, "d", h % 24, "h")

"""Byte counts for people: binary (IEC) units, as every gpumem output uses.
Pure."""


def fmt_bytes(n):
    """Human bytes, binary units: 0 B, 512 B, 1.50 KiB, 2.00 GiB."""
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
            return "%s%.2f %s" % (sign, n, unit)
    return "%s%d B" % (sign, n)


def fmt_delta(n):
    if n is None:
        return "?"
    return ("+" if n > 0 else "") + fmt_bytes(n)

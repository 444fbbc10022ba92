import pytest

from gpumem_magics import units


@pytest.mark.parametrize(
    "n, want",
    [
        (None, "?"),
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (2 << 30, "2.00 GiB"),
        (150754820096, "140.40 GiB"),
        (1 << 60, "1024.00 PiB"),
        (-1536, "-1.50 KiB"),
    ],
)
def test_fmt_bytes(n, want):
    assert units.fmt_bytes(n) == want


@pytest.mark.parametrize("n, want", [(None, "?"), (0, "0 B"), (2048, "+2.00 KiB"), (-2048, "-2.00 KiB")])
def test_fmt_delta(n, want):
    assert units.fmt_delta(n) == want

import json
import os

import pytest

from gpumem_magics import units

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The table every face of gpumem is tested against (Go, TypeScript, Python).
with open(os.path.join(REPO, "testdata", "formats.json")) as f:
    FORMATS = json.load(f)


def test_formats_list_cases():
    assert len(FORMATS["bytes"]) > 10 and len(FORMATS["seconds"]) > 10


@pytest.mark.parametrize("n, want", FORMATS["bytes"])
def test_fmt_bytes_shared(n, want):
    assert units.fmt_bytes(n) == want


@pytest.mark.parametrize("s, want", FORMATS["seconds"])
def test_fmt_duration_shared(s, want):
    assert units.fmt_duration(s) == want


@pytest.mark.parametrize("n, want", [(None, "?"), (512, "512 B"), (-1536, "-1.5 KiB"), (1 << 60, "1024.0 PiB")])
def test_fmt_bytes(n, want):
    assert units.fmt_bytes(n) == want


@pytest.mark.parametrize("s, want", [(None, "?"), (float("nan"), "?"), (float("inf"), "?"), (90, "1 min 30 s")])
def test_fmt_duration(s, want):
    assert units.fmt_duration(s) == want


@pytest.mark.parametrize("n, want", [(None, "?"), (0, "0 B"), (2048, "+2.0 KiB"), (-2048, "-2.0 KiB")])
def test_fmt_delta(n, want):
    assert units.fmt_delta(n) == want


def test_one_copy_in_each_package():
    # The server extension ships the same file: one formatter per language.
    with open(os.path.join(REPO, "magics", "py", "gpumem_magics", "units.py"), "rb") as a:
        with open(os.path.join(REPO, "labextension", "jupyterlab_gpumem", "units.py"), "rb") as b:
            assert a.read() == b.read(), "labextension/jupyterlab_gpumem/units.py differs from the magics' units.py: copy it"

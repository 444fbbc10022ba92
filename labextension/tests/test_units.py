"""The server extension's units.py (the magics' file, copied) against the
table every face of gpumem is tested against. Pure."""

import json
import os

import pytest
from jupyterlab_gpumem import units

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "testdata", "formats.json")) as f:
    FORMATS = json.load(f)


def test_formats_list_cases():
    assert len(FORMATS["bytes"]) > 10 and len(FORMATS["seconds"]) > 10


@pytest.mark.parametrize("n, want", FORMATS["bytes"])
def test_fmt_bytes(n, want):
    assert units.fmt_bytes(n) == want


@pytest.mark.parametrize("s, want", FORMATS["seconds"])
def test_fmt_duration(s, want):
    assert units.fmt_duration(s) == want

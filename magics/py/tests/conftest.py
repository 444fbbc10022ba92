"""Puts magics/py on sys.path so that the tests import gpumem_magics as a
plain package, the files that gpumem embeds and injects."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


import pytest  # noqa: E402


@pytest.fixture
def torch():
    """Debian's CPU torch; under CI=true its absence fails, never skips."""
    try:
        import torch as t
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("torch is not importable (CI=true: a missing part fails)")
        pytest.skip("torch is not importable")
    return t

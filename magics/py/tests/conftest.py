"""Puts magics/py on sys.path so that the tests import gpumem_magics as a
plain package, the files that gpumem embeds and injects."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

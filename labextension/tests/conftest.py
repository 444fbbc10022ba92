from harness import pytest_runtest_makereport, stack  # noqa: F401  (the hook and the fixture)

from harness import stack  # noqa: F401  (the fixture)

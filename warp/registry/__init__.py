"""registry (see the module docstrings)."""

"""tiles (see the module docstrings)."""

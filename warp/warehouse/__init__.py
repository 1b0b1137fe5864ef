"""warehouse (see the module docstrings)."""

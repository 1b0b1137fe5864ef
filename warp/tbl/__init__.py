"""tbl (see the module docstrings)."""

"""features (see the module docstrings)."""

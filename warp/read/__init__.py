"""warpdata.read."""

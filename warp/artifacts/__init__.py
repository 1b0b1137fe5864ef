"""warpdata.artifacts."""

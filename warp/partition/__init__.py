"""warpdata.partition."""

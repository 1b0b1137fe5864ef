"""warpdata.core."""

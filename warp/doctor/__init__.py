"""warpdata.doctor."""

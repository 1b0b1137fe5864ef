"""warpdata.storage.locations."""

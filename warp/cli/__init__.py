"""warpdata.cli.app."""

"""Benchmark stand-in (see bench/_peer_stubs/README.md)."""

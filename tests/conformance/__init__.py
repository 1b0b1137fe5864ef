"""Conformance suites: base classes holding the tests; ``tests/formats/test_conformance_*.py`` and
``tests/storage/test_conformance_*.py`` subclass them per implementation (no ``test_`` files here,
so nothing in this package is collected on its own)."""

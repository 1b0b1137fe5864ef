"""``warp doctor``'s own checks and runners; the check table is :mod:`warpdata.checks.registry`."""

from warpdata.core.moved import moved_modules

# the check table moved to its own package (docs/design.md §2 "Floors"); the old path imports it,
# with a DeprecationWarning, until warpdata.core.moved.REMOVED_IN
moved_modules({"warpdata.doctor.registry": "warpdata.checks.registry"})

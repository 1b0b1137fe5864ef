"""The dataset contract every system writes to: manifests, the store, versions and ``latest``,
resolve, registrations (see the module docstrings). Publishing is ``warpdata.publishing``."""

from warpdata.core.moved import moved_modules

# the publishing wing moved to its own package (docs/design.md §2 "Floors"); the old paths import
# the new modules, with a DeprecationWarning, until warpdata.core.moved.REMOVED_IN
moved_modules({f"warpdata.registry.{name}": f"warpdata.publishing.{name}" for name in (
    "publish", "ingest", "register_files", "embeddings_add", "multipart", "from_artifacts")})

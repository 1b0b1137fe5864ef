"""Names every layer agrees on: the manifest file, the artifact kinds it declares and the prefix
of a writer's temporary files.

The table that gives each kind its schema, inspector and publisher is
:data:`warpdata.artifacts.kinds.KINDS`; these constants are here so that codecs
(``formats/``) and systems can name a kind without importing the layer above them.
"""

from __future__ import annotations

MANIFEST_NAME = "manifest.json"

TENSOR_WAREHOUSE = "tensor-warehouse"
ZARR_ARRAY = "zarr-array"
FEATURE_CACHE = "feature-cache"
DATASET = "dataset"

# the name prefix of every temporary sibling a writer makes before its atomic rename
# (warpdata.core.atomic, which re-exports it); here so that core.errors can recognise one without
# importing the writers' module (tempfile, shutil) on `warp --help`'s start-up
TMP_PREFIX = ".warp-tmp-"

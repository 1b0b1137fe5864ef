"""Names every layer agrees on: the manifest file and the artifact kinds it declares.

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

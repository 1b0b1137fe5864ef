"""The publishing wing: ``warp publish`` (and ``--from`` artifact folders), ``warp ingest``,
``warp register``, ``warp embeddings add`` and S3 multipart uploads, on the dataset contract of
``warpdata.registry`` (see the module docstrings)."""

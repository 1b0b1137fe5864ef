"""The ``warp doctor`` check table the systems register in (:mod:`warpdata.checks.registry`);
``warpdata.doctor`` holds warp's own checks and the runners."""

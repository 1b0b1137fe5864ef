"""``warp doctor`` check for tile-compression backends.

Lists every backend in :data:`warpdata.kernels.BACKENDS`, whether it can be
used here and, when not, why (no CUDA device, a package missing — with the
pip command), plus what ``auto`` / ``WARP_BACKEND`` resolves to. PASS while
the CPU backend works (it always should); a GPU that is visible but unusable
is a WARN, since ``auto`` silently falls back to the CPU.
"""

from __future__ import annotations

import os
import shutil

from warpdata.checks.registry import FAIL, PASS, WARN, CheckResult, check
from warpdata.core.errors import WarpError
from warpdata.kernels import availability, resolve


@check("tile-backends", "backends")
def tile_backends() -> CheckResult:
    avail = availability()
    parts = [f"{name}: {'available' if reason is None else 'unavailable (' + reason + ')'}"
             for name, reason in avail.items()]
    try:
        chosen = resolve(None)
    except WarpError as e:
        return CheckResult(FAIL, f"WARP_BACKEND is invalid: {e.message}", e.hint, facts={"backends": avail})
    facts = {"backends": avail, "auto": chosen}
    detail = "; ".join(parts) + f"; auto -> {chosen}"
    if avail.get("cpu") is not None:
        return CheckResult(FAIL, detail, "reinstall warp-toolchain (numpy and zstandard are core dependencies)", facts=facts)
    gpu_visible = shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0")
    if avail.get("gpu") is not None and gpu_visible:
        return CheckResult(WARN, detail, "pip install 'warp-toolchain[gpu]' (CUDA 12) or 'warp-toolchain[gpu-cu13]' (CUDA 13)",
                           facts=facts)
    return CheckResult(PASS, detail, facts=facts)

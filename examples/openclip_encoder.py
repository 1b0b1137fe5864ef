"""An OpenCLIP embedding encoder for ``warp embeddings add``: images and text in one space.

Not imported by warp or its tests: it needs ``torch`` and ``open_clip_torch``
and downloads weights on first use::

    pip install torch open_clip_torch pillow

Embed an image-bound column (each row's image bytes come from its artifact),
with this directory on ``PYTHONPATH``; options are passed as ``--option``::

    PYTHONPATH=examples warp embeddings add vision/pets --column image --name clip \\
        --encoder openclip_encoder:make_encoder \\
        --option model=ViT-B-32 --option pretrained=laion2b_s34b_b79k --device cuda

or publish it as an entry point so ``--encoder openclip`` finds it::

    [project.entry-points."warpdata.encoders"]
    openclip = "my_package.openclip_encoder:make_encoder"

A text query searches the image embedding (same model, same space)::

    import warpdata
    from openclip_encoder import make_encoder

    enc = make_encoder(device="cpu", model="ViT-B-32", pretrained="laion2b_s34b_b79k")
    hits = warpdata.dataset("vision/pets").embeddings("clip").search(enc.embed(["a black cat"])[0], k=10)

The contract is the one the built-in weight-free encoders follow
(``warpdata.registry.embeddings``: ``ColorHistEncoder``, ``HashTextEncoder``):
the factory is called as ``factory(device=..., **options)`` and returns an
object with ``dim`` (int), ``embed(items)`` (image bytes or strings, one
batch) returning a ``(len(items), dim)`` float array, and ``identity()``.
``identity()`` names the model, the pretrained tag and a SHA-256 of the
weights: a later ``embeddings add`` on a new dataset version reuses the
vectors of unchanged rows only when the identity is the same, so a new
checkpoint re-encodes everything.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any


def _weights_sha256(module) -> str:
    """SHA-256 over the parameters and buffers in name order."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class OpenCLIPEncoder:
    def __init__(self, *, device: str = "cpu", model: str = "ViT-B-32", pretrained: str = "laion2b_s34b_b79k",
                 precision: str = "fp32") -> None:
        import open_clip
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            model, pretrained=pretrained, device=device, precision=precision)
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(model)
        with torch.no_grad():
            self.dim = int(self.model.encode_text(self.tokenizer(["x"]).to(device)).shape[-1])
        self._id = {"name": "openclip", "model": model, "pretrained": pretrained, "precision": precision,
                    "open_clip": open_clip.__version__, "weights_sha256": _weights_sha256(self.model)}

    def embed(self, items: list[Any]):
        import numpy as np
        import torch
        from PIL import Image

        if not items:
            return np.zeros((0, self.dim), np.float32)
        with torch.no_grad():
            if all(isinstance(x, (bytes, bytearray, memoryview)) for x in items):
                pixels = []
                for data in items:
                    with Image.open(io.BytesIO(bytes(data))) as im:
                        pixels.append(self.preprocess(im.convert("RGB")))
                out = self.model.encode_image(torch.stack(pixels).to(self.device))
            elif all(isinstance(x, str) for x in items):
                out = self.model.encode_text(self.tokenizer(list(items)).to(self.device))
            else:
                raise ValueError("openclip: a batch must be all image bytes or all strings")
        # cosine search normalises anyway; normalised vectors also suit other consumers of emb_<name>
        out = out / out.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return out.float().cpu().numpy()

    def identity(self) -> dict[str, Any]:
        return dict(self._id)


def make_encoder(*, device: str = "cpu", **options: Any) -> OpenCLIPEncoder:
    return OpenCLIPEncoder(device=device, **options)

"""How a diffusers VAE (and a CLIP text encoder) plugs into warp's feature cache.

Not imported by warp or its tests: it needs ``diffusers`` and ``transformers``
(``pip install diffusers transformers``) and downloads weights. Point the
config at it with this directory on ``PYTHONPATH``::

    [encoder]
    name = "diffusers_vae_encoder:make_encoder"
    caching_batch_size = 16
    caching_device = "auto"        # CUDA with autocast when available
    dtype = "float16"
    options = { vae = "stabilityai/sd-vae-ft-mse", text_encoder = "openai/clip-vit-large-patch14" }

    PYTHONPATH=examples warp etl --config captions.toml

or publish it as an entry point so ``name = "sd-vae"`` finds it::

    [project.entry-points."warpdata.encoders"]
    sd-vae = "my_package.diffusers_vae_encoder:make_encoder"

The contract (``warpdata.features.encoders``): ``fields(height, width)``
declares the fixed-shape outputs, ``encode(pixels, captions)`` gets a
``B×3×H×W`` uint8 tensor already on the caching device, ``identity()`` names
the weights so the cache is rebuilt when they change.
"""

from __future__ import annotations

import hashlib

import torch
from warpdata.formats.featshard import FieldSpec


def _weights_sha256(module: torch.nn.Module) -> str:
    """SHA-256 over the parameters and buffers in name order: a new checkpoint rebuilds the cache."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class DiffusersVAEEncoder:
    def __init__(self, *, device: str, dtype: str, vae: str, text_encoder: str | None = None,
                 revision: str | None = None, max_tokens: int = 77, sample: bool = False) -> None:
        import diffusers
        from diffusers import AutoencoderKL

        self.device, self.dtype, self.max_tokens, self.sample = device, dtype, max_tokens, sample
        tdtype = getattr(torch, dtype)
        self.vae = AutoencoderKL.from_pretrained(vae, revision=revision, torch_dtype=tdtype).to(device).eval()
        cfg = self.vae.config
        self.latent_channels = cfg.latent_channels
        self.down = 2 ** (len(cfg.block_out_channels) - 1)  # 8 for the SD VAEs
        self.scaling = cfg.scaling_factor
        self.shift = getattr(cfg, "shift_factor", None) or 0.0  # SD3/Flux VAEs shift before scaling
        self._id = {"name": "diffusers-vae", "version": diffusers.__version__, "vae": vae, "revision": revision,
                    "dtype": dtype, "sample": sample, "max_tokens": max_tokens}
        sha = hashlib.sha256(_weights_sha256(self.vae).encode())
        self.text = self.tokenizer = None
        if text_encoder:
            from transformers import CLIPTextModelWithProjection, CLIPTokenizer

            self.tokenizer = CLIPTokenizer.from_pretrained(text_encoder, revision=revision)
            self.text = CLIPTextModelWithProjection.from_pretrained(text_encoder, revision=revision,
                                                                    torch_dtype=tdtype).to(device).eval()
            self.text_dim = self.text.config.hidden_size
            self.proj_dim = self.text.config.projection_dim
            self._id["text_encoder"] = text_encoder
            sha.update(_weights_sha256(self.text).encode())
        self._id["weights_sha256"] = sha.hexdigest()

    def fields(self, height: int, width: int) -> list[FieldSpec]:
        if height % self.down or width % self.down:
            raise ValueError(f"{height}x{width} is not divisible by the VAE's downsampling factor {self.down}")
        out = [FieldSpec("latents", self.dtype, (self.latent_channels, height // self.down, width // self.down))]
        if self.text is not None:
            out += [FieldSpec("prompt_embeds", self.dtype, (self.max_tokens, self.text_dim)),
                    FieldSpec("pooled_prompt_embeds", self.dtype, (self.proj_dim,)),
                    FieldSpec("prompt_mask", "bool", (self.max_tokens,))]
        return out

    def encode(self, pixels: torch.Tensor, captions: list[str]) -> dict[str, torch.Tensor]:
        x = pixels.to(self.vae.dtype).div_(127.5).sub_(1.0)
        dist = self.vae.encode(x).latent_dist
        # the mode (mean) keeps the cache deterministic; sample=True draws like training-time encoding
        z = dist.sample() if self.sample else dist.mode()
        out = {"latents": ((z - self.shift) * self.scaling).to(getattr(torch, self.dtype))}
        if self.text is not None:
            tok = self.tokenizer(captions, padding="max_length", max_length=self.max_tokens, truncation=True,
                                 return_tensors="pt").to(pixels.device)
            res = self.text(input_ids=tok.input_ids, attention_mask=tok.attention_mask)
            out["prompt_embeds"] = res.last_hidden_state.to(getattr(torch, self.dtype))
            out["pooled_prompt_embeds"] = res.text_embeds.to(getattr(torch, self.dtype))
            out["prompt_mask"] = tok.attention_mask.bool()
        return out

    def identity(self) -> dict:
        return dict(self._id)


def make_encoder(*, device: str, dtype: str, **options) -> DiffusersVAEEncoder:
    """The factory warp calls: ``factory(device=..., dtype=..., **[encoder.options])``."""
    return DiffusersVAEEncoder(device=device, dtype=dtype, **options)

"""Probe inputs: random by default, local files when a path is given (never downloaded).

Random inputs are drawn once, from the spec's seed, into a small pool of batches
that the measured loop cycles through: the GPU sees the same kind of data each
window and no random-number kernels run inside a window.

Local files:

* token ids (llm, train): ``.npy`` or ``.pt`` (any integer array, flattened) or
  ``.bin`` (raw uint16, the nanoGPT layout). Windows of the needed length are
  cut at seeded random offsets.
* images (vit): ``.npy`` / ``.pt`` holding ``[N, 3, H, W]`` (float, or uint8
  scaled to [0, 1]) or ``[N, H, W, 3]`` uint8; or a folder of image files
  (needs Pillow), resized to the model's resolution. Normalized like ViT's
  processor (mean 0.5, std 0.5).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["POOL", "random_tokens", "token_windows", "load_token_ids", "random_images", "load_images"]

#: Distinct input batches cycled through by a window.
POOL = 4
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}


def random_tokens(shape: tuple[int, ...], vocab_size: int, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.randint(0, vocab_size, shape, generator=gen, dtype=torch.long).to(device)


def load_token_ids(path: str) -> torch.Tensor:
    """A 1-D long tensor of token ids from ``path`` (CPU)."""
    suffix = Path(path).suffix.lower()
    if suffix == ".bin":
        import numpy as np

        ids = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype("int64"))
    elif suffix == ".npy":
        import numpy as np

        ids = torch.from_numpy(np.load(path).astype("int64"))
    elif suffix in (".pt", ".pth"):
        ids = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"dataset_path: {path} does not hold a tensor")
        ids = ids.to(torch.long)
    else:
        raise ValueError(f"dataset_path: unsupported token file {path!r} (use .npy, .pt or .bin)")
    return ids.reshape(-1)


def token_windows(path: str, count: int, batch: int, length: int, vocab_size: int, device: torch.device,
                  seed: int) -> torch.Tensor:
    """``[count, batch, length]`` windows of real token ids from ``path``."""
    ids = load_token_ids(path)
    if ids.numel() <= length:
        raise ValueError(f"dataset_path: {path} has {ids.numel()} tokens, need more than {length}")
    if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
        raise ValueError(f"dataset_path: token ids in {path} fall outside the model's vocabulary of {vocab_size}")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    starts = torch.randint(0, ids.numel() - length, (count * batch,), generator=gen)
    windows = torch.stack([ids[s:s + length] for s in starts.tolist()])
    return windows.view(count, batch, length).to(device)


def random_images(count: int, batch: int, size: int, dtype: torch.dtype, device: torch.device,
                  seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.randn((count, batch, 3, size, size), generator=gen).to(device=device, dtype=dtype)


def _normalize(images: torch.Tensor) -> torch.Tensor:
    return (images - 0.5) / 0.5


def load_images(path: str, count: int, batch: int, size: int, dtype: torch.dtype, device: torch.device,
                seed: int) -> torch.Tensor:
    """``[count, batch, 3, size, size]`` images from a tensor file or a folder, cycled as needed."""
    if os.path.isdir(path):
        files = sorted(p for p in Path(path).iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)
        if not files:
            raise ValueError(f"dataset_path: no image files in {path}")
        from PIL import Image

        need = min(len(files), count * batch)
        tensors = []
        for file in files[:need]:
            with Image.open(file) as img:
                img = img.convert("RGB").resize((size, size), Image.BILINEAR)
                data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
                tensors.append(data.view(size, size, 3).permute(2, 0, 1).float() / 255.0)
        images = torch.stack(tensors)
    else:
        suffix = Path(path).suffix.lower()
        if suffix == ".npy":
            import numpy as np

            images = torch.from_numpy(np.load(path))
        elif suffix in (".pt", ".pth"):
            images = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise ValueError(f"dataset_path: unsupported image file {path!r} (use .npy, .pt or a folder of images)")
        if images.dim() != 4:
            raise ValueError(f"dataset_path: expected [N, 3, H, W] or [N, H, W, 3] images, got shape {tuple(images.shape)}")
        if images.shape[1] != 3 and images.shape[-1] == 3:
            images = images.permute(0, 3, 1, 2)
        images = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        if images.shape[-1] != size or images.shape[-2] != size:
            images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    images = _normalize(images)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    index = torch.randint(0, images.shape[0], (count * batch,), generator=gen)
    return images[index].view(count, batch, 3, size, size).to(device=device, dtype=dtype)

"""Is a probe's ``dataset_path`` usable? Told cheaply, before any child starts (no torch, no numpy).

The probe child loads the data (:mod:`gpuperfd.probe_child.workloads.data`) after torch's import and the
model's build: a wrong file (``--dataset /etc/passwd``) used to fail there, seconds later, inside the
child. This reads at most a file's first bytes and a folder's names, so the parent (``gpuperfd probe``,
the daemon's config check) refuses it at once, as it refuses a ``weights_path`` that does not exist.
What cannot be told without loading (a token id outside the vocabulary, too few tokens) is still the
child's to say.
"""

from __future__ import annotations

import ast
import os
import struct
from pathlib import Path
from typing import Any

from gpuperfd.probe_data.kinds import KINDS

__all__ = ["dataset_problem", "TOKEN_SUFFIXES", "IMAGE_SUFFIXES"]

#: Token ids (llm, train): what ``load_token_ids`` reads.
TOKEN_SUFFIXES = (".npy", ".pt", ".pth", ".bin")
#: Image files of a folder (vit): what ``load_images`` reads.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
_PICKLE_PROTO = b"\x80"  # torch.save's legacy format starts with a pickle protocol opcode


def _head(path: str, size: int = 4096) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(size)


def _npy_header(head: bytes) -> dict[str, Any] | None:
    """The header dict of a .npy file (``descr``, ``shape``), or None if ``head`` is not one."""
    if not head.startswith(_NPY_MAGIC) or len(head) < 10:
        return None
    major = head[6]
    if major == 1:
        (length,), start = struct.unpack("<H", head[8:10]), 10
    elif major in (2, 3) and len(head) >= 12:
        (length,), start = struct.unpack("<I", head[8:12]), 12
    else:
        return None
    try:
        header = ast.literal_eval(head[start:start + length].decode("latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    return header if isinstance(header, dict) and "descr" in header and "shape" in header else None


def _tensor_file_problem(path: str, suffix: str, head: bytes, images: bool) -> str | None:
    """What is wrong with a .npy/.pt/.bin file's first bytes for this probe, or None."""
    if suffix == ".npy":
        header = _npy_header(head)
        if header is None:
            return "is not a NumPy .npy file (no valid .npy header)"
        kind = str(header["descr"]).lstrip("<>|=")[:1]
        shape = header["shape"]
        if images:
            if not (isinstance(shape, tuple) and len(shape) == 4):
                return f"holds an array of shape {shape}; images need [N, 3, H, W] or [N, H, W, 3]"
            return None if kind in "iuf" else f"holds {header['descr']} values, not image numbers"
        return None if kind in "iu" else f"holds {header['descr']} values; token ids must be integers"
    if suffix in (".pt", ".pth"):
        if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_PROTO):
            return None
        return "is not a torch.save file (neither its zip nor its legacy pickle format)"
    size = os.path.getsize(path)  # .bin: raw uint16 token ids (the nanoGPT layout)
    if size < 4 or size % 2:
        return f"holds {size} bytes; a .bin token file is uint16 ids (an even number of bytes, 2 ids at least)"
    return None


def dataset_problem(path: str, probe: str) -> str | None:
    """What is wrong with ``path`` as ``probe``'s dataset, in words that name the path; None if it looks usable.

    Checks what the child would trip on first: the path exists and is readable, it is a folder of
    images (vit) or a file of a supported suffix whose first bytes match that format (``.npy``'s
    header: integer ids for llm/train, a 4-D array for vit; ``.pt``'s zip or pickle start;
    ``.bin``'s uint16 size)."""
    images = probe in KINDS and KINDS[probe].images
    if not os.path.exists(path):
        return f"{path} does not exist (probes never download; give a local path)"
    if os.path.isdir(path):
        if not images:
            return f"{path} is a folder; {probe} reads token ids from one file ({', '.join(TOKEN_SUFFIXES)})"
        try:
            names = os.listdir(path)
        except OSError as exc:
            return f"{path}: cannot read the folder ({exc.strerror or exc})"
        if not any(Path(name).suffix.lower() in IMAGE_SUFFIXES for name in names):
            return f"{path}: no image files in the folder ({', '.join(IMAGE_SUFFIXES)})"
        return None
    suffix = Path(path).suffix.lower()
    allowed = (".npy", ".pt", ".pth") if images else TOKEN_SUFFIXES
    if suffix not in allowed:
        what = "images: .npy, .pt or a folder of images" if images else f"token ids: {', '.join(TOKEN_SUFFIXES)}"
        kind = repr(suffix) if suffix else "(no suffix)"
        return f"{path}: unsupported file type {kind} for {probe} ({what})"
    try:
        head = _head(path)
    except OSError as exc:
        return f"{path}: cannot read it ({exc.strerror or exc})"
    problem = _tensor_file_problem(path, suffix, head, images)
    return None if problem is None else f"{path} {problem}"

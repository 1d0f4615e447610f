"""A probe's dataset is judged from its first bytes, before any child starts (no torch in the parent)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from gpuperfd.probe_data.datasets import dataset_problem
from gpuperfd.probe_data.spec import ProbeSpec


def test_usable_datasets_pass(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(5000, dtype=np.int32))
    raw = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(raw)
    pt = tmp_path / "tokens.pt"
    with zipfile.ZipFile(pt, "w") as archive:  # torch.save's layout: a zip archive
        archive.writestr("tokens/data.pkl", b"\x80\x02")
    images = tmp_path / "images.npy"
    np.save(images, np.zeros((2, 8, 8, 3), dtype=np.uint8))
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"\x89PNG")
    for path, probe in ((tokens, "llm"), (raw, "train"), (pt, "llm"), (images, "vit"), (folder, "vit")):
        assert dataset_problem(str(path), probe) is None, (path, probe)


@pytest.mark.parametrize("name,content,probe,words", [
    ("passwd", b"root:x:0:0:root:/root:/bin/bash\n", "llm", "unsupported file type (no suffix) for llm"),
    ("tokens.npy", b"not a numpy file", "llm", "is not a NumPy .npy file"),
    ("tokens.pt", b"text, not torch", "train", "is not a torch.save file"),
    ("tokens.bin", b"abc", "llm", "holds 3 bytes"),
    ("images.jpg", b"\xff\xd8", "vit", "unsupported file type '.jpg' for vit"),
])
def test_wrong_files_are_named_with_what_is_wrong(tmp_path: Path, name: str, content: bytes, probe: str,
                                                  words: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    problem = dataset_problem(str(path), probe)
    assert problem is not None and str(path) in problem and words in problem


def test_npy_contents_are_checked_from_the_header(tmp_path: Path) -> None:
    floats = tmp_path / "floats.npy"
    np.save(floats, np.ones(10, dtype=np.float32))
    assert "token ids must be integers" in dataset_problem(str(floats), "llm")
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros(48, dtype=np.uint8))
    assert "images need [N, 3, H, W] or [N, H, W, 3]" in dataset_problem(str(flat), "vit")


def test_folders_and_missing_paths(tmp_path: Path) -> None:
    assert "is a folder; llm reads token ids from one file" in dataset_problem(str(tmp_path), "llm")
    assert "no image files in the folder" in dataset_problem(str(tmp_path), "vit")
    assert "does not exist" in dataset_problem(str(tmp_path / "missing.npy"), "llm")


def test_the_spec_refuses_a_bad_dataset_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "passwd"
    bad.write_text("root:x:0:0\n")
    with pytest.raises(ValueError, match=r"^dataset_path: .*passwd: unsupported file type"):
        ProbeSpec("llm", preset="tiny", dataset_path=str(bad))


def test_the_check_imports_neither_torch_nor_numpy(tmp_path: Path) -> None:
    code = ("import sys; from gpuperfd.probe_data.datasets import dataset_problem; "
            f"dataset_problem({str(tmp_path)!r}, 'vit'); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

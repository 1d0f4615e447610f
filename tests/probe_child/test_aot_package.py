"""ViT's compiled forward as an AOT package on disk (issue 60): the first child compiles and keeps it,
later ones load it; it holds code, not weights; a damaged package is rebuilt, a bad folder falls back
to torch.compile. On the CPU with the tiny shape (each compile is a C++ build: ~12 s here)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_child.workloads import aot_package  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_vit  # noqa: E402
from gpuperfd.probe_child.workloads.vit_fused import ExportableViT, FusedViT  # noqa: E402
from gpuperfd.probe_data.spec import AOT_CACHE_ENV, ProbeSpec  # noqa: E402

CPU = torch.device("cpu")


def _compiled_vit(**more: object) -> ProbeSpec:
    return ProbeSpec("vit", preset="tiny", variant="compiled", iterations=3, repeats=1, busy_profile_seconds=0.0,
                     **more)  # type: ignore[arg-type]


def test_the_first_child_compiles_the_package_and_the_next_loads_it_and_a_damaged_one_is_rebuilt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AOT_CACHE_ENV, str(tmp_path))
    first = harness.execute(_compiled_vit())
    assert first.status == "ok", first.error
    assert first.extra["aot_package"] == "compiled" and "aot_package_error" not in first.extra
    packages = list(tmp_path.glob("*.pt2"))
    assert len(packages) == 1 and not list(tmp_path.glob(".*"))  # renamed whole, no scratch file left

    second = harness.execute(_compiled_vit())
    assert second.status == "ok", second.error
    assert second.extra["aot_package"] == "loaded"
    assert second.extra["aot_package_seconds"] < first.extra["aot_package_seconds"] / 3
    assert second.correctness["status"] == "ok"
    # the same logits as the compiling child's (same seed, same weights, same code)
    assert second.correctness["fingerprint"] == first.correctness["fingerprint"]

    packages[0].write_bytes(packages[0].read_bytes()[:1000])  # truncated: a crash mid-copy, a full disk
    third = harness.execute(_compiled_vit())
    assert third.status == "ok", third.error
    assert third.extra["aot_package"] == "compiled" and third.extra["aot_package_replaced"]
    assert list(tmp_path.glob("*.pt2")) == packages and packages[0].stat().st_size > 1000

    other = harness.execute(_compiled_vit(batch_size=2))  # another shape: its own package
    assert other.extra["aot_package"] == "compiled" and len(list(tmp_path.glob("*.pt2"))) == 2


def test_the_package_holds_code_only_and_runs_on_the_weights_it_is_given(tmp_path: Path) -> None:
    spec = ProbeSpec("vit", preset="tiny")
    torch.manual_seed(3)
    model = build_vit(spec, CPU, torch.float32)
    pixels = torch.randn(2, 3, spec.image_size, spec.image_size)
    with torch.inference_mode():
        fused = FusedViT(model)
    weights = fused.weights()
    loaded = aot_package.load_or_compile(ExportableViT(fused), (pixels, *weights), "tiny", tmp_path)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)  # other weights after the package was built
    with torch.inference_mode():
        fused = FusedViT(model)
        weights = fused.weights()
        got, want = loaded.forward(pixels, *weights), fused(pixels)
        assert float((got - want).norm() / want.norm()) < 1e-5
        assert float((want - model(pixel_values=pixels).logits).norm() / want.norm()) < 1e-5


def test_a_folder_that_cannot_hold_packages_leaves_the_probe_on_torch_compile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(AOT_CACHE_ENV, str(blocked))
    result = harness.execute(_compiled_vit())
    assert result.status == "ok", result.error
    assert "aot_package" not in result.extra and "aot_package_error" in result.extra
    assert result.extra["compiled"] is True

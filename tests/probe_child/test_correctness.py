"""Answer checks (probe_child/correctness.py) with real torch on the CPU: every probe checks its
numbers, a wrong element or a wrong bit of its output makes the run fail with ``wrong_result``, the
fault is refused outside tests, and the tolerance table covers every precision the probes use."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from gpuperfd.probe_child import correctness, harness  # noqa: E402
from gpuperfd.probe_child.correctness import TOLERANCES, SliceCheck, fingerprint, perturb, precision_of  # noqa: E402
from gpuperfd.probe_data.spec import PRESETS, PROBES, TEST_FAULTS_ENV, WRONG_RESULT_FAULTS, ProbeSpec  # noqa: E402

QUICK = {"repeats": 1, "measure_seconds": 0.05, "busy_profile_seconds": 0.0}


def _run(probe: str, **fields):
    return harness.execute(ProbeSpec(probe, preset="tiny", **{**QUICK, **fields}))


@pytest.mark.parametrize("probe", PROBES)
def test_clean_run_checks_its_numbers(probe: str) -> None:
    result = _run(probe, iterations=3)
    check = result.correctness
    assert result.status == "ok" and check["status"] == "ok", check
    assert check["checks"] == 2 and check["elements_checked"] > 0 and check["failed_checks"] == []
    assert check["repeat_fingerprints_equal"] is True
    assert 0 <= check["max_rel_error"] <= TOLERANCES[check["precision"]].element
    assert check["max_abs_error"] > 0  # a real float64 comparison of rounded products, not a copy
    assert check["seconds"] > 0 and check["fingerprint"]
    # same seed, same inputs, same path: the same fingerprint in a second child-like run
    # (the training step with fixed iterations ends with the same weights too)
    again = _run(probe, iterations=3)
    assert again.correctness["fingerprint"] == check["fingerprint"]
    assert check["peer_comparable"] is (probe != "train")


@pytest.mark.parametrize("fault", WRONG_RESULT_FAULTS)
@pytest.mark.parametrize("probe", PROBES)
def test_wrong_element_or_bit_fails_the_run(probe: str, fault: str, monkeypatch) -> None:
    monkeypatch.setenv(TEST_FAULTS_ENV, "1")
    result = _run(probe, inject_fault=fault)
    check = result.correctness
    assert check["status"] == "mismatch", check
    assert result.status == "failed" and result.failure_reason == "wrong_result"
    assert "repeat" in check["failed_checks"] and "slice" in check["failed_checks"]
    assert check["max_rel_error"] > TOLERANCES[check["precision"]].element
    assert "wrong result" in result.error_message


def test_wrong_result_faults_are_refused_outside_tests(monkeypatch) -> None:
    monkeypatch.delenv(TEST_FAULTS_ENV, raising=False)
    for fault in WRONG_RESULT_FAULTS:
        with pytest.raises(ValueError, match=TEST_FAULTS_ENV):
            ProbeSpec("attention", preset="tiny", inject_fault=fault)
    with pytest.raises(RuntimeError, match="tests only"):
        perturb(torch.ones(4), "wrong_result_bit")
    monkeypatch.setenv(TEST_FAULTS_ENV, "yes")  # only the exact switch
    with pytest.raises(ValueError, match=TEST_FAULTS_ENV):
        ProbeSpec("attention", preset="tiny", inject_fault="wrong_result_element")


def test_a_shipped_config_cannot_inject_faults(monkeypatch) -> None:
    from gpuperfd.config import ConfigError, config_from_mapping

    monkeypatch.setenv(TEST_FAULTS_ENV, "1")  # even with the switch set, YAML has no way in
    for where in ({"options": {"inject_fault": "wrong_result_bit"}}, {"inject_fault": "wrong_result_bit"}):
        schedule = {"probe": "attention", "interval_seconds": 60, **where}
        with pytest.raises((ConfigError, ValueError), match="inject_fault"):
            config_from_mapping({"probes": {"schedules": [schedule]}})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_single_bit_flip_changes_the_fingerprint(dtype, monkeypatch) -> None:
    monkeypatch.setenv(TEST_FAULTS_ENV, "1")
    base = torch.randn(3, 37, generator=torch.Generator().manual_seed(0)).to(dtype)
    ref, finite = fingerprint([base])
    assert finite and fingerprint([base.clone()])[0] == ref
    words = base.clone().view(-1).view({2: torch.int16, 4: torch.int32}[base.element_size()])
    for index in (0, 50, words.numel() - 1):
        for bit in range(base.element_size() * 8):
            flipped = words.clone()
            flipped[index] ^= torch.tensor(1, dtype=words.dtype) << bit
            assert fingerprint([flipped.view(dtype).view(3, 37)])[0] != ref, (index, bit)


def test_slice_check_tolerances_and_nan() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 256, generator=gen).to(torch.bfloat16)
    w = torch.randn(256, 64, generator=gen).to(torch.bfloat16)
    ref = x.double() @ w.double()
    good = SliceCheck("mm", x @ w, ref, "bfloat16").compare()  # bf16 output rounding: within tolerance
    assert good["ok"] and 0 < good["norm_rel_error"] < TOLERANCES["bfloat16"].norm
    out = (x @ w).clone()
    out[3, 7] = out[3, 7] * 1.25  # one wrong element, 25 %
    assert not SliceCheck("mm", out, ref, "bfloat16").compare()["ok"]
    out = (x @ w).clone()
    out[0, 0] = float("nan")
    bad = SliceCheck("mm", out, ref, "bfloat16").compare()
    assert not bad["ok"] and bad["max_abs_error"] is None  # NaN never passes
    # the same product in float32 is held to float32's tolerance, which bf16 rounding breaks
    assert not SliceCheck("mm", (x @ w), ref, "float32").compare()["ok"]


def test_tolerance_table_covers_every_precision_the_probes_use() -> None:
    cuda = torch.device("cuda")
    seen = set()
    for probe in PROBES:
        for name in PRESETS[probe]:
            dtype = getattr(torch, ProbeSpec(probe, preset=name).dtype)
            for device in (torch.device("cpu"), cuda):  # TF32 on CUDA for float32 (the context enables it)
                old = torch.backends.cuda.matmul.allow_tf32
                torch.backends.cuda.matmul.allow_tf32 = True
                try:
                    seen.add(precision_of(dtype, device))
                finally:
                    torch.backends.cuda.matmul.allow_tf32 = old
    assert seen <= set(TOLERANCES) and {"float32", "tf32", "bfloat16"} <= seen
    for tol in TOLERANCES.values():  # each bound documented, and ordered as the precisions are
        assert tol.why and 0 < tol.norm <= tol.element < 0.1
    assert TOLERANCES["float32"].norm < TOLERANCES["tf32"].norm < TOLERANCES["bfloat16"].norm
    assert math.isclose(TOLERANCES["float32"].norm, 1e-5)


def test_slice_inputs_are_fresh_each_check() -> None:
    w = torch.randn(32, 16)
    a = correctness.matmul_slice(w, torch.float32)
    b = correctness.matmul_slice(w, torch.float32)
    assert not torch.equal(a.ref, b.ref) and a.compare()["ok"] and b.compare()["ok"]


def test_a_schedules_test_fault_needs_the_switch(monkeypatch) -> None:
    """The isolation tests' faults (hang, crash, ...) reach a schedule only with the test-only switch."""
    from gpuperfd.config import ConfigError, config_from_mapping

    schedule = {"probe": "attention", "interval_seconds": 60, "options": {"inject_fault": "hang"}}
    monkeypatch.delenv(TEST_FAULTS_ENV, raising=False)
    with pytest.raises((ConfigError, ValueError), match="inject_fault is for tests only"):
        config_from_mapping({"probes": {"schedules": [schedule]}})
    monkeypatch.setenv(TEST_FAULTS_ENV, "1")
    config = config_from_mapping({"probes": {"schedules": [schedule]}})
    assert config.probes.schedules[0].options == {"inject_fault": "hang"}

"""The llm probe's Llama family in process (CPU): the static forward computes LlamaForCausalLM's
function, the shapes are seed 004's, every variant runs through the harness with its answers
checked, the roofline and the speculative figures are published, and a card without room refuses
the point before building it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from gpuperfd.probe_child import harness  # noqa: E402
from gpuperfd.probe_child.workloads.llama import probe as llama_workload  # noqa: E402
from gpuperfd.probe_child.workloads.llama.static import StaticLlama  # noqa: E402
from gpuperfd.probe_child.workloads.models import build_llama, count_parameters  # noqa: E402
from gpuperfd.probe_data.speculative import expected_tokens  # noqa: E402
from gpuperfd.probe_data.spec import ProbeSpec  # noqa: E402
from gpuperfd.probe_data.workload_cost import llama_shape  # noqa: E402

CPU = torch.device("cpu")
QUICK = {"repeats": 2, "measure_seconds": 0.05, "busy_profile_seconds": 0.0}
REFERENCE = Path("/work/shared/reference/h100-llama-seed004.json")


@pytest.fixture()
def llama() -> torch.nn.Module:
    torch.manual_seed(2)
    model = build_llama("llama-tiny", CPU, torch.float32)
    with torch.no_grad():  # larger weights than the init, so greedy tokens differ step to step
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model


def test_static_llama_matches_llama_for_causal_lm(llama: torch.nn.Module) -> None:
    B, T, O = 3, 12, 7
    prompts = torch.randint(0, llama.config.vocab_size, (B, T))
    with torch.inference_mode():
        ref_logits = llama(prompts).logits[:, -1]
        ref_tokens = llama.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=O,
                                    min_new_tokens=O, do_sample=False, pad_token_id=0)[:, T:]
        static = StaticLlama(llama, B, T, T + O + 4, verify_tokens=4)
        static.seq[:, :T].copy_(prompts)
        logits = static.prefill()
        assert float((logits - ref_logits).abs().max()) < 1e-4
        tokens = static.generate(prompts, O)
        assert torch.equal(tokens, ref_tokens)
        assert len({tuple(row.tolist()) for row in tokens.T}) > 2  # the tokens do change step to step
        # the verify step over 4 tokens gives the full forward's logits and greedy choices for each
        static.seq[:, :T].copy_(prompts)
        static.prefill()
        static.seq[:, T:T + 4].copy_(ref_tokens[:, :4])
        pos = int(static.pos)
        verify_logits = static.verify()
        full = llama(torch.cat([prompts, ref_tokens[:, :4]], dim=1)).logits[:, T:T + 4]
        assert float((verify_logits - full).abs().max()) < 1e-4
        assert torch.equal(static.verified, full.argmax(-1))
        assert int(static.pos) == pos  # a verify step leaves the position where it was


def test_fused_weights_are_the_modules_own_memory(llama: torch.nn.Module) -> None:
    before = count_parameters(llama)
    static = StaticLlama(llama, 1, 4, 8)
    layer, block = static.layers[0], llama.model.layers[0]
    base = layer.qkv.untyped_storage().data_ptr()
    for proj in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == base  # views into the fused matrix, not copies
    assert block.mlp.up_proj.weight.untyped_storage().data_ptr() == layer.gate_up.untyped_storage().data_ptr()
    assert count_parameters(llama) == before


def _storage_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages behind the model's parameters (what its weights occupy)."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return sum(storages.values())


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("form", ["graph", "compiled_form"])
def test_fused_forward_matches_the_unfused_modules(llama: torch.nn.Module, form: str, batch: int) -> None:
    """The weights are born fused (Q/K/V one matrix, gate/up one), the HF modules views into them:
    the static forward's logits equal the unfused modules' own forward, prefill and two decode steps
    (the second reads the first's cache writes), in both forms of the step: as ``graph`` runs it
    (residual adds inside the products; at batch 1 RoPE as one product a layer and K and V written
    with one kernel into a joint cache) and as ``compiled`` traces it (all element-wise, out of place).
    The model's weights occupy their parameters' bytes once."""
    B, T = batch, 10
    first = llama.model.layers[0]
    born = {p.weight.untyped_storage().data_ptr() for p in (first.self_attn.q_proj, first.self_attn.k_proj,
                                                             first.self_attn.v_proj)}
    assert len(born) == 1  # built fused: one matrix before any static forward exists
    static = StaticLlama(llama, B, T, T + 4, compile_steps=False)
    if form == "compiled_form":  # the step's code as StaticLlama(compile_steps=True) hands it to torch.compile
        static.inplace_residual = static.rope_by_product = False
    assert (static.kv_cache is not None) == (B == 1)  # the joint cache at batch 1
    size = llama.model.embed_tokens.weight.element_size()
    assert _storage_bytes(llama) == count_parameters(llama) * size  # nothing held twice
    for layer, block in zip(static.layers, llama.model.layers):
        att = block.self_attn
        assert layer.qkv.data_ptr() == att.q_proj.weight.data_ptr()  # the fused matrix is the modules' memory
        assert layer.qkv.shape[0] == sum(p.weight.shape[0] for p in (att.q_proj, att.k_proj, att.v_proj))
        assert layer.gate_up.data_ptr() == block.mlp.gate_proj.weight.data_ptr()
    prompts = torch.randint(0, llama.config.vocab_size, (B, T))
    with torch.inference_mode():
        static.seq[:, :T].copy_(prompts)
        prefill = static.prefill()
        decodes = [static.decode(), static.decode()]
        ref = llama(static.seq[:, :T + 2]).logits
    assert float((prefill - ref[:, T - 1]).abs().max()) < 1e-4
    for step, logits in enumerate(decodes):
        assert float((logits - ref[:, T + step]).abs().max()) < 1e-4, step


def test_compiled_steps_take_the_element_wise_form(llama: torch.nn.Module) -> None:
    """What torch.compile is handed: out-of-place residuals (its batch-1 products become reductions fused
    with the add) and element-wise RoPE with a cache tensor each (it fuses those itself, and copies a
    written view back whole); the eager/graph step keeps the fewer-kernel forms."""
    compiled = StaticLlama(llama, 1, 4, 8, compile_steps=True)
    assert not compiled.inplace_residual and not compiled.rope_by_product and compiled.kv_cache is None
    plain = StaticLlama(llama, 1, 4, 8)
    assert plain.inplace_residual and plain.rope_by_product and plain.kv_cache is not None


@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("form", ["graph", "compiled_form"])
def test_the_8b_step_reads_nothing_back_to_the_host(form: str, batch: int) -> None:
    """A decode step must be one CUDA graph replay: nothing in it may wait for the device (``.item()``,
    a data-dependent shape, a copy to the host), or capture fails and a step costs a round trip. On the
    meta device every such read raises, so the seed's 8B at its real shapes runs its prefill, decode and
    verify steps here in seconds, in both forms of the step, all layers, the final norm, the LM head and
    the argmax, and the tokens land in the device-side buffer."""
    model = build_llama("llama-3.1-8b", torch.device("meta"), torch.bfloat16)
    with torch.inference_mode():
        static = StaticLlama(model, batch, 128, 256, verify_tokens=13)
        if form == "compiled_form":
            static.inplace_residual = static.rope_by_product = False
        assert static.prefill().shape == (batch, 128256)
        assert static.decode().shape == (batch, 128256)
        assert static.verify().shape == (batch, 13, 128256)
        assert static.seq.device.type == "meta" and static.verified.shape == (batch, 13)
        with pytest.raises(RuntimeError, match="meta"):
            static.pos.item()  # what a host read would have done inside the step


def test_weights_not_born_fused_are_fused_once(llama: torch.nn.Module) -> None:
    """Weights from elsewhere (a directory, transformers' own init) are concatenated per layer and the
    modules rebound as views into the result: the same logits, and still no weight held twice."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(3)
    separate = LlamaForCausalLM(llama.config).eval()
    q = separate.model.layers[0].self_attn.q_proj.weight
    k = separate.model.layers[0].self_attn.k_proj.weight
    assert q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
    prompts = torch.randint(0, llama.config.vocab_size, (1, 8))
    with torch.inference_mode():
        ref = separate(prompts).logits[:, -1]
        static = StaticLlama(separate, 1, 8, 12)
        static.seq[:, :8].copy_(prompts)
        logits = static.prefill()
    assert float((logits - ref).abs().max()) < 1e-4
    block = separate.model.layers[0]
    fused = static.layers[0].qkv.untyped_storage().data_ptr()
    assert block.self_attn.k_proj.weight.untyped_storage().data_ptr() == fused
    assert _storage_bytes(separate) == count_parameters(separate) * 4


@pytest.mark.parametrize(("model", "key"), [("llama-3.1-8b", "llama-3.1-8b"), ("llama-3.2-1b", "llama-3.2-1b")])
def test_shapes_are_seed_004s(model: str, key: str) -> None:
    """Built on the meta device (no memory): the parameter counts of the reference measurement."""
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {
        "llama-3.1-8b": {"params": 8030261248}, "llama-3.2-1b": {"params": 1235814400}}
    built = build_llama(model, torch.device("meta"), torch.bfloat16)
    assert next(built.parameters()).dtype == torch.bfloat16  # made in bf16, never a float32 stage
    assert count_parameters(built) == reference[key]["params"]
    assert llama_shape(model).total_params == reference[key]["params"]


def _run(**fields: Any) -> Any:
    result = harness.execute(ProbeSpec("llm", **{**QUICK, **fields}))
    assert result.status == "ok", (result.error_message, result.extra.get("traceback"))
    assert result.correctness["status"] == "ok" and result.correctness["checks"] == 2
    return result


@pytest.mark.parametrize("variant", ["graph", "eager"])
def test_llama_tiny_measures_prefill_and_decode_apart(variant: str) -> None:
    result = _run(preset="llama-tiny", variant=variant)
    assert result.work_unit == "token" and result.extra["model_family"] == "llama"
    for name in ("ttft_seconds", "tpot_seconds"):
        assert result.latencies[name] and all(v > 0 for v in result.latencies[name])
    assert result.throughput["decode_tokens_per_second"] > 0
    roofline = result.extra["roofline"]
    assert roofline["hbm_bytes_per_second"] is None and roofline["share"] is None  # a CPU has no HBM row
    assert 0 < roofline["weight_bytes"] < roofline["parameter_bytes"] == result.extra["model_parameters"] * 4


def test_a_compile_that_fails_measures_the_graph_forms_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``compiled`` variant whose compile fails (no compiler, a torch that cannot trace the step) is
    measured with the step as written, in the graph variant's forms (residuals inside the products, RoPE
    as one product at batch 1), with the reason published; its answers are still checked."""

    def broken(fn: Any, **_kwargs: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("inductor: no working C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    result = _run(preset="llama-tiny", variant="compiled", batch_size=1)
    assert result.ok, result.error_message
    assert result.extra["compile_error"] == "RuntimeError: inductor: no working C++ compiler"
    assert result.extra["torch_compile"] is False
    assert result.extra["step_forms"] == {"residual_in_product": True, "rope_by_product": True,
                                          "joint_kv_cache": False, "fused_decode_kernels": False}
    assert result.correctness["status"] == "ok"
    assert result.throughput["decode_tokens_per_second"] > 0


def test_speculative_reports_tokens_per_second_at_the_named_rates() -> None:
    result = _run(preset="llama-tiny-spec", acceptance_rates=[0.0, 0.6, 1.0])
    spec = result.extra["speculative"]
    k = spec["speculative_tokens"]
    assert k == 4 and result.params["acceptance_rates"] == [0.0, 0.6, 1.0]
    assert "random weights" in spec["note"] and "not measured" in spec["note"]
    assert "random weights" in result.extra["acceptance_note"]
    rates = [p["acceptance_rate"] for p in spec["at_rates"]]
    assert rates == [0.0, 0.6, 1.0]
    for point in spec["at_rates"]:
        assert point["tokens_per_second"] == pytest.approx(
            expected_tokens(point["acceptance_rate"], k) / spec["round_seconds"] * result.params["batch_size"])
    assert spec["at_rates"][-1]["expected_tokens_per_round"] == k + 1
    curve = [p["tokens_per_second"] for p in spec["curve"]]
    assert curve == sorted(curve) and len(curve) == 11
    assert spec["draft_round_seconds"] > 0 and spec["verify_seconds"] > 0
    # the headline is the first named rate's tokens/s: one figure, not two roughly alike (issue 61: 5,760
    # headline against 5,808 in the table at 0.5), and the round the table divides by is the measured one
    assert result.throughput["output_tokens_per_second"] == pytest.approx(spec["at_rates"][0]["tokens_per_second"],
                                                                          rel=1e-9)
    assert spec["round_seconds"] == pytest.approx(1 / result.throughput["rounds_per_second"], rel=1e-9)


def test_roofline_of_the_8b_on_an_h100_is_the_references() -> None:
    """Every parameter once per token (16.06 GB) at 3.35 TB/s: the reference's 208.6 tokens/s."""
    figures = llama_workload.roofline_figures("NVIDIA H100 80GB HBM3", 16_060_522_496, 0.0, 1, 192.0, 167.0)
    assert figures["tokens_per_second"] == pytest.approx(208.6, abs=0.1)
    assert figures["share"] == pytest.approx(167.0 / 208.6, rel=1e-3)
    h200 = llama_workload.roofline_figures("NVIDIA H200", 16_060_522_496, 0.0, 1, 192.0, None)
    assert h200["tokens_per_second"] == pytest.approx(298.9, abs=0.1) and h200["share"] is None
    # ours counts the bytes a step reads (the embedding is a gather): a higher bound, a stricter share;
    # the (every parameter) is published beside it
    both = llama_workload.roofline_figures("NVIDIA H100 80GB HBM3", int(llama_shape("llama-3.1-8b").matmul_params * 2),
                                           0.0, 1, 192.0, 167.0, parameter_bytes=16_060_522_496)
    assert both["tokens_per_second"] == pytest.approx(223.2, abs=0.1)
    assert both["all_parameters_tokens_per_second"] == pytest.approx(208.6, abs=0.1)
    assert both["all_parameters_share"] == pytest.approx(167.0 / 208.6, rel=1e-3)  # the 80 %
    # batch 32 reads each sequence's live KV cache too
    b32 = llama_workload.roofline_figures("NVIDIA H100 80GB HBM3", 16_060_522_496, 131072.0, 32, 192.0, None)
    assert b32["bytes_per_step"] == 16_060_522_496 + 32 * 131072 * 192
    assert llama_workload.roofline_figures("NVIDIA H100 PCIe", 1, 0, 1, 1, None)["hbm_bytes_per_second"] == 2.0e12
    from gpuperfd.device.roofline import hbm_bandwidth

    assert hbm_bandwidth("NVIDIA GH200 480GB") is None  # its memory depends on the variant: not guessed
    assert hbm_bandwidth("NVIDIA H200 NVL") == 4.8e12 and hbm_bandwidth(None) is None


def test_a_card_without_room_refuses_the_preset_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ProbeSpec("llm", preset="llama-3.1-8b", device="cuda")
    ctx = SimpleNamespace(is_cuda=True, device=torch.device("cuda"), gpu_name="NVIDIA L4")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (15 * 2**30, 23 * 2**30))
    with pytest.raises(ValueError, match=r"^preset: llama-3.1-8b .* needs about 1[6-9]\.\d GiB .* NVIDIA L4 has 15\.0 GiB free"):
        llama_workload.check_room(spec, ctx)  # type: ignore[arg-type]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79 * 2**30, 80 * 2**30))
    llama_workload.check_room(spec, ctx)  # type: ignore[arg-type]
    # the KV cache grows with the batch: 2048 sequences of 256 positions are 68 GiB of it
    big = ProbeSpec("llm", preset="llama-3.1-8b", device="cuda", batch_size=2048)
    with pytest.raises(ValueError, match="^preset: "):
        llama_workload.check_room(big, ctx)  # type: ignore[arg-type]


def test_the_compiled_step_is_one_graph_with_the_same_tokens(llama: torch.nn.Module) -> None:
    """What the ``compiled`` variant captures on a GPU: torch.compile traces a decode step whole (no
    graph break, which would leave eager launches between the fused kernels) and greedy-decodes the
    same tokens as the step as written. Compiled here for the CPU (a C++ toolchain), tens of seconds."""
    import torch._dynamo

    B, T, O = 2, 12, 6
    prompts = torch.randint(0, llama.config.vocab_size, (B, T))
    with torch.inference_mode():
        expected = StaticLlama(llama, B, T, T + O).generate(prompts, O)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        static = StaticLlama(llama, B, T, T + O, compile_steps=True)
        static.seq[:, :T].copy_(prompts)
        static.prefill()
        for _ in range(O - 1):
            static.run_decode()
        assert torch.equal(static.seq[:, T:T + O], expected)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_point_without_room_is_skipped_not_failed_end_to_end() -> None:
    """Through a real child (as ``gpuperfd probe`` and the daemon run it): on a CPU the child's memory
    limit stands for the card's free memory. The run is skipped with reason no_room and the message
    names the preset; no health check or failing alert counts a skipped run."""
    import threading

    from gpuperfd.probe_data.request import ProbeRequest
    from gpuperfd.probing.executors import ChildProcessExecutor, measure_once

    # the 8B in float32 on a CPU child limited to 4 GiB (enough for torch and transformers, not for 32 GB)
    spec = ProbeSpec("llm", preset="llama-3.1-8b", device="cpu", memory_limit_bytes=4 << 30, **QUICK)
    executor = ChildProcessExecutor(120.0, compile_cache=False)
    result = measure_once(executor, None, ProbeRequest.from_spec(spec, 120.0), threading.Event())
    assert (result.status, result.failure_reason) == ("skipped", "no_room"), result.error_message
    assert result.error_message.startswith("preset: llama-3.1-8b (llama-3.1-8b, batch 1) needs about 3")
    assert "the child's memory limit is 4096 MiB: not run" in result.error_message
    from gpuperfd.probe_child.child import classify_exception

    assert classify_exception(llama_workload.NoRoom("preset: x")) == "no_room"
    assert classify_exception(ValueError("preset: x")) == "exception"

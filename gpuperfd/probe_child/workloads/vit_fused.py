"""ViT inference written for the GPU: one QKV matmul, SDPA, capturable in a CUDA graph.

The Hugging Face module runs three separate Q/K/V projections and a chain of
separate element-wise kernels; this forward takes the same weights and computes
the same function (exact GELU, per-token layer norms, logits from [CLS]) with:

* the patch embedding as an unfold (one copy) and a matmul: the same arithmetic as
  the 16x16 stride-16 convolution, which cuDNN runs as a layout transform plus an
  older-generation kernel (~1.1 ms of a 12 ms ViT-B/16 batch of 128 on an H200,
  for 30 GFLOP; measured in benchmarks/results/probes_gpu_h200_vit_diag.json);
* Q, K and V as one ``[3D, D]`` matmul (one pass over the activations, one larger
  and more efficient GEMM instead of three);
* ``scaled_dot_product_attention`` on the strided Q/K/V views (no copies);
* the final layer norm applied to the [CLS] token only (it is per-token, and only
  [CLS] reaches the classifier);
* no Python-side control flow, so a CUDA graph can capture the whole forward;
* the 12 (24, 32) encoder layers as calls of one function, :func:`encoder_layer`, so
  ``torch.compile`` traces and compiles one layer and every layer runs that graph
  (:meth:`FusedViT.compile_layers`; regional compilation). The whole forward as one
  graph compiled 12 copies of the same layer: on an H200 the cold compile (a node's
  first vit child) went from 15.0 to 5.0 s, the warm one in a ready child from 1.6-2.1
  to 1.24 s, images/s unchanged (issue 60, docs/benchmarks.md). Each call starts with the
  residual add of the layer before it (``x + delta``), so the compiler still fuses that
  add with the layer norm that follows it, as it did across layers in one graph;
* GELU as an opaque custom op (``gpuperfd::gelu``, the aten kernel): inductor's own
  GELU kernel took 169 us against aten's 109 us for ViT-B/16's [25216, 3072] bf16
  activation on an H200 (same diagnosis file), so the compiler fuses what it does
  well (residual add + layer norm) and leaves GELU to aten.

Both Hugging Face weight layouts are accepted (``q_proj``/``fc1`` in transformers
5.2x, ``attention.attention.query``/``intermediate.dense`` in earlier releases).
Tests compare its logits with ``ViTForImageClassification`` on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["FusedViT", "encoder_layer", "gelu"]


@torch.library.custom_op("gpuperfd::gelu", mutates_args=())
def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU through aten; opaque to torch.compile (see the module docstring)."""
    return F.gelu(x)


@gelu.register_fake
def _gelu_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@dataclass
class _Layer:
    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    qkv_w: torch.Tensor  # [3D, D]
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    fc1_w: torch.Tensor
    fc1_b: torch.Tensor
    fc2_w: torch.Tensor
    fc2_b: torch.Tensor


def encoder_layer(x: torch.Tensor, delta: torch.Tensor, ln1_w: torch.Tensor, ln1_b: torch.Tensor,
                  qkv_w: torch.Tensor, qkv_b: torch.Tensor | None, o_w: torch.Tensor, o_b: torch.Tensor,
                  ln2_w: torch.Tensor, ln2_b: torch.Tensor, fc1_w: torch.Tensor, fc1_b: torch.Tensor,
                  fc2_w: torch.Tensor, fc2_b: torch.Tensor, batch: int, heads: int,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One pre-norm encoder layer over ``x + delta`` (``[batch * tokens, D]``): returns the stream
    after attention and the MLP's output, whose residual add the next call (or the head) makes.
    Weights are arguments, so one compiled graph serves every layer of the same shape."""
    x = x + delta
    rows, d = x.shape
    tokens = rows // batch
    h = F.layer_norm(x, (d,), ln1_w, ln1_b, eps)
    qkv = F.linear(h, qkv_w, qkv_b).view(batch, tokens, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [B, H, N, Dh]
    x = x + F.linear(a.transpose(1, 2).reshape(rows, d), o_w, o_b)
    h = F.layer_norm(x, (d,), ln2_w, ln2_b, eps)
    return x, F.linear(gelu(F.linear(h, fc1_w, fc1_b)), fc2_w, fc2_b)


def _first(obj: Any, *paths: str) -> Any:
    """The first attribute path that exists on ``obj`` (handles renamed submodules)."""
    for path in paths:
        cur = obj
        try:
            for part in path.split("."):
                cur = getattr(cur, part)
        except AttributeError:
            continue
        return cur
    raise AttributeError(f"none of {paths} found on {type(obj).__name__}")


class FusedViT:
    """A callable ``pixels [B, 3, H, W] -> logits [B, classes]`` over a HF ViT's weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        cfg = model.config
        if cfg.hidden_act != "gelu":
            raise ValueError(f"FusedViT implements exact GELU only, not {cfg.hidden_act!r}")
        vit = model.vit
        emb = vit.embeddings
        self.patch = cfg.patch_size
        self.heads = cfg.num_attention_heads
        self.d = cfg.hidden_size
        self.eps = cfg.layer_norm_eps
        conv = emb.patch_embeddings.projection
        # [D, C, P, P] -> [D, C*P*P], matching the (channel, row, column) order of the unfold below.
        self.patch_w = conv.weight.detach().reshape(conv.weight.shape[0], -1)
        self.patch_b = conv.bias
        self.cls = emb.cls_token
        self.pos = emb.position_embeddings
        self.layers: list[_Layer] = []
        for layer in _first(vit, "layers", "encoder.layer"):
            q = _first(layer, "attention.q_proj", "attention.attention.query")
            k = _first(layer, "attention.k_proj", "attention.attention.key")
            v = _first(layer, "attention.v_proj", "attention.attention.value")
            o = _first(layer, "attention.o_proj", "attention.output.dense")
            fc1 = _first(layer, "mlp.fc1", "intermediate.dense")
            fc2 = _first(layer, "mlp.fc2", "output.dense")
            qkv_b = None if q.bias is None else torch.cat([q.bias, k.bias, v.bias]).detach()
            self.layers.append(_Layer(
                layer.layernorm_before.weight, layer.layernorm_before.bias,
                torch.cat([q.weight, k.weight, v.weight]).detach(), qkv_b,
                o.weight, o.bias,
                layer.layernorm_after.weight, layer.layernorm_after.bias,
                fc1.weight, fc1.bias, fc2.weight, fc2.bias,
            ))
        self.lnf_w, self.lnf_b = vit.layernorm.weight, vit.layernorm.bias
        self.head_w, self.head_b = model.classifier.weight, model.classifier.bias
        self.layer: Any = encoder_layer

    def compile_layers(self) -> None:
        """Run every layer through one ``torch.compile`` of :func:`encoder_layer` (traced and compiled
        at the first call; the layers share its graph, their weights being its arguments)."""
        self.layer = torch.compile(encoder_layer)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        B, C, height, width = pixels.shape
        D, H, P = self.d, self.heads, self.patch
        gh, gw = height // P, width // P
        patches = pixels.view(B, C, gh, P, gw, P).permute(0, 2, 4, 1, 3, 5).reshape(B * gh * gw, C * P * P)
        x = F.linear(patches, self.patch_w, self.patch_b).view(B, gh * gw, D)
        x = torch.cat([self.cls.expand(B, -1, -1), x], dim=1) + self.pos
        N = x.shape[1]
        # The first layer's pending residual is the embedding itself, added to a zero stream
        # (one element-wise pass) so that every layer is the same call.
        stream, delta = torch.zeros_like(x).reshape(B * N, D), x.reshape(B * N, D)
        for p in self.layers:
            stream, delta = self.layer(stream, delta, p.ln1_w, p.ln1_b, p.qkv_w, p.qkv_b, p.o_w, p.o_b,
                                       p.ln2_w, p.ln2_b, p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b, B, H, self.eps)
        # The final layer norm is per token and only [CLS] reaches the classifier.
        cls = stream.view(B, N, D)[:, 0] + delta.view(B, N, D)[:, 0]
        cls = F.layer_norm(cls, (D,), self.lnf_w, self.lnf_b, self.eps)
        return F.linear(cls, self.head_w, self.head_b)

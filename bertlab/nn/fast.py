"""Inference modules beside the network: the same parameters (and state-dict keys) as the
paper's modules in model.py and heads.py, computed with fewer passes over memory.

``install(model)`` chooses them when a model is built (``post_init``) and again whenever it is
moved or cast (``model.to(...)``, ``.bfloat16()`` ...), by changing the class of each module in
place to its subclass here; the forward of model.py stays the equation. What each one does:

* ``FastSelfOutput``, ``FastOutput``: the residual sum ``dense(h) + x`` written into the
  product's own buffer (in training, dropout's), and on a CPU with bfloat16 matrix units the
  bias, the sum and (in ``FastIntermediate``, ``FastPredictionHeadTransform``) the activation
  applied by oneDNN inside the product (fused.py: about a fifth of a bfloat16 forward pass of
  bert-base);
* ``FastIntermediate``: the activation overwrites its input when no gradient is recorded;
* ``FusedLinear``: the query, key and value projections with the bias inside the oneDNN
  product (installed only where the weights are CPU bfloat16 and oneDNN can fuse);
* ``FastLayer``: the feed-forward network in row chunks when its intermediate would be large
  (``feed_forward_in_chunks``);
* ``BertModel.spare_rows``: a packed batch's token count rounded up (packing.round_rows) where
  oneDNN builds a kernel per matrix shape.

Each steps aside to the plain forward of its parent class where its trick does not apply (a
gradient is recorded, a hook must see the call) and whenever the model is traced
(torch.compile fuses on its own, and an exported graph must hold only standard operators).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn import fused
from bertlab.nn.heads import BertPredictionHeadTransform
from bertlab.nn.model import (
    BertIntermediate,
    BertLayer,
    BertModel,
    BertOutput,
    BertSelfAttention,
    BertSelfOutput,
)
from bertlab.nn.packing import round_rows, tracing

# model.ACTIVATIONS, overwriting their input: used when no gradient is recorded, to save
# allocating (and page-faulting in) a fresh (tokens, I) buffer in every layer.
ACTIVATIONS_INPLACE = {
    "gelu": lambda t: torch.ops.aten.gelu_(t),
    "gelu_new": lambda t: torch.ops.aten.gelu_(t, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda t: F.silu(t, inplace=True),
}

FFN_CHUNK_ABOVE = 32 << 20  # bytes: glibc's largest block served from its heap (64-bit)
FFN_CHUNK_BYTES = 24 << 20  # bytes of intermediate per chunk, at most


def _recording(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


class FusedLinear(nn.Linear):
    """nn.Linear whose bias is added inside the oneDNN product (CPU bfloat16 inference)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if not tracing() and fused.fusable(self, x):
            return fused._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return super().forward(x)


class _FastResidual:
    """LN(dense(h) + x) for BertSelfOutput and BertOutput: the sum written into the product's
    buffer, or fused into it by oneDNN. h (..., in), x (..., H) -> (..., H)."""

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if tracing():
            return super().forward(h, x)  # the paper's module (the next class in the MRO)
        if self.training:  # the sum into dropout's fresh output (its backward needs only its mask)
            return self.LayerNorm(self.dropout(self.dense(h)).add_(x))
        return self.LayerNorm(fused.linear_add(self.dense, h, x))


class FastSelfOutput(_FastResidual, BertSelfOutput):
    """LN(W_O context + x)."""


class FastOutput(_FastResidual, BertOutput):
    """LN(h W_2 + b_2 + x)."""


class FastIntermediate(BertIntermediate):
    """act(x W_1 + b_1), the activation in place (or fused by oneDNN) without gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, I)
        if tracing():
            return super().forward(x)
        return fused.linear_act(self.dense, x, self.hidden_act, self._activate)

    def _activate(self, h: torch.Tensor) -> torch.Tensor:
        if h.requires_grad:
            return self.intermediate_act_fn(h)
        return ACTIVATIONS_INPLACE[self.hidden_act](h)


class FastPredictionHeadTransform(BertPredictionHeadTransform):
    """LN(act(W h + b)), the activation fused by oneDNN where it can be."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H)
        if tracing():
            return super().forward(x)
        return self.LayerNorm(
            fused.linear_act(self.dense, x, self.hidden_act, self.transform_act_fn)
        )


class FastLayer(BertLayer):
    """A layer whose feed-forward network runs in row chunks when its intermediate is large."""

    def feed_forward(self, a: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        return feed_forward_in_chunks(self, a)


def feed_forward_in_chunks(layer: BertLayer, a: torch.Tensor) -> torch.Tensor:
    """LN(a + FFN(a)), (..., H) -> (..., H). In inference, when the (..., I) intermediate would
    pass FFN_CHUNK_ABOVE bytes, the rows go through in chunks: each row's arithmetic is its own,
    so the results are the same (up to how the math library splits a product; bit-identical on
    the project's CPU). glibc hands out a block that large as fresh pages from the kernel on
    every call, and each page costs a fault when first written: about 4% of a float32
    bert-base forward on variable-length text. Chunked, the intermediate is small enough for
    glibc to reuse, and peak memory drops. Whole when a gradient is recorded, a hook watches
    the feed-forward modules, or the model is traced."""
    width = layer.intermediate.dense.out_features * a.element_size()
    rows = a.numel() // a.size(-1)
    if (
        tracing()
        or rows * width <= FFN_CHUNK_ABOVE
        or _recording(a)
        or any(fused._hooked(m) for m in (*layer.intermediate.modules(), *layer.output.modules()))
    ):
        return BertLayer.feed_forward(layer, a)
    chunk = 1 << ((FFN_CHUNK_BYTES // width).bit_length() - 1)  # a power of two
    flat = a.reshape(rows, a.size(-1))
    out = torch.empty_like(flat)
    for s in range(0, rows, chunk):
        part = flat[s : s + chunk]
        out[s : s + chunk] = layer.output(layer.intermediate(part), part)
    return out.view_as(a)


# The paper's module -> its inference twin (same attributes, so the class can change in place).
FAST: dict[type[nn.Module], type[nn.Module]] = {
    BertSelfOutput: FastSelfOutput,
    BertOutput: FastOutput,
    BertIntermediate: FastIntermediate,
    BertPredictionHeadTransform: FastPredictionHeadTransform,
    BertLayer: FastLayer,
}


def _onednn_bf16(weight: torch.Tensor) -> bool:
    """Weights for which oneDNN fuses bfloat16 products (and builds a kernel per shape)."""
    return fused._AVAILABLE and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"


def install(model: nn.Module) -> None:
    """Give every module of ``model`` its inference twin, for where its weights now are. Called
    when a model is built and whenever it is moved or cast; idempotent. State dicts, hooks and
    parameters are untouched (only classes change)."""
    for m in model.modules():
        if type(m) in FAST:
            m.__class__ = FAST[type(m)]
        if isinstance(m, BertSelfAttention):
            for proj in (m.query, m.key, m.value):
                if type(proj) in (nn.Linear, FusedLinear):
                    proj.__class__ = FusedLinear if _onednn_bf16(proj.weight) else nn.Linear
        if isinstance(m, BertModel):
            weight = m.embeddings.word_embeddings.weight
            m.spare_rows = round_rows if _onednn_bf16(weight) else None


def uninstall(model: nn.Module) -> None:
    """Back to the paper's modules only (for comparisons: the plain forward of every module)."""
    plain = {fast: paper for paper, fast in FAST.items()}
    for m in model.modules():
        if type(m) in plain:
            m.__class__ = plain[type(m)]
        if type(m) is FusedLinear:
            m.__class__ = nn.Linear
        if isinstance(m, BertModel):
            m.spare_rows = None

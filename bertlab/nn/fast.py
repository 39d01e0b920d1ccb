"""Inference modules beside the network: the same parameters (and state-dict keys) as the
paper's modules in model.py and heads.py, computed with fewer passes over memory.

``install(model)`` chooses them when a model is built (``post_init``) and again whenever it is
moved or cast (``model.to(...)``, ``.bfloat16()`` ...), by changing the class of each module in
place to its subclass here; the forward of model.py stays the equation. What each one does:

* ``FastSelfOutput``, ``FastOutput``: the residual sum ``dense(h) + x`` written into the
  product's own buffer (in training, dropout's), and in CPU inference (float32, and bfloat16
  where the CPU has it) the product run by oneDNN on weights packed once, with the bias, the
  sum and (in ``FastIntermediate``, ``FastPredictionHeadTransform``) the activation applied
  inside it (fused.py);
* ``FastIntermediate``: the activation overwrites its input when no gradient is recorded;
* ``FastSelfAttention``: the query, key and value projections as one oneDNN product on their
  stacked, packed weights (fused.qkv);
* ``FastLayer``: the feed-forward network in row chunks when its intermediate would be large
  (``feed_forward_in_chunks``);
* ``FastEncoder``: in CPU inference with no hook to serve, every layer computed straight from
  its packed weights (``layer_inference``): seven oneDNN and PyTorch calls per layer and no
  module calls between them. At one short sentence the module calls cost more than the
  attention: on the bundled 6-layer model, 21 tokens, 2 threads, 6.1 -> 4.6 ms in float32
  and 5.0 -> 3.0 ms in bfloat16;
* ``BertModel.spare_rows``: a packed batch's token count rounded up (packing.round_rows) where
  oneDNN builds a kernel per matrix shape (CPU float32 and bfloat16).

Each steps aside to the plain forward of its parent class where its trick does not apply (a
gradient is recorded, a hook must see the call) and whenever the model is traced
(torch.compile fuses on its own, and an exported graph must hold only standard operators).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn import fused
from bertlab.nn.attention import BACKENDS
from bertlab.nn.heads import BertPredictionHeadTransform
from bertlab.nn.model import (
    BertEncoder,
    BertIntermediate,
    BertLayer,
    BertModel,
    BertOutput,
    BertSelfAttention,
    BertSelfOutput,
)
from bertlab.nn.packing import Layout, round_rows, tracing
from bertlab.nn.precision import Int8Linear

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
    """nn.Linear computed by oneDNN on its packed weight (fused.product) in CPU inference. The
    attention projections are these: when a hook watches one, ``FastSelfAttention`` still
    computes the three as one product and calls each projection with its share of it
    (``given``), so the hook sees the call and the numbers are those of an unwatched run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        given = self.__dict__.get("_given")
        if given is not None and given[0] is x:  # (a pre-hook that changed x gets it computed)
            return given[1]
        if not tracing() and fused.fusable(self, x, called=True):
            return fused.product(x, *fused.packed(self, (self,)))
        return super().forward(x)

    def given(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Call the layer (its hooks run) with ``out`` as its result, already computed."""
        self.__dict__["_given"] = (x, out)
        try:
            return self(x)
        finally:
            del self.__dict__["_given"]


class FastSelfAttention(BertSelfAttention):
    """Multi-head self-attention whose three projections run as one product (fused.qkv)."""

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        projections = (self.query, self.key, self.value)
        own = all(type(p) is FusedLinear for p in projections)
        if tracing():
            stacked = fused.int8_qkv(self, x)  # (float ones: the compiler concatenates them)
        else:
            stacked = fused.qkv(self, x) if own else None
        if stacked is None:  # (..., 3H) or None
            return super().forward(x, layout, need_weights)
        parts = stacked.chunk(3, dim=-1)
        if any(fused._hooked(p) for p in projections):  # each hook sees its projection's call
            parts = tuple(p.given(x, part) for p, part in zip(projections, parts, strict=True))
        q, k, v = (layout.split_heads(t, self.num_heads) for t in parts)
        context, probs = BACKENDS[layout.kernel](q, k, v, layout.keys, 0.0, need_weights)
        return layout.merge_heads(context), probs


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


class FastEncoder(BertEncoder):
    """The encoder, in CPU inference run layer by layer from packed weights (layer_inference);
    the module path otherwise (a gradient, a hook, another dtype or device, tracing, attention
    probabilities asked for)."""

    def forward(
        self,
        x: torch.Tensor,
        layout: Layout,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        if output_attentions or not self.direct(x):
            return super().forward(x, layout, output_hidden_states, output_attentions)
        hidden_states = [x]
        for layer in self.layer:
            x = layer_inference(layer, x, layout)
            hidden_states.append(x)
        return x, tuple(hidden_states) if output_hidden_states else None, None

    def direct(self, x: torch.Tensor) -> bool:
        """True when every layer may run as layer_inference: inference on the CPU in a dtype
        oneDNN computes, the paper's modules (no adapter wrapped around a linear layer), the
        same dtype throughout, and no hook anywhere in the encoder."""
        if self.training or tracing() or not fused.shape_cached(x):
            return False
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.layer.parameters()):
            return False
        m = nn.modules.module
        if m._global_forward_hooks or m._global_forward_pre_hooks:
            return False
        for layer in self.layer:
            if type(layer) is not FastLayer:  # a layer replaced, or not given its twin
                return False
            s = layer.attention.self
            for lin in (
                s.query,
                s.key,
                s.value,
                layer.attention.output.dense,
                layer.intermediate.dense,
                layer.output.dense,
            ):
                if isinstance(lin, Int8Linear):
                    continue  # float32 in, float32 out
                if not isinstance(lin, nn.Linear) or lin.weight.dtype != x.dtype:
                    return False
        stack = list(self.layer._modules.values())
        while stack:  # every module under the layers (faster than modules())
            mod = stack.pop()
            if mod._forward_hooks or mod._forward_pre_hooks:
                return False
            if isinstance(mod, nn.Linear) and type(mod) not in (nn.Linear, FusedLinear):
                return False  # an adapter (LoRA ...) built on nn.Linear
            stack.extend(mod._modules.values())
        return True


def layer_inference(layer: BertLayer, x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """One encoder layer, LN(a + FFN(a)) with a = LN(x + MultiHead(x)), computed from the
    layer's packed weights (fused.packed_groups) without calling its modules: the equations of
    model.py, each product with its bias, activation or residual sum inside (fused.product).
    x (B, T, H) or (N, H) -> the same shape."""
    attention, intermediate, output = layer.attention, layer.intermediate, layer.output
    heads = attention.self.num_heads
    s = attention.self
    qkv, out, first, second = fused.packed_groups(
        layer,
        (
            (s.query, s.key, s.value),
            (attention.output.dense,),
            (intermediate.dense,),
            (output.dense,),
        ),
    )
    q, k, v = (layout.split_heads(t, heads) for t in fused.product(x, *qkv).chunk(3, dim=-1))
    context = layout.merge_heads(BACKENDS[layout.kernel](q, k, v, layout.keys, 0.0, False)[0])
    a = _layer_norm(attention.output.LayerNorm, fused.product(context, *out, add=x))
    act, norm = intermediate.hidden_act, output.LayerNorm

    def feed_forward(a: torch.Tensor) -> torch.Tensor:  # LN(a + act(a W_1 + b_1) W_2 + b_2)
        return _layer_norm(norm, fused.product(fused.product(a, *first, act=act), *second, add=a))

    rows = a.numel() // a.size(-1)
    width = intermediate.dense.out_features * a.element_size()
    if rows * width <= FFN_CHUNK_ABOVE:
        return feed_forward(a)
    chunk = 1 << ((FFN_CHUNK_BYTES // width).bit_length() - 1)  # as feed_forward_in_chunks
    flat = a.reshape(rows, a.size(-1))
    y = torch.empty_like(flat)
    for start in range(0, rows, chunk):
        y[start : start + chunk] = feed_forward(flat[start : start + chunk])
    return y.view_as(a)


def _layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


# The paper's module -> its inference twin (same attributes, so the class can change in place).
FAST: dict[type[nn.Module], type[nn.Module]] = {
    BertSelfOutput: FastSelfOutput,
    BertOutput: FastOutput,
    BertIntermediate: FastIntermediate,
    BertPredictionHeadTransform: FastPredictionHeadTransform,
    BertLayer: FastLayer,
    BertSelfAttention: FastSelfAttention,
    BertEncoder: FastEncoder,
}


def _onednn(weight: torch.Tensor) -> bool:
    """Weights whose products oneDNN runs (and builds a kernel for per shape)."""
    return fused.onednn_dtype(weight.dtype) and weight.device.type == "cpu"


def install(model: nn.Module) -> None:
    """Give every module of ``model`` its inference twin, for where its weights now are. Called
    when a model is built and whenever it is moved or cast; idempotent. State dicts, hooks and
    parameters are untouched (only classes change); packed weights are made again."""
    fused.forget(model)
    for m in model.modules():
        if type(m) in FAST:
            m.__class__ = FAST[type(m)]
        if type(m) is nn.Linear:
            m.__class__ = FusedLinear
        if isinstance(m, BertModel):
            weight = m.embeddings.word_embeddings.weight
            m.spare_rows = round_rows if _onednn(weight) else None


def uninstall(model: nn.Module) -> None:
    """Back to the paper's modules only (``set_fast_inference(False)``: the plain forward of
    every module)."""
    fused.forget(model)
    plain = {fast: paper for paper, fast in FAST.items()}
    for m in model.modules():
        if type(m) in plain:
            m.__class__ = plain[type(m)]
        if type(m) is FusedLinear:
            m.__class__ = nn.Linear
        if isinstance(m, BertModel):
            m.spare_rows = None

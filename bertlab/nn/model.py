"""The BERT network (Devlin et al. 2018), top to bottom in the order of the paper's figure:
embeddings, self-attention, feed-forward, layer, encoder, pooler (the task heads are in
heads.py).

Module and parameter names are those of the original checkpoints and of transformers
(``embeddings.word_embeddings``, ``encoder.layer.N.attention.self.query``, ``pooler.dense`` ...),
so a state dict moves between them key for key. Leaf modules take plain numbers; only the
top-level models read a BertConfig. No I/O and no training here (see checkpoint.py, train.py).

Shapes: B batch, T sequence length, H hidden size, A heads, D = H / A, I intermediate size,
V vocabulary size, C choices, L layers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn import fused
from bertlab.nn.attention import BACKENDS, packed_attention
from bertlab.nn.config import ATTN_IMPLEMENTATIONS, BertConfig
from bertlab.nn.outputs import (
    BaseModelOutputWithPooling,
)
from bertlab.nn.packing import Packing, check_rows, round_rows

ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),  # exact, with erf: what BERT uses
    "gelu_new": lambda: nn.GELU(approximate="tanh"),  # the tanh form of the original TF code
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}
# The same functions, overwriting their input: used when no gradient is recorded, to save
# allocating (and page-faulting in) a fresh (tokens, I) buffer in every layer.
ACTIVATIONS_INPLACE = {
    "gelu": lambda t: torch.ops.aten.gelu_(t),
    "gelu_new": lambda t: torch.ops.aten.gelu_(t, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda t: F.silu(t, inplace=True),
}
Layout = torch.Tensor | Packing | None  # how a batch is laid out: a padding mask, or packed


# ============================================================================ embeddings
class BertEmbeddings(nn.Module):
    """word + position + token type, summed, then LayerNorm and dropout (reference 002)."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int,
        pad_token_id: int,
        layer_norm_eps: float,
        dropout: float,
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=pad_token_id)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T)
        token_type_ids: torch.Tensor | None = None,  # (B, T), default all 0 (segment A)
        position_ids: torch.Tensor | None = None,  # (B, T) or (T,), default 0..T-1
        inputs_embeds: torch.Tensor | None = None,  # (B, T, H) instead of input_ids
    ) -> torch.Tensor:  # (B, T, H)
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        T = inputs_embeds.shape[-2]  # the sequence length (or N tokens, packed)
        if position_ids is None:
            position_ids = torch.arange(T, device=inputs_embeds.device)
        if token_type_ids is None:
            token_type_ids = torch.zeros(T, dtype=torch.long, device=inputs_embeds.device)
        # The order of the sum follows the reference implementation, so float rounding matches.
        x = inputs_embeds + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


# ============================================================================ attention
class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product self-attention: softmax(Q K^T / sqrt(D)) V per head."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, attn_implementation: str):
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout_p = dropout
        self.attn_implementation = attn_implementation

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Padded: x (B, T, H), layout the (B, T) bool mask or None -> context (B, T, H) and
        probs (B, A, T, T) or None. Packed: x (N, H), layout a Packing -> context (N, H)."""
        A, H = self.num_heads, x.shape[-1]
        p = self.dropout_p if self.training else 0.0
        q, k, v = (fused.linear(layer, x) for layer in (self.query, self.key, self.value))
        if isinstance(layout, Packing):
            q, k, v = (t.view(-1, A, H // A) for t in (q, k, v))
            context, _ = packed_attention(q, k, v, layout, p)
            return context.reshape(-1, H), None
        B, T, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, A, T, D)
            return t.view(B, T, A, H // A).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        # A packed model asked for attention probabilities runs padded for that call.
        name = "sdpa" if self.attn_implementation == "packed" else self.attn_implementation
        context, probs = BACKENDS[name](q, k, v, layout, p, need_weights)
        return context.transpose(1, 2).reshape(B, T, H), probs


class BertSelfOutput(nn.Module):
    """Output projection W_O, dropout, then the residual and LayerNorm: LN(x + W_O(context))."""

    def __init__(self, hidden_size: int, layer_norm_eps: float, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, context: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        if self.training:
            return self.LayerNorm(self.dropout(self.dense(context)).add_(x))
        return self.LayerNorm(fused.linear_add(self.dense, context, x))


class BertAttention(nn.Module):
    """The attention sub-layer: x -> LN(x + MultiHead(x)). 4*H*H + 4*H parameters."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attention_dropout: float,
        hidden_dropout: float,
        layer_norm_eps: float,
        attn_implementation: str,
    ):
        super().__init__()
        self.self = BertSelfAttention(
            hidden_size, num_heads, attention_dropout, attn_implementation
        )
        self.output = BertSelfOutput(hidden_size, layer_norm_eps, hidden_dropout)

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, probs = self.self(x, layout, need_weights)
        return self.output(context, x), probs


# ============================================================================ feed-forward
class BertIntermediate(nn.Module):
    """First half of the position-wise feed-forward network: act(x W_1 + b_1), H -> I."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = ACTIVATIONS[hidden_act]()
        self.hidden_act = hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, I)
        return fused.linear_act(self.dense, x, self.hidden_act, self.activate)

    def activate(self, h: torch.Tensor) -> torch.Tensor:
        if h.requires_grad:
            return self.intermediate_act_fn(h)
        return ACTIVATIONS_INPLACE[self.hidden_act](h)


class BertOutput(nn.Module):
    """Second half, I -> H, dropout, residual, LayerNorm: LN(x + h W_2 + b_2)."""

    def __init__(
        self, intermediate_size: int, hidden_size: int, layer_norm_eps: float, dropout: float
    ):
        super().__init__()
        self.dense = nn.Linear(intermediate_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B,T,I),(B,T,H)->(B,T,H)
        if self.training:
            return self.LayerNorm(self.dropout(self.dense(h)).add_(x))
        return self.LayerNorm(fused.linear_add(self.dense, h, x))


# ============================================================================ layer, encoder
FFN_CHUNK_ABOVE = 32 << 20  # bytes: glibc's largest block served from its heap (64-bit)
FFN_CHUNK_BYTES = 24 << 20  # bytes of intermediate per chunk, at most


class BertLayer(nn.Module):
    """One Transformer encoder layer (post-LayerNorm, as in BERT):
    a = LN(x + MultiHead(x));  y = LN(a + FFN(a))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.attention = BertAttention(
            c.hidden_size,
            c.num_attention_heads,
            c.attention_probs_dropout_prob,
            c.hidden_dropout_prob,
            c.layer_norm_eps,
            c.attn_implementation,
        )
        self.intermediate = BertIntermediate(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.output = BertOutput(
            c.intermediate_size, c.hidden_size, c.layer_norm_eps, c.hidden_dropout_prob
        )

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, probs = self.attention(x, layout, need_weights)
        return self.feed_forward(a), probs

    def feed_forward(self, a: torch.Tensor) -> torch.Tensor:
        """LN(a + FFN(a)), (..., H) -> (..., H). In inference, when the (..., I) intermediate
        would pass FFN_CHUNK_ABOVE bytes, the rows go through in chunks: each row's arithmetic
        is its own, so the results are the same (up to how the math library splits a product;
        bit-identical on the project's CPU). glibc hands out a block that large as fresh pages
        from the kernel on every call, and each page costs a fault when first written: about
        4% of a float32 bert-base forward on variable-length text. Chunked, the intermediate
        is small enough for glibc to reuse, and peak memory drops."""
        width = self.intermediate.dense.out_features * a.element_size()
        rows = a.numel() // a.size(-1)
        if (
            rows * width <= FFN_CHUNK_ABOVE
            or (torch.is_grad_enabled() and a.requires_grad)
            or any(fused._hooked(m) for m in (*self.intermediate.modules(), *self.output.modules()))
        ):
            return self.output(self.intermediate(a), a)
        chunk = 1 << ((FFN_CHUNK_BYTES // width).bit_length() - 1)  # a power of two
        flat = a.reshape(rows, a.size(-1))
        out = torch.empty_like(flat)
        for s in range(0, rows, chunk):
            part = flat[s : s + chunk]
            out[s : s + chunk] = self.output(self.intermediate(part), part)
        return out.view_as(a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H) padded, or (N, H) packed
        layout: Layout,  # (B, T) bool mask or None, or a Packing
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for layer in self.layer:
            x, probs = layer(x, layout, output_attentions)
            if output_hidden_states:
                hidden_states.append(x)
            if output_attentions:
                attentions.append(probs)
        return (
            x,
            tuple(hidden_states) if output_hidden_states else None,
            tuple(attentions) if output_attentions else None,
        )


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence vector that NSP and sentence classifiers read."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, H), reading position 0; or the [CLS] vectors (B, H) directly."""
        return self.activation(self.dense(x[:, 0] if x.dim() == 3 else x))


# ============================================================================ base class
class BertPreTrainedModel(nn.Module):
    """Shared by every model: weight initialisation, checkpoints, backend choice."""

    base_model_prefix = "bert"
    config: BertConfig

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a bertlab.BertConfig, got {type(config).__name__}")
        self.config = config

    def post_init(self) -> None:
        """Initialise every weight as BERT does, then tie the output embeddings."""
        self.apply(self._init_weights)
        if self.config.position_init == "sinusoidal":
            emb = self.base_model.embeddings.position_embeddings
            with torch.no_grad():
                emb.weight.copy_(sinusoidal_positions(*emb.weight.shape))
        self.tie_weights()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        with torch.no_grad():
            if isinstance(module, nn.Linear):
                module.weight.normal_(0.0, std)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, std)
                if module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()

    def tie_weights(self) -> None:
        """Share the MLM decoder's weight with the word embeddings (if the model has one)."""
        head = getattr(getattr(self, "cls", None), "predictions", None)
        if head is not None and self.config.tie_word_embeddings:
            head.decoder.weight = self.base_model.embeddings.word_embeddings.weight

    @property
    def base_model(self) -> BertModel:
        return getattr(self, self.base_model_prefix, self)

    def set_attn_implementation(self, name: str) -> None:
        """Switch every attention layer to another kernel ("eager" or "sdpa")."""
        if name not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation {name!r} is not one of {ATTN_IMPLEMENTATIONS}")
        for m in self.modules():
            if isinstance(m, BertSelfAttention):
                m.attn_implementation = name
            elif isinstance(m, BertPreTrainedModel):  # this model and the encoder inside it
                m.config = m.config.replace(attn_implementation=name)

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any):
        """Load a Hugging Face or bertlab model folder (see ``checkpoint.load_pretrained``)."""
        from bertlab.io.checkpoint import load_pretrained

        return load_pretrained(cls, path, **kwargs)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` and ``model.safetensors`` (transformers loads them back)."""
        from bertlab.io.checkpoint import save_pretrained

        save_pretrained(self, directory)


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """The fixed encoding of Vaswani et al. 2017 §3.5, (P, H): sin on even dims, cos on odd.
    BERT learns its position table; this is only an optional starting point (reference 003)."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table.float()


# ============================================================================ input checks
def _check_range(name: str, t: torch.Tensor, limit: int, what: str) -> None:
    bad = (t < 0) | (t >= limit)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        value = int(t[where])
        at = where[0] if len(where) == 1 else where
        raise ValueError(f"{name} {value} at position {at} is outside {what}")


def check_inputs(
    config: BertConfig,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
) -> tuple[int, int]:
    """Reject bad inputs with a message naming the value and the limit, before any computation.
    Returns (B, T)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("give exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape (batch, seq_len), got {tuple(input_ids.shape)}"
            )
        shape = tuple(input_ids.shape)
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, seq_len, {config.hidden_size}), "
                f"got {tuple(inputs_embeds.shape)}"
            )
        shape = tuple(inputs_embeds.shape[:2])
    B, T = shape
    if B == 0 or T == 0:
        raise ValueError(f"empty batch: inputs have shape {shape}")
    if T > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {T} is longer than max_position_embeddings "
            f"({config.max_position_embeddings})"
        )
    if input_ids is not None:
        _check_range(
            "token id", input_ids, config.vocab_size, f"the vocabulary (size {config.vocab_size})"
        )
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, but the input ids have {shape}")
    if token_type_ids is not None:
        _check_range(
            "token type id",
            token_type_ids,
            config.type_vocab_size,
            f"type_vocab_size ({config.type_vocab_size})",
        )
    if position_ids is not None:
        if tuple(position_ids.shape) not in (shape, (1, T), (T,)):
            raise ValueError(
                f"position_ids has shape {tuple(position_ids.shape)}, expected {shape} or ({T},)"
            )
        _check_range(
            "position id",
            position_ids,
            config.max_position_embeddings,
            f"max_position_embeddings ({config.max_position_embeddings})",
        )
    return B, T


# ============================================================================ BertModel
class BertModel(BertPreTrainedModel):
    """The encoder: embeddings -> L layers -> (optional) pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        c = config
        self.embeddings = BertEmbeddings(
            c.vocab_size,
            c.hidden_size,
            c.max_position_embeddings,
            c.type_vocab_size,
            c.pad_token_id,
            c.layer_norm_eps,
            c.hidden_dropout_prob,
        )
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(c.hidden_size) if add_pooling_layer else None
        if type(self) is BertModel:
            self.post_init()

    @property
    def base_model(self) -> BertModel:
        return self

    def encode(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> Encoded:
        """Run the encoder; the heads call this. With the packed kernel the result stays packed
        (N, H): padding is removed once, here, before the embeddings, and only put back where a
        caller asks for padded outputs (``Encoded.padded``)."""
        B, T = check_inputs(
            self.config, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds
        )
        if self.config.attn_implementation == "packed" and not output_attentions:
            device = (input_ids if input_ids is not None else inputs_embeds).device
            packing = Packing.from_mask(attention_mask, B, T, device)
            if position_ids is None:  # each token's column, as in the padded layout
                position_ids = torch.arange(T, device=device)
            positions = packing.unpad(position_ids.expand(B, T).unsqueeze(-1)).squeeze(-1)
            types = None if token_type_ids is None else packing.unpad(token_type_ids)
            ids = None if input_ids is None else packing.unpad(input_ids)
            embeds = None if inputs_embeds is None else packing.unpad(inputs_embeds)
            x = self.embeddings(ids, types, positions, embeds)  # (N, H)
            if not packing.dense and fused.shape_cached(x):  # spare rows, computed, never read
                x = F.pad(x, (0, 0, 0, round_rows(packing.total) - packing.total))
            layout: Layout = packing
        else:
            packing = None
            x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
            layout = None
            if attention_mask is not None:
                layout = attention_mask.bool()
                check_rows(layout)
                if bool(layout.all()):
                    layout = None  # no padding: let the kernel skip the mask
        x, hidden_states, attentions = self.encoder(
            x, layout, output_hidden_states, output_attentions
        )
        if packing is not None and x.shape[0] > packing.total:  # drop the spare rows
            x = x[: packing.total]
            if hidden_states is not None:
                hidden_states = tuple(h[: packing.total] for h in hidden_states)
        pooled = None
        if self.pooler is not None:
            pooled = self.pooler(x if packing is None else packing.first_tokens(x))
        enc = Encoded(x, packing, pooled, None, attentions)
        if hidden_states is not None:
            enc.hidden_states = tuple(enc.padded(h) for h in hidden_states)
        return enc

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T) token ids
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = token, 0 = padding
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment 0 / 1
        position_ids: torch.Tensor | None = None,  # (B, T) or (T,)
        inputs_embeds: torch.Tensor | None = None,  # (B, T, H)
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> BaseModelOutputWithPooling:
        enc = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
        )
        return BaseModelOutputWithPooling(
            last_hidden_state=enc.padded(enc.hidden),  # (B, T, H); zeros at padding if packed
            pooler_output=enc.pooled,
            hidden_states=enc.hidden_states,
            attentions=enc.attentions,
        )


@dataclass
class Encoded:
    """What the encoder gives the heads: hidden states in the layout they were computed in."""

    hidden: torch.Tensor  # (B, T, H) padded, or (N, H) packed
    packing: Packing | None  # how to go between the two (None: padded)
    pooled: torch.Tensor | None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None  # L+1 of (B, T, H)
    attentions: tuple[torch.Tensor, ...] | None  # L of (B, A, T, T)

    def padded(self, t: torch.Tensor) -> torch.Tensor:
        """A per-token tensor in the hidden layout -> (B, T, ...), zeros at padding."""
        return t if self.packing is None else self.packing.pad(t)

    def per_token(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, T, ...) tensor (labels) -> the hidden layout."""
        return t if self.packing is None else self.packing.unpad(t)

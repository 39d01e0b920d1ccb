"""The BERT network (Devlin et al. 2018), top to bottom in the order of the paper's figure:
embeddings, self-attention, feed-forward, layer, encoder, pooler (the task heads are in
heads.py).

Module and parameter names are those of the original checkpoints and of transformers
(``embeddings.word_embeddings``, ``encoder.layer.N.attention.self.query``, ``pooler.dense`` ...),
so a state dict moves between them key for key. Leaf modules take plain numbers; only the
top-level models read a BertConfig. No I/O and no training here (see io/, train/).

Each forward is the equation, and it is what runs, whatever the dtype, device, precision or
layout, in training and in inference, with hooks or adapters, and inside the compiled and
exported programs (which trace it). Speed comes through three seams, each called at the one
place where its choice matters: the attention kernel (attention.BACKENDS, named once by the
config's attn_implementation), the batch layout, padded or packed (packing.enter -> layout.exit),
and the product of a linear layer with its activation or residual sum (products.linear and
products.projections, whose one policy picks oneDNN on prepacked weights, the int8 product, or
the module itself). Module classes never change: a model is made of these classes, and of
precision.Int8Linear only where ``quantize_int8`` returned a new model made so.

Shapes: B batch, T sequence length, H hidden size, A heads, D = H / A, I intermediate size,
V vocabulary size, C choices, L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertlab.nn import products
from bertlab.nn.activations import ACTIVATIONS
from bertlab.nn.attention import BACKENDS
from bertlab.nn.checks import check_forward_keywords, check_inputs
from bertlab.nn.config import ATTN_IMPLEMENTATIONS, BertConfig
from bertlab.nn.module import Module
from bertlab.nn.outputs import BaseModelOutputWithPooling
from bertlab.nn.packing import Layout, Packing, enter
from bertlab.nn.surface import TransformersSurface, drop_tied_decoder, restore_tied_decoder


# ============================================================================ embeddings
class BertEmbeddings(Module):
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
        from_ids = inputs_embeds is None
        T = input_ids.shape[-1] if from_ids else inputs_embeds.shape[-2]  # (or N tokens, packed)
        if position_ids is None:
            position_ids = torch.arange(T, device=(input_ids if from_ids else inputs_embeds).device)
        if from_ids:
            # float32 inference on bertlab's AVX2 kernels: the same sums and the layer norm, in
            # one call (products.embeddings; None where these operations must run)
            x = products.embeddings(self, input_ids, token_type_ids, position_ids)
            if x is not None:
                return x
            inputs_embeds = self.word_embeddings(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros(T, dtype=torch.long, device=inputs_embeds.device)
        # The order of the sum follows the reference implementation, so float rounding matches.
        x = inputs_embeds + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


# ============================================================================ attention
class BertSelfAttention(Module):
    """Multi-head scaled dot-product self-attention: softmax(Q K^T / sqrt(D)) V per head
    (Vaswani et al. 2017, eq. 1), with Q = x W_Q, K = x W_K, V = x W_V."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dropout_p = dropout

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, H) padded or (N, H) packed -> context of the same shape, and the
        probabilities (B, A, T, T) when asked for (padded layouts only). The layout names the
        kernel (attention.BACKENDS) and which keys each query may see."""
        A = self.num_heads
        # x W_Q, x W_K, x W_V, one product where they can share it (products.py)
        projected = products.projections((self.query, self.key, self.value), x)
        # (B, T, H) -> (B, A, T, D) padded; (N, H) -> (N, A, D) packed
        q, k, v = (layout.split_heads(t, A) for t in projected)
        p = self.dropout_p if self.training else 0.0
        context, probs = BACKENDS[layout.kernel](q, k, v, layout.keys, p, need_weights)
        return layout.merge_heads(context), probs


class BertSelfOutput(Module):
    """Output projection W_O, dropout, then the residual and LayerNorm: LN(x + W_O(context))."""

    def __init__(self, hidden_size: int, layer_norm_eps: float, dropout: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, context: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        # LN(x + dropout(W_O context + b_O)), the sum and the norm inside the product where they
        # can be
        return products.linear(
            self.dense, context, dropout=self.dropout, residual=x, norm=self.LayerNorm
        )


class BertAttention(Module):
    """The attention sub-layer: x -> LN(x + MultiHead(x)). 4*H*H + 4*H parameters."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        attention_dropout: float,
        hidden_dropout: float,
        layer_norm_eps: float,
    ):
        super().__init__()
        self.self = BertSelfAttention(hidden_size, num_heads, attention_dropout)
        self.output = BertSelfOutput(hidden_size, layer_norm_eps, hidden_dropout)

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        context, probs = self.self(x, layout, need_weights)  # (B, T, H)
        return self.output(context, x), probs  # LN(x + W_O context)


# ============================================================================ feed-forward
class BertIntermediate(Module):
    """First half of the position-wise feed-forward network: act(x W_1 + b_1), H -> I."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.dense = nn.Linear(hidden_size, intermediate_size)
        self.intermediate_act_fn = ACTIVATIONS[hidden_act].module()
        self.hidden_act = hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, I)
        return products.linear(self.dense, x, act=self.intermediate_act_fn)  # act(x W_1 + b_1)


class BertOutput(Module):
    """Second half, I -> H, dropout, residual, LayerNorm: LN(x + h W_2 + b_2)."""

    def __init__(
        self, intermediate_size: int, hidden_size: int, layer_norm_eps: float, dropout: float
    ):
        super().__init__()
        self.dense = nn.Linear(intermediate_size, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # (B,T,I),(B,T,H)->(B,T,H)
        # LN(x + dropout(h W_2 + b_2)), the sum and the norm inside the product where they can be
        return products.linear(self.dense, h, dropout=self.dropout, residual=x, norm=self.LayerNorm)


# ============================================================================ layer, encoder
class BertLayer(Module):
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
        )
        self.intermediate = BertIntermediate(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.output = BertOutput(
            c.intermediate_size, c.hidden_size, c.layer_norm_eps, c.hidden_dropout_prob
        )

    def forward(
        self, x: torch.Tensor, layout: Layout, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, probs = self.attention(x, layout, need_weights)  # a = LN(x + MultiHead(x))
        # y = LN(a + FFN(a)), row by row: in row chunks where its (..., I) would be large
        width = self.intermediate.dense.out_features
        y = products.in_row_chunks(self.feed_forward, a, width, self.intermediate, self.output)
        return y, probs

    def feed_forward(self, a: torch.Tensor) -> torch.Tensor:
        """y = LN(a + FFN(a)), (..., H) -> (..., H)."""
        return self.output(self.intermediate(a), a)


class BertEncoder(Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # In training, keep only each layer's input and recompute the layer during backward
        # (BertPreTrainedModel.gradient_checkpointing_enable): activation memory for gradients.
        self.gradient_checkpointing = False
        self.checkpoint_options: dict[str, Any] = {}

    def forward(
        self,
        x: torch.Tensor,  # (B, T, H) padded, or (N, H) packed
        layout: Layout,  # (B, T) bool mask or None, or a Packing
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, tuple | None, tuple | None]:
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layer:
            if recompute:
                options = {"use_reentrant": False, **self.checkpoint_options}
                x, probs = checkpoint(layer, x, layout, output_attentions, **options)
            else:
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


class BertPooler(Module):
    """tanh(W h_[CLS] + b): the sentence vector that NSP and sentence classifiers read."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The [CLS] vectors (B, H) -> (B, H); given (B, T, H), it reads position 0."""
        first = x[:, 0] if x.dim() == 3 else x
        # tanh(W h + b), by the product seam as every layer's products (products.py)
        return products.linear(self.dense, first, act=self.activation)


# ============================================================================ base class
class BertPreTrainedModel(TransformersSurface, Module):
    """Shared by every model: weight initialisation, the kernel's choice, and (surface.py) the
    helpers and files of transformers' models."""

    base_model_prefix = "bert"
    config: BertConfig

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise TypeError(f"config must be a bertlab.BertConfig, got {type(config).__name__}")
        config.check()  # a config changed since it was built is checked before it builds a model
        self.config = config
        # a tied MLM decoder weight named once in the state dict (surface.py says why)
        self.register_state_dict_post_hook(drop_tied_decoder)
        self.register_load_state_dict_pre_hook(restore_tied_decoder)

    def post_init(self) -> None:
        """Initialise every weight as BERT does and tie the output embeddings."""
        self.apply(self._init_weights)
        if self.config.position_init == "sinusoidal":
            emb = self.base_model.embeddings.position_embeddings
            with torch.no_grad():
                emb.weight.copy_(sinusoidal_positions(*emb.weight.shape))
        self.tie_weights()

    def set_fast_inference(self, enabled: bool) -> None:
        """Let the product seam choose the policy's fused products for this model's layers, and
        its embeddings kernel where there is one (True, the default), or send every product
        through PyTorch's own ``nn.Linear`` and the embeddings through their modules (False):
        then the forward computes as transformers does, bit for bit on the same machine in
        float32. The forward is the same code either way (products.py)."""
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, got {enabled!r}")
        products.plain(self, not enabled)

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
        head = self.mlm_head()
        if head is not None and self.config.tie_word_embeddings:
            head.decoder.weight = self.base_model.embeddings.word_embeddings.weight

    @property
    def base_model(self) -> BertModel:
        return getattr(self, self.base_model_prefix, self)

    def set_attn_implementation(self, name: str) -> None:
        """Switch to another attention kernel ("eager", "sdpa" or "packed"). The kernel is named
        in one place, the config (shared by this model and the encoder inside it)."""
        if name not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation {name!r} is not one of {ATTN_IMPLEMENTATIONS}")
        config = self.config.replace(attn_implementation=name)
        for m in self.modules():
            if isinstance(m, BertPreTrainedModel):
                m.config = config


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """The fixed encoding of Vaswani et al. 2017 §3.5, (P, H): sin on even dims, cos on odd.
    BERT learns its position table; this is only an optional starting point (reference 003)."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table.float()


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
        output_hidden_states: bool | None = None,  # None: the config's
        output_attentions: bool | None = None,
        **kwargs: Any,  # transformers' keywords with nothing to do here (checks.py)
    ) -> Encoded:
        """Run the encoder; the heads call this. The batch enters its layout once, before the
        embeddings (packed: the padding removed), and the hidden states stay in it: only the
        outputs a caller sees are padded back (``Encoded.padded``)."""
        self.config.check()
        check_forward_keywords(kwargs)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        B, T = check_inputs(
            self.config, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds
        )
        kernel = self.config.attn_implementation
        if kernel == "packed" and output_attentions:
            kernel = "sdpa"  # the packed kernel gives no probabilities: this call runs padded
        device = (input_ids if input_ids is not None else inputs_embeds).device
        # where oneDNN builds a kernel per shape, a packed batch's rows are rounded up
        spare = products.row_rounding(self.embeddings.word_embeddings.weight)
        layout = enter(kernel, attention_mask, B, T, device, spare)
        tokens = layout.inputs(input_ids, token_type_ids, position_ids, inputs_embeds)
        x = layout.grow(self.embeddings(*tokens))  # (B, T, H), or (N, H) packed
        x, hidden_states, attentions = self.encoder(
            x, layout, output_hidden_states, output_attentions
        )
        x = layout.exit(x)
        pooled = None if self.pooler is None else self.pooler(layout.first_tokens(x))  # (B, H)
        if hidden_states is not None:  # L+1 of (B, T, H)
            hidden_states = tuple(layout.pad(layout.exit(h)) for h in hidden_states)
        return Encoded(x, layout, pooled, hidden_states, attentions)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, T) token ids
        attention_mask: torch.Tensor | None = None,  # (B, T) 1 = token, 0 = padding
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment 0 / 1
        position_ids: torch.Tensor | None = None,  # (B, T) or (T,)
        inputs_embeds: torch.Tensor | None = None,  # (B, T, H)
        output_hidden_states: bool | None = None,  # None: the config's (as every flag here)
        output_attentions: bool | None = None,
        return_dict: bool | None = None,  # False: the output's computed fields as a tuple
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling:
        enc = self.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        out = BaseModelOutputWithPooling(
            last_hidden_state=enc.padded(enc.hidden),  # (B, T, H); zeros at padding if packed
            pooler_output=enc.pooled,
            hidden_states=enc.hidden_states,
            attentions=enc.attentions,
        )
        return self.returned(out, return_dict)


@dataclass
class Encoded:
    """What the encoder gives the heads: hidden states in the layout they were computed in."""

    hidden: torch.Tensor  # (B, T, H) padded, or (N, H) packed
    layout: Layout  # how to go between the two
    pooled: torch.Tensor | None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None  # L+1 of (B, T, H)
    attentions: tuple[torch.Tensor, ...] | None  # L of (B, A, T, T)

    @property
    def packing(self) -> Packing | None:
        """The packing of a packed batch, None when it ran padded."""
        return self.layout if isinstance(self.layout, Packing) else None

    def padded(self, t: torch.Tensor) -> torch.Tensor:
        """A per-token tensor in the hidden layout -> (B, T, ...), zeros at padding if packed."""
        return self.layout.pad(t)

    def mean(self) -> torch.Tensor:
        """(B, H) float32: each sequence's last hidden state averaged over its real tokens (the
        mean pooling of sentence embeddings), computed in the layout it is in."""
        return self.layout.mean(self.hidden)

    def first(self) -> torch.Tensor:
        """(B, H): each sequence's first hidden state (its [CLS])."""
        return self.layout.first_tokens(self.hidden)

    def per_token(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, T, ...) tensor (labels) -> the hidden layout."""
        return self.layout.unpad(t)

"""Input checks of the models: every bad input is refused with a message naming the value and
the limit, before any computation. The checks that read tensor values are skipped while the
model is traced (torch.compile, torch.export, ONNX export), where they would make the graph
depend on data; in eager use they always run (tests/test_bad_input.py).
"""

from __future__ import annotations

import torch

from bertlab.nn.config import BertConfig
from bertlab.nn.losses import IGNORE_INDEX
from bertlab.nn.packing import tracing


def _check_range(name: str, t: torch.Tensor, limit: int, what: str) -> None:
    """Refuse a value of ``t`` outside [0, limit), naming it and its position. Skipped while
    tracing (it reads the tensor's values; an exported graph cannot raise)."""
    if tracing() or t.numel() == 0:
        return
    low, high = torch.aminmax(t)  # (one pass: a batch-1 forward's largest check)
    if low.item() < 0 or high.item() >= limit:
        bad = (t < 0) | (t >= limit)
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
    Returns (B, T). The checks of shapes and dtypes always run; those of values (token ids in the
    vocabulary, ...) are skipped while tracing (torch.compile, torch.export): they read data."""
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


def check_labels(labels: torch.Tensor, num_classes: int, name: str = "label") -> None:
    """Refuse a label outside [0, num_classes) that is not IGNORE_INDEX. Skipped while tracing."""
    if tracing():
        return
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} {int(labels[where])} at position {where} is outside [0, {num_classes}) "
            f"(use {IGNORE_INDEX} to ignore a position)"
        )


# Keywords transformers' models take that have nothing to do in BERT's encoder, accepted so
# that code written for those models runs.
#   num_items_in_batch: passed by transformers' Trainer when a forward takes **kwargs. bertlab
#     models set accepts_loss_kwargs = False, so the Trainer averages over accumulated batches
#     itself; a value that arrives anyway is not needed (each loss is a mean over its batch).
#   use_cache: a decoder's cache switch (an encoder has none).
IGNORED_KEYWORDS = ("num_items_in_batch", "use_cache")
# A decoder's cache and cross-attention inputs, and head masks: not part of BERT's encoder
# here, so accepted only as None.
NONE_ONLY_KEYWORDS = (
    "past_key_values",
    "cache_position",
    "head_mask",
    "encoder_hidden_states",
    "encoder_attention_mask",
)


def check_forward_keywords(kwargs: dict) -> None:
    """Refuse a keyword a forward does not know, naming it and the accepted ones."""
    for key, value in kwargs.items():
        if key in IGNORED_KEYWORDS or (key in NONE_ONLY_KEYWORDS and value is None):
            continue
        if key in NONE_ONLY_KEYWORDS:
            raise ValueError(
                f"{key} is not supported by bertlab's BERT encoder (got a "
                f"{type(value).__name__}); pass None or leave it out"
            )
        raise TypeError(
            f"forward() got an unexpected keyword argument {key!r}; besides the inputs it "
            f"accepts output_hidden_states, output_attentions, return_dict and (ignored) "
            f"{', '.join(IGNORED_KEYWORDS + NONE_ONLY_KEYWORDS)}"
        )

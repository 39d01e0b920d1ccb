"""Padding a list of examples into one batch: the one place that does it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def pad(examples: Sequence[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """input_ids (B, T) padded with ``pad_id`` to the longest example, token_type_ids and
    attention_mask (B, T) with 0 at padding; all int64. Each example holds ``input_ids`` and
    ``token_type_ids`` as lists or 1-D tensors."""
    if not examples:
        raise ValueError("a batch needs at least one example")
    B, T = len(examples), max(len(e["input_ids"]) for e in examples)
    batch = {
        "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
        "token_type_ids": torch.zeros(B, T, dtype=torch.long),
        "attention_mask": torch.zeros(B, T, dtype=torch.long),
    }
    for r, e in enumerate(examples):
        n = len(e["input_ids"])
        batch["input_ids"][r, :n] = torch.as_tensor(e["input_ids"])
        batch["token_type_ids"][r, :n] = torch.as_tensor(e["token_type_ids"])
        batch["attention_mask"][r, :n] = 1
    return batch

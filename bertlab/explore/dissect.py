"""Embedding dissection: BERT's input vector is word + position + token type, summed and
layer-normalised (reference 002). This takes the embedding layer apart and checks the identity."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertlab.nn.model import BertEmbeddings


@dataclass(frozen=True)
class EmbeddingDissection:
    word: torch.Tensor  # (T, H) word_embeddings(input_ids)
    position: torch.Tensor  # (T, H) position_embeddings(0..T-1)
    token_type: torch.Tensor  # (T, H) token_type_embeddings(segment ids)
    summed: torch.Tensor  # (T, H) word + token_type + position
    normalized: torch.Tensor  # (T, H) LayerNorm(summed)
    module_output: torch.Tensor  # (T, H) embeddings(input_ids, token_type_ids), eval mode
    max_abs_diff: float  # |normalized - module_output|, 0 up to float rounding


@torch.no_grad()
def dissect_embeddings(
    embeddings: BertEmbeddings, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None
) -> EmbeddingDissection:
    """Each part of the embedding of one sequence. input_ids, token_type_ids: (T,)."""
    T = input_ids.shape[0]
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    was_training = embeddings.training
    embeddings.eval()  # dropout off, so the layer's output is the deterministic identity
    try:
        word = embeddings.word_embeddings(input_ids)
        position = embeddings.position_embeddings(torch.arange(T))
        token_type = embeddings.token_type_embeddings(token_type_ids)
        summed = word + token_type + position
        normalized = embeddings.LayerNorm(summed)
        module_output = embeddings(input_ids[None], token_type_ids[None])[0]
    finally:
        embeddings.train(was_training)
    diff = float((normalized - module_output).abs().max())
    return EmbeddingDissection(word, position, token_type, summed, normalized, module_output, diff)

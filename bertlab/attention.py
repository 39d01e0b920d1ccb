"""Attention kernels. Every kernel has one signature and is picked by name from ``BACKENDS``.

    kernel(q, k, v, mask, dropout_p, need_weights) -> (context, probs or None)

    q, k, v: (B, A, T, D)  queries, keys, values per head (A heads of size D)
    mask:    (B, T) bool, True where a key is a real token, or None when there is no padding
    context: (B, A, T, D)  softmax(q k^T / sqrt(D) + mask) v
    probs:   (B, A, T, T)  the attention probabilities, or None when the kernel cannot give them

Padding keys get a score of the dtype's most negative value, so their probability is exactly 0
(as in the reference implementation) and a padded row equals the same sequence alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Kernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float, bool],
    tuple[torch.Tensor, torch.Tensor | None],
]


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention equation written out (Vaswani et al. 2017, eq. 1). Returns probabilities."""
    scale = q.size(-1) ** -0.5  # multiplied, not divided, to round as the reference does
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, A, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    context = torch.matmul(F.dropout(probs, p=dropout_p), v)  # (B, A, T, D)
    return context, probs if need_weights else None


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PyTorch's fused scaled_dot_product_attention. Cannot return probabilities: when they are
    asked for, the model runs ``eager_attention`` for that call instead."""
    if need_weights:
        return eager_attention(q, k, v, mask, dropout_p, need_weights)
    attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T) bool
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p), None


BACKENDS: dict[str, Kernel] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
}

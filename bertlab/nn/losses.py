"""The losses of the heads and of the training objectives, in one place.

``pretraining_loss`` is the one masked-LM + next-sentence loss: ``BertForPreTraining`` and
``BertForMaskedLM`` (the heads, whose loss matches transformers') and the pre-training objective
(``bertlab.tasks.pretraining``, whose loss is one process's share of a batch spread over many)
both call it, so the two cannot drift apart. Each part is a sum of cross-entropies divided by a
count: by default the count of this call's labelled positions (rows for NSP), which is the mean
transformers takes; with many processes the objective passes the count over all of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # a label that every loss skips (as torch's cross_entropy and transformers)


def pretraining_loss(
    mlm_logits: torch.Tensor,
    mlm_labels: torch.Tensor,
    nsp_logits: torch.Tensor | None = None,
    nsp_labels: torch.Tensor | None = None,
    mlm_count: torch.Tensor | float | None = None,
    nsp_count: torch.Tensor | float | None = None,
    accuracy: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """MLM (+ NSP) loss -> (loss, parts).

    mlm_logits (N, V) and mlm_labels (N,): any N positions, IGNORE_INDEX where not predicted
    (every token, or only the gathered masked ones). nsp_logits (B, 2) and nsp_labels (B,), or
    None for masked LM alone. ``mlm_count`` / ``nsp_count``: the divisors, by default the
    labelled positions / rows here (the mean); the global counts make the loss this process's
    share of the global mean. parts (detached): ``mlm_loss``, ``nsp_loss``, ``loss`` and, with
    ``accuracy``, ``mlm_acc`` / ``nsp_acc`` (correct predictions over the same counts). The
    logits are scored in float32 whatever their dtype.
    """
    logits = mlm_logits.float()
    labels = mlm_labels.reshape(-1)
    n_mlm = (labels != IGNORE_INDEX).sum() if mlm_count is None else mlm_count
    mlm = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum") / n_mlm
    parts = {"mlm_loss": mlm.detach()}
    if accuracy:  # a label of IGNORE_INDEX never equals an argmax
        parts["mlm_acc"] = (logits.detach().argmax(-1) == labels).sum() / n_mlm
    loss = mlm
    if nsp_logits is not None:
        if nsp_labels is None:
            raise ValueError("pretraining_loss: nsp_logits were given without nsp_labels")
        scores, target = nsp_logits.float(), nsp_labels.reshape(-1)
        n_nsp = (target != IGNORE_INDEX).sum() if nsp_count is None else nsp_count
        nsp = F.cross_entropy(scores, target, ignore_index=IGNORE_INDEX, reduction="sum") / n_nsp
        parts["nsp_loss"] = nsp.detach()
        if accuracy:
            parts["nsp_acc"] = (scores.detach().argmax(-1) == target).sum() / n_nsp
        loss = mlm + nsp
    parts["loss"] = loss.detach()
    return loss, parts

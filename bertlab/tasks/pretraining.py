"""Masked LM + next sentence prediction: the pre-training objective (reference 003, 004).

The objective is a module holding the model, not a function of it: with many processes,
DistributedDataParallel must wrap what runs the forward pass, loss included. Its loss is written
as this rank's share of the global mean (its sum over its rows divided by the count over all
ranks' rows, ``mlm_count`` and ``nsp_count`` in the batch), so that DDP's gradient average gives
the gradient of the whole batch whatever the number of processes. Only the masked positions go
through the vocabulary projection, as the original code gathers them: about 15% of the cost of
projecting every token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn.heads import BertForMaskedLM, BertForPreTraining
from bertlab.nn.losses import IGNORE_INDEX


class PretrainingObjective(nn.Module):
    """The model and its loss. forward(batch) -> (loss to back-propagate, metrics), where each
    metric is this rank's share of the global value (they add up over ranks)."""

    def __init__(self, model: BertForPreTraining | BertForMaskedLM, world_size: int = 1):
        super().__init__()
        self.model = model
        self.nsp = isinstance(model, BertForPreTraining)
        self.world_size = world_size

    def forward(
        self,
        input_ids,
        attention_mask,
        token_type_ids,
        labels,
        next_sentence_label,
        mlm_count,
        nsp_count,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        enc = self.model.bert.encode(input_ids, attention_mask, token_type_ids)
        flat = enc.per_token(labels).reshape(-1)
        keep = (flat != IGNORE_INDEX).nonzero().squeeze(1)
        hidden = enc.hidden.reshape(-1, enc.hidden.shape[-1]).index_select(0, keep)
        logits = self.model.cls.predictions(hidden).float()  # (masked tokens, V)
        target = flat.index_select(0, keep)
        n_mlm = mlm_count.squeeze()
        mlm = F.cross_entropy(logits, target, reduction="sum") / n_mlm
        metrics = {"mlm_loss": mlm.detach(), "mlm_acc": (logits.argmax(-1) == target).sum() / n_mlm}
        loss = mlm
        if self.nsp:
            nsp_logits = self.model.cls.seq_relationship(enc.pooled).float()  # (B, 2)
            nsp_label = next_sentence_label.reshape(-1)
            nsp = F.cross_entropy(nsp_logits, nsp_label, reduction="sum") / nsp_count.squeeze()
            metrics["nsp_loss"] = nsp.detach()
            metrics["nsp_acc"] = (nsp_logits.argmax(-1) == nsp_label).sum() / nsp_count.squeeze()
            loss = mlm + nsp
        metrics["loss"] = loss.detach()
        # DDP averages gradients over ranks; the shares must add up, so undo the average.
        return loss * self.world_size, metrics


def evaluate(
    objective: PretrainingObjective, batches: list[dict[str, torch.Tensor]], device: str = "cpu"
) -> dict[str, float]:
    """Held-out MLM loss and accuracy (over all masked tokens) and NSP loss and accuracy (over
    all rows); one process, no gradients."""
    sums: dict[str, float] = {}
    weights = {"mlm": 0.0, "nsp": 0.0}
    with torch.no_grad():
        for batch in batches:
            _, m = objective(**{k: v.to(device) for k, v in batch.items()})  # metrics: means
            for key, value in m.items():
                if key != "loss":
                    w = float(batch["mlm_count"] if key.startswith("mlm") else batch["nsp_count"])
                    sums[key] = sums.get(key, 0.0) + float(value) * w
            weights["mlm"] += float(batch["mlm_count"])
            weights["nsp"] += float(batch["nsp_count"])
    return {k: v / weights[k[:3]] for k, v in sums.items()}

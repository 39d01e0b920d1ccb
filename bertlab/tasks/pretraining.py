"""Masked LM + next sentence prediction: the pre-training objective (reference 003, 004).

A task of the shared protocol (``bertlab.tasks.Task``): ``objective(model, batch) -> (loss,
metrics)`` and ``objective.evaluate(model, batches) -> metrics``. The loss is
``bertlab.nn.losses.pretraining_loss``, the very function of ``BertForPreTraining``'s own loss,
written as this rank's share of the global mean: its sum over its rows divided by the count over
all ranks' rows (``mlm_count`` and ``nsp_count`` in the batch, from ``bertlab.data.stream``), so
that DDP's gradient average gives the gradient of the whole batch whatever the number of
processes. On one process that share is the model's own loss. Only the masked positions go
through the vocabulary projection, as the original code gathers them: about 15% of the cost of
projecting every token.

With many processes the training loop wraps the model in DistributedDataParallel and runs this
objective inside the wrapper's forward pass (``bertlab.train.loop``), so the objective may call
the model's parts (encoder, heads) directly.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from bertlab.nn.heads import BertForPreTraining
from bertlab.nn.losses import IGNORE_INDEX, pretraining_loss


class PretrainingObjective:
    """MLM (+ NSP for a ``BertForPreTraining``; MLM alone for a ``BertForMaskedLM``).

    ``objective(model, batch)`` -> (loss to back-propagate, metrics), where each metric is this
    rank's share of the global value (they add up over ranks). ``world_size``: the processes
    the batch is spread over; DDP averages gradients over them, and the loss undoes that.
    """

    def __init__(self, world_size: int = 1):
        self.world_size = world_size

    def __call__(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        enc = model.bert.encode(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
        )
        flat = enc.per_token(batch["labels"]).reshape(-1)
        keep = (flat != IGNORE_INDEX).nonzero().squeeze(1)
        hidden = enc.hidden.reshape(-1, enc.hidden.shape[-1]).index_select(0, keep)
        scores = model.cls.predictions(hidden)  # (masked tokens, V)
        nsp_logits = nsp_labels = None
        if isinstance(model, BertForPreTraining):
            nsp_logits = model.cls.seq_relationship(enc.pooled)  # (B, 2)
            nsp_labels = batch["next_sentence_label"]
        loss, metrics = pretraining_loss(
            scores,
            flat.index_select(0, keep),
            nsp_logits,
            nsp_labels,
            mlm_count=batch["mlm_count"].squeeze(),
            nsp_count=batch["nsp_count"].squeeze(),
        )
        # DDP averages gradients over ranks; the shares must add up, so undo the average.
        return loss * self.world_size, metrics

    def evaluate(
        self, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], device: str = "cpu"
    ) -> dict[str, float]:
        """Held-out MLM loss and accuracy (over all masked tokens) and NSP loss and accuracy
        (over all rows); one process, no gradients."""
        sums: dict[str, float] = {}
        weights = {"mlm": 0.0, "nsp": 0.0}
        with torch.no_grad():
            for batch in batches:
                _, m = PretrainingObjective()(model, {k: v.to(device) for k, v in batch.items()})
                for key, value in m.items():  # the metrics of one batch are its means
                    if key != "loss":
                        count = batch["mlm_count" if key.startswith("mlm") else "nsp_count"]
                        sums[key] = sums.get(key, 0.0) + float(value) * float(count)
                weights["mlm"] += float(batch["mlm_count"])
                weights["nsp"] += float(batch["nsp_count"])
        return {k: v / weights[k[:3]] for k, v in sums.items()}

"""One object per task (pre-training; classify, tag and answer for fine-tuning), each owning what
is particular to it, with one protocol for the training loop (``bertlab.train.loop``):

    task(model, batch) -> (loss, metrics)        one step's loss to back-propagate and its metrics
    task.evaluate(model, data) -> dict[str, float]   held-out metrics, no gradients

Imports the network, the data and the leaves; never the training loop."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn


class Task(Protocol):
    def __call__(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """A batch -> (the loss to back-propagate, metrics)."""

    def evaluate(self, model: nn.Module, data: Any) -> dict[str, float]:
        """Held-out data -> metrics (no gradients)."""

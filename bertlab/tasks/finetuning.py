"""What every fine-tuning task shares: the base of ``classify.py``, ``tag.py`` and ``qa.py``.

A task object owns everything particular to its task, so that ``bertlab.train.finetune`` and
``bertlab.bench.finetune`` never ask which task they run:

    Task.read(config, tokenizer) -> (task, train Split, dev Split or None, report)
        read, check and encode its files (``bertlab.data.classification`` / ``.tagging`` /
        ``.squad``); the task object is built from what the training file holds (its labels)
    Task.check(config)                          refuse settings the task cannot use
    task.build_model(directory, **overrides)    its model class with a fresh head
    task.collate(features) -> batch             padded tensors with the task's targets
    task(model, batch) -> (loss, metrics)       the model's own loss (transformers' too)
    task.evaluate(model, dev) -> metrics        the figures the field reports (bertlab.metrics)
    task.main_metric                            the figure that picks the best model
    task.evaluate_with_details(model, dev)      the figures and a fuller report, if any
    task.hf_class                               transformers' class, for the side-by-side bench

``evaluate`` runs on the model's own device, ``eval_batch_size`` features at a time. With
several processes every rank's batch has the same size, so a rank's loss is its share of the
mean divided by the world size. The run's settings come as a ``FinetuneConfig``
(``bertlab.train.finetune``), read by attribute; this package never imports the training side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from bertlab.data.batch import pad
from bertlab.distributed import world
from bertlab.tokenizer import BertTokenizer


@dataclass(frozen=True)
class Split:
    """One file's examples as read (``source``: the task's data object) and as encoded
    (``features``: one unpadded dict of lists per model input)."""

    source: Any
    features: list[dict[str, Any]]


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` lives (the CPU for a model without parameters)."""
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def run_model(
    model: nn.Module, features: list[dict], batch_size: int, read: Callable[[Any, dict], list]
) -> list:
    """Run ``model`` over ``features`` in batches, in eval mode and without gradients, on the
    model's device; ``read(output, batch)`` -> a list of per-feature results."""
    results: list = []
    was = model.training
    device = model_device(model)
    model.eval()
    with torch.no_grad():
        for i in range(0, len(features), batch_size):
            batch = {k: v.to(device) for k, v in _inputs(pad(features[i : i + batch_size])).items()}
            results += read(model(**batch), batch)
    model.train(was)
    return results


class FinetuneTask:
    """The base: the loss step of the protocol, and what a task declares about itself."""

    name: ClassVar[str]  # the command-line name: bertlab finetune NAME
    hf_class: ClassVar[str]  # transformers' model class of the task
    model_class: ClassVar[type[nn.Module]]
    default_length: ClassVar[int] = 128  # tokens per sequence unless --max-length says
    main_metric: str = "accuracy"
    eval_batch_size: int = 64

    @classmethod
    def check(cls, config: Any) -> None:
        """Refuse settings this task cannot use, before any data is read."""
        if config.dev_articles:
            raise ValueError("dev_articles holds out SQuAD articles: it is for the qa task")

    @classmethod
    def read(
        cls, config: Any, tokenizer: BertTokenizer
    ) -> tuple[FinetuneTask, Split, Split | None, dict[str, Any]]:
        """Read, check and encode the config's files: (the task, the training split, the dev
        split or None, a report of what was found)."""
        raise NotImplementedError

    def __call__(
        self, model: nn.Module, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        out = model(**batch)
        return out.loss, {"loss": out.loss.detach() / world()[1]}

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def build_model(self, directory: Any, **overrides: Any) -> nn.Module:
        """The starting model: the encoder of ``directory`` and a fresh head for this task."""
        return self.model_class.from_pretrained(directory, **overrides)

    def evaluate(self, model: nn.Module, data: Split) -> dict[str, float]:
        raise NotImplementedError

    def evaluate_with_details(
        self, model: nn.Module, data: Split
    ) -> tuple[dict[str, float], dict[str, Any] | None]:
        """``evaluate``'s figures and, from the same predictions, a fuller report where the task
        has one (entities: the per-type table), else None."""
        return self.evaluate(model, data), None

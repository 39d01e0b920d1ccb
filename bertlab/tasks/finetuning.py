"""Fine-tuning objectives: classify, tag, answer. One object per task, for bertlab.train.loop.

Each task object turns features (``bertlab.data.classification`` / ``.tagging`` / ``.squad``)
into padded batches (``collate``), a batch into a loss and metrics (``__call__``: the model's own
loss, the one transformers computes too), and a model into its dev-set figures (``evaluate``:
the metric the field reports, from ``bertlab.metrics``). With several processes every rank's
batch has the same size, so a rank's loss is its share of the mean divided by the world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bertlab import metrics as M
from bertlab.data.batch import pad
from bertlab.data.squad import SquadData, best_answers
from bertlab.data.tagging import TaggingData, word_predictions
from bertlab.distributed import world
from bertlab.nn.losses import IGNORE_INDEX


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def _predict(
    model: nn.Module, features: list[dict], batch_size: int, device: str, read: Any
) -> list:
    """Run ``model`` over ``features`` in batches (no gradients); ``read(output, batch)`` ->
    a list of per-feature results."""
    results: list = []
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(features), batch_size):
            batch = {k: v.to(device) for k, v in _inputs(pad(features[i : i + batch_size])).items()}
            results += read(model(**batch), batch)
    model.train(was)
    return results


class _Task:
    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple:
        out = model(**batch)
        return out.loss, {"loss": out.loss.detach() / world()[1]}


class ClassificationTask(_Task):
    """Single-label classification (cross-entropy) or regression (mean squared error)."""

    def __init__(self, label_names: list[str] | None):
        self.label_names = label_names

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        dtype = torch.float if self.label_names is None else torch.long
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=dtype)
        return batch

    def predict(
        self, model: nn.Module, features: list[dict], batch_size: int = 64, device: str = "cpu"
    ) -> torch.Tensor:
        """(N, num_labels) logits, or (N,) values for regression."""
        rows = _predict(
            model, features, batch_size, device, lambda out, _: list(out.logits.float().cpu())
        )
        logits = torch.stack(rows)
        return logits.squeeze(-1) if self.label_names is None else logits

    def evaluate(
        self, model: nn.Module, features: list[dict], batch_size: int = 64, device: str = "cpu"
    ) -> dict[str, float]:
        gold = [f["labels"] for f in features]
        out = self.predict(model, features, batch_size, device)
        if self.label_names is None:
            values = out.tolist()
            mse = sum((p - g) ** 2 for p, g in zip(values, gold, strict=True)) / len(gold)
            return {
                "pearson": M.pearson(values, gold),
                "spearman": M.spearman(values, gold),
                "mse": mse,
            }
        preds = out.argmax(-1).tolist()
        result = {"accuracy": M.accuracy(preds, gold), "mcc": M.matthews_corrcoef(preds, gold)}
        if len(self.label_names) == 2:
            result["f1"] = M.f1(preds, gold)
        else:
            result["macro_f1"] = M.f1(preds, gold, average="macro")
        return result


class TaggingTask(_Task):
    """One label per word piece (-100 on all but each word's first piece); evaluated on whole
    entities by the conlleval rules."""

    def __init__(self, label_names: list[str]):
        self.label_names = label_names

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        labels = torch.full(batch["input_ids"].shape, IGNORE_INDEX, dtype=torch.long)
        for r, f in enumerate(features):
            labels[r, : len(f["labels"])] = torch.tensor(f["labels"])
        batch["labels"] = labels
        return batch

    def predict_tags(
        self,
        model: nn.Module,
        data: TaggingData,
        features: list[dict],
        batch_size: int = 64,
        device: str = "cpu",
    ) -> list[list[str]]:
        """One predicted tag per word of every sentence."""

        def read(out, batch) -> list:
            ids = out.logits.argmax(-1).cpu()
            lengths = batch["attention_mask"].sum(1).tolist()
            return [ids[r, :n].tolist() for r, n in enumerate(lengths)]

        pieces = _predict(model, features, batch_size, device, read)
        names = self.label_names
        return [
            word_predictions(f["word_ids"], [names[i] for i in p], len(words))
            for f, p, words in zip(features, pieces, data.words, strict=True)
        ]

    def evaluate_full(
        self,
        model: nn.Module,
        data: TaggingData,
        features: list[dict],
        batch_size: int = 64,
        device: str = "cpu",
    ) -> dict[str, Any]:
        return M.conlleval(data.tags, self.predict_tags(model, data, features, batch_size, device))

    def evaluate(
        self,
        model: nn.Module,
        data: TaggingData,
        features: list[dict],
        batch_size: int = 64,
        device: str = "cpu",
    ) -> dict[str, float]:
        r = self.evaluate_full(model, data, features, batch_size, device)
        return {k: r[k] for k in ("f1", "precision", "recall", "accuracy")}


class QuestionAnsweringTask(_Task):
    """Start and end of the answer span (cross-entropy on each, averaged); evaluated by SQuAD
    exact match and F1 over the best span of all an example's windows."""

    def __init__(
        self, n_best: int = 20, max_answer_length: int = 30, null_threshold: float | None = None
    ):
        self.n_best, self.max_answer_length = n_best, max_answer_length
        self.null_threshold = null_threshold

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        for key in ("start_positions", "end_positions"):
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
        return batch

    def answers(
        self,
        model: nn.Module,
        data: SquadData,
        features: list[dict],
        batch_size: int = 64,
        device: str = "cpu",
        null_threshold: float | None = None,
    ) -> dict[str, dict]:
        """The best answer of every question (``best_answers``); ``null_threshold``: the
        task's own unless given."""

        def read(out, _batch) -> list:
            s, e = out.start_logits.float().cpu(), out.end_logits.float().cpu()
            return list(zip(s, e, strict=True))

        rows = _predict(model, features, batch_size, device, read)
        T = max(len(f["input_ids"]) for f in features)
        start = torch.full((len(rows), T), float("-inf"))
        end = torch.full((len(rows), T), float("-inf"))
        for w, (s, e) in enumerate(rows):
            start[w, : len(s)], end[w, : len(e)] = s, e
        return best_answers(
            data,
            features,
            start,
            end,
            n_best=self.n_best,
            max_answer_length=self.max_answer_length,
            null_threshold=null_threshold if null_threshold is not None else self.null_threshold,
        )

    def evaluate(
        self,
        model: nn.Module,
        data: SquadData,
        features: list[dict],
        batch_size: int = 64,
        device: str = "cpu",
    ) -> dict[str, float]:
        """SQuAD EM and F1. With unanswerable questions (SQuAD 2.0) the model abstains where
        the [CLS] score beats the best span's by more than ``null_threshold`` (0 unless given,
        as the original recipe), the scores are also given per kind, and ``best_f1`` /
        ``best_exact_match`` are those at the best threshold, as the official script reports."""
        gold = {e.id: e.answers for e in data.examples}
        v2 = any(not a for a in gold.values())
        threshold = self.null_threshold
        if v2 and threshold is None:
            threshold = 0.0
        answers = self.answers(model, data, features, batch_size, device, threshold)
        r = M.squad({q: a["text"] for q, a in answers.items()}, gold)
        result = {k: float(v) for k, v in r.items() if not k.endswith("total")}
        if v2:
            spans = {q: a["n_best"][0]["text"] if a["n_best"] else "" for q, a in answers.items()}
            margin = {
                q: a["null_score"] - (a["n_best"][0]["score"] if a["n_best"] else float("-inf"))
                for q, a in answers.items()
            }
            for metric in ("exact_match", "f1"):
                threshold, score = M.best_no_answer_threshold(spans, gold, margin, metric)
                result[f"best_{metric}"] = score
                result[f"best_{metric}_threshold"] = threshold
        return result

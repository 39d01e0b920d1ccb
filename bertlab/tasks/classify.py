"""``bertlab finetune classify``: one label per text or text pair (cross-entropy), or one value
(regression, mean squared error); GLUE-style TSV, CSV or JSON lines
(``bertlab.data.classification``). Evaluated by accuracy, F1 (macro F1 past two labels) and
MCC, or Pearson and Spearman for regression."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bertlab import metrics as M
from bertlab.data.batch import pad
from bertlab.data.classification import encode_classification, read_classification
from bertlab.nn.heads import BertForSequenceClassification
from bertlab.tasks.finetuning import FinetuneTask, Split, run_model
from bertlab.tokenizer import BertTokenizer


class ClassificationTask(FinetuneTask):
    """Single-label classification (cross-entropy) or regression (``label_names`` None)."""

    name = "classify"
    hf_class = "BertForSequenceClassification"
    model_class = BertForSequenceClassification

    def __init__(self, label_names: list[str] | None, eval_batch_size: int = 64):
        self.label_names = label_names
        self.eval_batch_size = eval_batch_size
        self.main_metric = "pearson" if label_names is None else "accuracy"

    @classmethod
    def read(
        cls, config: Any, tokenizer: BertTokenizer
    ) -> tuple[ClassificationTask, Split, Split | None, dict[str, Any]]:
        """The columns and labels are detected (or named by the config) in the training file;
        the dev file must have the same columns and no label the training file lacks."""
        length = config.length
        train = read_classification(
            config.train,
            text_column=config.text_column,
            pair_column=config.pair_column,
            label_column=config.label_column,
        )
        dev = read_classification(config.dev, like=train) if config.dev else None
        train_f, cut = encode_classification(tokenizer, train, length)
        report: dict[str, Any] = {"train_truncated": cut}
        dev_split = Split(dev, encode_classification(tokenizer, dev, length)[0]) if dev else None
        return (
            cls(train.label_names, config.eval_batch_size),
            Split(train, train_f),
            dev_split,
            report,
        )

    def build_model(self, directory: Any, **overrides: Any) -> nn.Module:
        if self.label_names is None:
            return self.model_class.from_pretrained(
                directory, num_labels=1, problem_type="regression", **overrides
            )
        return self.model_class.from_pretrained(
            directory,
            id2label=dict(enumerate(self.label_names)),
            problem_type="single_label_classification",
            **overrides,
        )

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        dtype = torch.float if self.label_names is None else torch.long
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=dtype)
        return batch

    def predict(self, model: nn.Module, features: list[dict]) -> torch.Tensor:
        """(N, num_labels) logits, or (N,) values for regression."""
        rows = run_model(
            model, features, self.eval_batch_size, lambda out, _: list(out.logits.float().cpu())
        )
        logits = torch.stack(rows)
        return logits.squeeze(-1) if self.label_names is None else logits

    def evaluate(self, model: nn.Module, data: Split) -> dict[str, float]:
        gold = [f["labels"] for f in data.features]
        out = self.predict(model, data.features)
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

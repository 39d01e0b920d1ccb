"""``bertlab finetune tag``: entity tagging on CoNLL files (IOB1 or IOB2,
``bertlab.data.tagging``). One label per word piece, -100 on all but each word's first piece;
evaluated on whole entities by the conlleval rules, with the per-type table for the best
model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bertlab import metrics as M
from bertlab.data.batch import pad
from bertlab.data.tagging import encode_tagging, read_conll, word_predictions
from bertlab.nn.heads import BertForTokenClassification
from bertlab.nn.losses import IGNORE_INDEX
from bertlab.tasks.finetuning import FinetuneTask, Split, run_model
from bertlab.tokenizer import BertTokenizer


class TaggingTask(FinetuneTask):
    """One label per word (on its first piece); scored by entity precision, recall and F1."""

    name = "tag"
    hf_class = "BertForTokenClassification"
    model_class = BertForTokenClassification
    main_metric = "f1"

    def __init__(self, label_names: list[str], eval_batch_size: int = 64):
        self.label_names = label_names
        self.eval_batch_size = eval_batch_size

    @classmethod
    def read(
        cls, config: Any, tokenizer: BertTokenizer
    ) -> tuple[TaggingTask, Split, Split | None, dict[str, Any]]:
        length = config.length
        train = read_conll(config.train)
        dev = read_conll(config.dev, like=train) if config.dev else None
        train_f, cut = encode_tagging(tokenizer, train, length)
        report: dict[str, Any] = {"train_words_cut": cut}
        dev_split = None
        if dev:
            dev_f, cut = encode_tagging(tokenizer, dev, length)
            report["dev_words_cut"] = cut  # predicted "O": the metric still counts them
            dev_split = Split(dev, dev_f)
        return (
            cls(train.label_names, config.eval_batch_size),
            Split(train, train_f),
            dev_split,
            report,
        )

    def build_model(self, directory: Any, **overrides: Any) -> nn.Module:
        return self.model_class.from_pretrained(
            directory, id2label=dict(enumerate(self.label_names)), **overrides
        )

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        labels = torch.full(batch["input_ids"].shape, IGNORE_INDEX, dtype=torch.long)
        for r, f in enumerate(features):
            labels[r, : len(f["labels"])] = torch.tensor(f["labels"])
        batch["labels"] = labels
        return batch

    def predict_tags(self, model: nn.Module, data: Split) -> list[list[str]]:
        """One predicted tag per word of every sentence."""

        def read(out, batch) -> list:
            ids = out.logits.argmax(-1).cpu()
            lengths = batch["attention_mask"].sum(1).tolist()
            return [ids[r, :n].tolist() for r, n in enumerate(lengths)]

        pieces = run_model(model, data.features, self.eval_batch_size, read)
        names = self.label_names
        return [
            word_predictions(f["word_ids"], [names[i] for i in p], len(words))
            for f, p, words in zip(data.features, pieces, data.source.words, strict=True)
        ]

    def evaluate_with_details(
        self, model: nn.Module, data: Split
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The overall figures, and the whole conlleval report with the per-type table."""
        r = M.conlleval(data.source.tags, self.predict_tags(model, data))
        return {k: r[k] for k in ("f1", "precision", "recall", "accuracy")}, r

    def evaluate(self, model: nn.Module, data: Split) -> dict[str, float]:
        return self.evaluate_with_details(model, data)[0]

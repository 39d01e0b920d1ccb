"""``bertlab finetune qa``: extractive question answering on SQuAD 1.1 / 2.0 JSON
(``bertlab.data.squad``: windows over long contexts). The loss is cross-entropy on the answer's
start and on its end, averaged; evaluation is SQuAD exact match and F1 over the best span of all
an example's windows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from bertlab import metrics as M
from bertlab.data.batch import pad
from bertlab.data.squad import best_answers, encode_squad, read_squad
from bertlab.nn.heads import BertForQuestionAnswering
from bertlab.tasks.finetuning import FinetuneTask, Split, run_model
from bertlab.tokenizer import BertTokenizer


class QuestionAnsweringTask(FinetuneTask):
    """Start and end of the answer span; ``null_threshold``: SQuAD 2.0's abstention margin."""

    name = "qa"
    hf_class = "BertForQuestionAnswering"
    model_class = BertForQuestionAnswering
    default_length = 384
    main_metric = "f1"

    def __init__(
        self,
        n_best: int = 20,
        max_answer_length: int = 30,
        null_threshold: float | None = None,
        eval_batch_size: int = 64,
    ):
        self.n_best, self.max_answer_length = n_best, max_answer_length
        self.null_threshold = null_threshold
        self.eval_batch_size = eval_batch_size

    @classmethod
    def check(cls, config: Any) -> None:
        if config.dev_articles < 0:
            raise ValueError(f"dev_articles must be >= 0, got {config.dev_articles}")

    @classmethod
    def read(
        cls, config: Any, tokenizer: BertTokenizer
    ) -> tuple[QuestionAnsweringTask, Split, Split | None, dict[str, Any]]:
        """``config.dev_articles`` holds out the training file's last N articles as the dev
        set (when there is no dev file of the same distribution)."""
        train = read_squad(config.train)
        dev = read_squad(config.dev) if config.dev else None
        report: dict[str, Any] = {}
        if config.dev_articles:
            titles = list(dict.fromkeys(e.title for e in train.examples))
            if config.dev_articles >= len(titles):
                raise ValueError(
                    f"dev_articles {config.dev_articles} leaves no article to train "
                    f"on: {config.train} has {len(titles)}"
                )
            held = set(titles[-config.dev_articles :])
            dev = read_squad(config.train, titles=held)
            train = read_squad(config.train, titles=set(titles) - held)
            report["dev_articles"] = sorted(held)
        kw = dict(
            max_length=config.length,
            doc_stride=config.doc_stride,
            max_query_length=config.max_query_length,
        )
        train_f = encode_squad(tokenizer, train, **kw)
        dev_split = Split(dev, encode_squad(tokenizer, dev, training=False, **kw)) if dev else None
        report["train_mismatched_answers"] = len(train.mismatched)
        report["train_windows"] = len(train_f)
        task = cls(
            max_answer_length=config.max_answer_length, eval_batch_size=config.eval_batch_size
        )
        return task, Split(train, train_f), dev_split, report

    def collate(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad(features)
        for key in ("start_positions", "end_positions"):
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)
        return batch

    def answers(
        self, model: nn.Module, data: Split, null_threshold: float | None = None
    ) -> dict[str, dict]:
        """The best answer of every question (``best_answers``); ``null_threshold``: the
        task's own unless given."""

        def read(out, _batch) -> list:
            s, e = out.start_logits.float().cpu(), out.end_logits.float().cpu()
            return list(zip(s, e, strict=True))

        features = data.features
        rows = run_model(model, features, self.eval_batch_size, read)
        T = max(len(f["input_ids"]) for f in features)
        start = torch.full((len(rows), T), float("-inf"))
        end = torch.full((len(rows), T), float("-inf"))
        for w, (s, e) in enumerate(rows):
            start[w, : len(s)], end[w, : len(e)] = s, e
        return best_answers(
            data.source,
            features,
            start,
            end,
            n_best=self.n_best,
            max_answer_length=self.max_answer_length,
            null_threshold=null_threshold if null_threshold is not None else self.null_threshold,
        )

    def evaluate(self, model: nn.Module, data: Split) -> dict[str, float]:
        """SQuAD EM and F1. With unanswerable questions (SQuAD 2.0) the model abstains where
        the [CLS] score beats the best span's by more than ``null_threshold`` (0 unless given,
        as the original recipe), the scores are also given per kind, and ``best_f1`` /
        ``best_exact_match`` are those at the best threshold, as the official script reports."""
        gold = {e.id: e.answers for e in data.source.examples}
        v2 = any(not a for a in gold.values())
        threshold = self.null_threshold
        if v2 and threshold is None:
            threshold = 0.0
        answers = self.answers(model, data, threshold)
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

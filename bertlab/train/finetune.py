"""``bertlab finetune {classify,tag,qa}``: a BERT fine-tuned on labelled data, on the shared loop.

    bertlab finetune classify --train sst2/train.tsv --dev sst2/dev.tsv -o runs/sst2
    bertlab finetune tag --train conll/train.txt --dev conll/dev.txt -o runs/ner
    bertlab finetune qa --train squad.json --dev-articles 2 -o runs/squad

The starting point is any bertlab or Hugging Face BERT folder (the bundled checkpoint by
default); its encoder is kept and a fresh head is added (``bertlab.nn.heads``). The data is read and
checked first (``bertlab.data.classification``, ``.tagging``, ``.squad``: columns and labels
detected and reported, bad rows named), then the loop of ``bertlab.train.loop`` runs with the task's
objective (``bertlab.tasks.finetuning``), evaluating on the dev set after every epoch (and when
a ``max_seconds`` budget runs out) and keeping the best model. The run folder gets
``metrics.jsonl``, ``curves.png``, ``results.json`` (the dev figures of the best evaluation, with
the per-type table for entities) and ``model/``: the best model in the Hugging Face layout with
its label names in ``config.json``, and the tokenizer.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bertlab.files import resolve_model_dir
from bertlab.nn.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.tokenizer import BertTokenizer
from bertlab.train.loop import CHECKPOINT, TrainConfig, train

logger = logging.getLogger("bertlab")
TASKS = ("classify", "tag", "qa")
MAIN_METRIC = {"classify": "accuracy", "tag": "f1", "qa": "f1"}


@dataclass(frozen=True)
class FinetuneConfig:
    task: str  # classify | tag | qa
    train: str  # the training file
    dev: str | None = None  # the evaluation file (qa: or --dev-articles)
    model: str = "default"
    epochs: float = 3.0
    batch_size: int = 32
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_length: int | None = None  # default: 128 (classify, tag), 384 (qa)
    max_train_examples: int | None = None  # a random subset of the training data
    max_seconds: float | None = None  # a training-time budget
    seed: int = 0
    dropout: float | None = None  # hidden and attention dropout (default: the model's own)
    precision: str = "float32"
    device: str = "cpu"
    eval_batch_size: int = 64
    # classify
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    # qa
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    dev_articles: int = 0  # hold out the last N articles of the training file

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if not self.epochs > 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_train_examples is not None and self.max_train_examples < 1:
            raise ValueError(f"max_train_examples must be >= 1, got {self.max_train_examples}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.dev_articles and self.task != "qa":
            raise ValueError("dev_articles holds out SQuAD articles: it is for the qa task")

    @property
    def length(self) -> int:
        return self.max_length or (384 if self.task == "qa" else 128)


def _data(config: FinetuneConfig, tokenizer: BertTokenizer) -> tuple[Any, Any, list, list, dict]:
    """(train data, dev data or None, train features, dev features, report)."""
    report: dict[str, Any] = {}
    L = config.length
    if config.task == "classify":
        from bertlab.data.classification import encode_classification, read_classification

        train_data = read_classification(
            config.train,
            text_column=config.text_column,
            pair_column=config.pair_column,
            label_column=config.label_column,
        )
        dev = read_classification(config.dev, like=train_data) if config.dev else None
        train_f, cut = encode_classification(tokenizer, train_data, L)
        report["train_truncated"] = cut
        dev_f = encode_classification(tokenizer, dev, L)[0] if dev else []
    elif config.task == "tag":
        from bertlab.data.tagging import encode_tagging, read_conll

        train_data = read_conll(config.train)
        dev = read_conll(config.dev, like=train_data) if config.dev else None
        train_f, cut = encode_tagging(tokenizer, train_data, L)
        report["train_words_cut"] = cut
        dev_f = []
        if dev:
            dev_f, cut = encode_tagging(tokenizer, dev, L)
            report["dev_words_cut"] = cut  # predicted "O": the metric still counts them
    else:
        from bertlab.data.squad import encode_squad, read_squad

        train_data = read_squad(config.train)
        dev = read_squad(config.dev) if config.dev else None
        if config.dev_articles:
            titles = list(dict.fromkeys(e.title for e in train_data.examples))
            if config.dev_articles >= len(titles):
                raise ValueError(
                    f"dev_articles {config.dev_articles} leaves no article to train "
                    f"on: {config.train} has {len(titles)}"
                )
            held = set(titles[-config.dev_articles :])
            dev = read_squad(config.train, titles=held)
            train_data = read_squad(config.train, titles=set(titles) - held)
            report["dev_articles"] = sorted(held)
        kw = dict(
            max_length=L, doc_stride=config.doc_stride, max_query_length=config.max_query_length
        )
        train_f = encode_squad(tokenizer, train_data, **kw)
        dev_f = encode_squad(tokenizer, dev, training=False, **kw) if dev else []
        report["train_mismatched_answers"] = len(train_data.mismatched)
        report["train_windows"] = len(train_f)
    if not train_f:
        raise ValueError(f"{config.train}: no training examples left after reading")
    report["train"] = train_data.describe()
    if dev is not None:
        report["dev"] = dev.describe()
    return train_data, dev, train_f, dev_f, report


def _model(config: FinetuneConfig, train_data: Any):
    directory = resolve_model_dir(config.model)
    kw: dict[str, Any] = {}
    if config.dropout is not None:
        kw = dict(hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout)
    if config.task == "classify":
        if train_data.regression:
            return BertForSequenceClassification.from_pretrained(
                directory, num_labels=1, problem_type="regression", **kw
            )
        labels = dict(enumerate(train_data.label_names))
        kw["problem_type"] = "single_label_classification"
        return BertForSequenceClassification.from_pretrained(directory, id2label=labels, **kw)
    if config.task == "tag":
        return BertForTokenClassification.from_pretrained(
            directory, id2label=dict(enumerate(train_data.label_names)), **kw
        )
    return BertForQuestionAnswering.from_pretrained(directory, **kw)


def _task(config: FinetuneConfig, train_data: Any):
    from bertlab.tasks.finetuning import ClassificationTask, QuestionAnsweringTask, TaggingTask

    if config.task == "classify":
        return ClassificationTask(train_data.label_names)
    if config.task == "tag":
        return TaggingTask(train_data.label_names)
    return QuestionAnsweringTask(max_answer_length=config.max_answer_length)


def evaluate_dev(task: Any, model, dev: Any, dev_f: list, config: FinetuneConfig) -> dict:
    """The task's dev figures for ``model`` (any model whose outputs carry the logits)."""
    args = (model, dev_f) if config.task == "classify" else (model, dev, dev_f)
    return task.evaluate(*args, batch_size=config.eval_batch_size, device=config.device)


@dataclass
class Prepared:
    """Everything a fine-tuning run needs before its first step, built from a config alone."""

    tokenizer: BertTokenizer
    train_data: Any
    dev: Any
    train_f: list
    dev_f: list
    report: dict
    model: torch.nn.Module  # the starting weights, with the fresh head drawn from the seed
    task: Any
    per_epoch: int  # steps in one pass over train_f
    steps: int  # steps planned for config.epochs

    def batches(self, batch_size: int, seed: int):
        """``data(step, micro)`` -> the padded batch of ``step``: a fresh order every epoch,
        drawn from the seed alone, so any loop given it sees the same batches."""
        orders: dict[int, list[int]] = {}
        n = len(self.train_f)

        def data(step: int, micro: int = 0) -> dict[str, torch.Tensor]:
            epoch, k = divmod(step, self.per_epoch)
            if epoch not in orders:
                orders.clear()
                orders[epoch] = random.Random(seed * 1000 + epoch).sample(range(n), n)
            rows = orders[epoch][k * batch_size : (k + 1) * batch_size]
            return self.task.collate([self.train_f[i] for i in rows])

        return data


def prepare(config: FinetuneConfig, progress: bool = False) -> Prepared:
    """Read and check the data, encode it, and build the starting model and the task."""
    directory = resolve_model_dir(config.model)
    tokenizer = BertTokenizer.from_pretrained(directory)
    train_data, dev, train_f, dev_f, report = _data(config, tokenizer)
    for line in (report["train"], report.get("dev")):
        if line and progress:
            print(line)
    rng = random.Random(config.seed)
    if config.max_train_examples and config.max_train_examples < len(train_f):
        train_f = rng.sample(train_f, config.max_train_examples)
    torch.manual_seed(config.seed)
    model = _model(config, train_data)
    per_epoch = math.ceil(len(train_f) / config.batch_size)
    steps = max(1, math.ceil(config.epochs * per_epoch))
    return Prepared(
        tokenizer,
        train_data,
        dev,
        train_f,
        dev_f,
        report,
        model,
        _task(config, train_data),
        per_epoch,
        steps,
    )


def main_metric(config: FinetuneConfig, train_data: Any) -> str:
    """The dev figure that picks the best model."""
    if config.task == "classify" and train_data.regression:
        return "pearson"
    return MAIN_METRIC[config.task]


def finetune(
    config: FinetuneConfig,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
    prepared: Prepared | None = None,
) -> dict[str, Any]:
    """Fine-tune; returns the results (also written to ``out_dir/results.json``).
    ``prepared``: the run's pieces from ``prepare(config)``, when the caller already has them
    (its model is the one trained)."""
    out = Path(out_dir)
    held = [p.name for p in (out / "metrics.jsonl", out / "model", out / CHECKPOINT) if p.exists()]
    if held and not overwrite:
        raise FileExistsError(
            f"{out} already holds a run ({', '.join(held)}): pass --overwrite to replace it"
        )
    run = prepared or prepare(config, progress)
    tokenizer, train_data, dev, dev_f = run.tokenizer, run.train_data, run.dev, run.dev_f
    model, task, per_epoch, steps = run.model, run.task, run.per_epoch, run.steps
    tc = TrainConfig(
        out_dir=str(out),
        steps=steps,
        lr=config.lr,
        warmup_steps=int(config.warmup_ratio * steps),
        weight_decay=config.weight_decay,
        precision=config.precision,
        seed=config.seed,
        log_every=max(1, min(20, per_epoch // 5)),
        device=config.device,
        max_seconds=config.max_seconds,
        checkpoints=False,
    )
    data = run.batches(config.batch_size, config.seed)
    if overwrite:
        for name in ("metrics.jsonl", CHECKPOINT, CHECKPOINT + ".prev", "results.json"):
            (out / name).unlink(missing_ok=True)
        for name in ("model", "best"):
            shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    best: dict[str, Any] = {}
    key = main_metric(config, train_data)

    def evaluate(m, step: int) -> dict[str, float]:
        result = evaluate_dev(task, m, dev, dev_f, config)
        if not best or result[key] > best["metrics"][key]:
            best.update(step=step, metrics=result)
            m.save_pretrained(out / "best")  # the best model so far, kept
            tokenizer.save_pretrained(out / "best")
        if progress:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items())
            print(f"\nepoch {step / per_epoch:.2f} (step {step}): dev {shown}")
        return result

    started = time.perf_counter()
    last = train(
        model, task, data, tc, evaluate=evaluate if dev is not None else None, eval_every=per_epoch
    )
    seconds = time.perf_counter() - started
    final = out / "model"
    shutil.rmtree(final, ignore_errors=True)
    if best:
        (out / "best").rename(final)
    else:
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
    results: dict[str, Any] = {
        "task": config.task,
        "config": asdict(config),
        "report": run.report,
        "steps": int(last.get("step", 0)),
        "planned_steps": steps,
        "seconds": seconds,
        "train_examples": len(run.train_f),
        "best_step": best.get("step"),
        "dev": best.get("metrics"),
    }
    if config.task == "tag" and dev is not None:  # the per-type table, from the best model
        best_model = BertForTokenClassification.from_pretrained(final)
        results["dev_full"] = task.evaluate_full(
            best_model, dev, dev_f, config.eval_batch_size, config.device
        )
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", "utf-8")
    try:
        from bertlab.train.curves import plot_run

        plot_run(out)
    except ValueError as e:  # matplotlib missing: the run stands without its picture
        logger.warning("no curves.png: %s", e)
    return results

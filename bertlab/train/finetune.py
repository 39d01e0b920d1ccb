"""``bertlab finetune {classify,tag,qa}``: a BERT fine-tuned on labelled data, on the shared loop.

    bertlab finetune classify --train sst2/train.tsv --dev sst2/dev.tsv -o runs/sst2
    bertlab finetune tag --train conll/train.txt --dev conll/dev.txt -o runs/ner
    bertlab finetune qa --train squad.json --dev-articles 2 -o runs/squad

The starting point is any bertlab or Hugging Face BERT folder (the bundled checkpoint by
default); its encoder is kept and a fresh head is added. Everything particular to a task (its
files, its model class, its metric) is its task object's (``bertlab.tasks``: ``TASKS`` below);
this module only runs them: the data is read and checked first (columns and labels detected and
reported, bad rows named), then the loop of ``bertlab.train.loop`` runs, evaluating on the dev
set after every epoch (and when a ``max_seconds`` budget runs out) and keeping the best model.

``max_seconds`` bounds the wait for the whole run: reading and encoding the data, training, the
dev evaluations and the checkpoint all count. Before the first step a batch of dev features is
timed through the model and scaled to the whole set (``evaluation_seconds``), so that the budget
keeps room for the final evaluation from the start; the loop plans the steps that fit, with
the learning-rate schedule (warm-up, then decay to zero) laid over them, and starts no step
that would leave no room for itself and the final evaluation. What is left after the loop
(moving the best model into place, ``curves.png``) takes about a second.

A run stopped by Ctrl-C or SIGTERM leaves a checkpoint; ``resume=True`` (``--resume``) continues
it exactly: same batches in the same order, same random states, same final weights as a run
never stopped. The run folder gets ``run.json`` (the settings, which a resume must repeat),
``metrics.jsonl``, ``curves.png``, ``results.json`` (the dev figures of the best evaluation,
with the per-type table for entities) and ``model/``: the best model in the Hugging Face layout
with its label names in ``config.json``, and the tokenizer.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from bertlab.nn.config import resolve_source
from bertlab.tasks.classify import ClassificationTask
from bertlab.tasks.finetuning import FinetuneTask, Split, run_model
from bertlab.tasks.qa import QuestionAnsweringTask
from bertlab.tasks.tag import TaggingTask
from bertlab.tokenizer import BertTokenizer
from bertlab.train import loop
from bertlab.train.loop import TrainConfig, train
from bertlab.train.memory import check_fits, step_memory
from bertlab.train.runs import CHECKPOINT, RUN_FILE, check_run_folder

logger = logging.getLogger("bertlab")
TASKS: dict[str, type[FinetuneTask]] = {
    "classify": ClassificationTask,
    "tag": TaggingTask,
    "qa": QuestionAnsweringTask,
}
BEST_FILE = "best.json"  # the best evaluation so far, while a run is under way


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
    max_length: int | None = None  # default: the task's (128; qa 384)
    max_train_examples: int | None = None  # a random subset of the training data
    max_seconds: float | None = None  # a budget of the whole run's seconds (see the docstring)
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
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        TASKS[self.task].check(self)

    @property
    def length(self) -> int:
        """Tokens per sequence: --max-length, else the task's default."""
        return self.max_length or TASKS[self.task].default_length


@dataclass
class Prepared:
    """Everything a fine-tuning run needs before its first step, built from a config alone."""

    tokenizer: BertTokenizer
    task: FinetuneTask
    train: Split
    dev: Split | None
    report: dict
    model: torch.nn.Module  # the starting weights, with the fresh head drawn from the seed
    per_epoch: int  # steps in one pass over the training features
    steps: int  # steps planned for config.epochs

    def batches(self, batch_size: int, seed: int):
        """``data(step, micro)`` -> the padded batch of ``step``: a fresh order every epoch,
        drawn from the seed alone, so any loop given it (a resumed one too) sees the same
        batches."""
        orders: dict[int, list[int]] = {}
        features = self.train.features
        n = len(features)

        def data(step: int, micro: int = 0) -> dict[str, torch.Tensor]:
            epoch, k = divmod(step, self.per_epoch)
            if epoch not in orders:
                orders.clear()
                orders[epoch] = random.Random(seed * 1000 + epoch).sample(range(n), n)
            rows = orders[epoch][k * batch_size : (k + 1) * batch_size]
            return self.task.collate([features[i] for i in rows])

        return data


def check_memory(model: torch.nn.Module, features: list[dict], config: FinetuneConfig) -> None:
    """Refuse, before the first step, a batch that cannot fit in the memory of the device
    (``bertlab.train.memory``): the largest batch the run can draw, ``batch_size`` of its
    longest training sequences (a batch is padded to its longest one)."""
    parameters = sum(p.numel() for p in model.parameters())
    rows = min(config.batch_size, len(features))
    longest = max(len(f["input_ids"]) for f in features)
    estimate = step_memory(model.config, parameters, rows, longest, precision=config.precision)
    resident = 4 * parameters if torch.device(config.device).type == "cpu" else 0  # built there
    check_fits(estimate, f"--batch-size {config.batch_size}", config.device, resident)


EVAL_MARGIN = 1.2  # room on the estimate of an evaluation: the best model's saving, noise


def evaluation_seconds(task: FinetuneTask, model: torch.nn.Module, dev: Split) -> float:
    """One dev evaluation's seconds, estimated by measuring: a batch of ``task.eval_batch_size``
    features drawn evenly from the dev set, run twice (the faster counts: the first pays the
    one-off costs), scaled by tokens to the whole set, with ``EVAL_MARGIN`` of room. Tokens,
    not padded ones: inference removes padding. A smaller probe would be cheaper but wrong:
    small batches cost several times more a token. Runs on the model's device, in eval mode,
    without gradients."""
    features = dev.features
    if not features:
        return 0.0
    size = task.eval_batch_size
    sample = features[:: max(1, len(features) // size)][:size]
    took = []
    for _ in range(2):
        t0 = loop.clock()
        run_model(model, sample, size, lambda out, batch: [])
        took.append(loop.clock() - t0)

    def tokens(rows: list[dict]) -> int:
        return sum(len(f["input_ids"]) for f in rows)

    return min(took) * tokens(features) / tokens(sample) * EVAL_MARGIN


def prepare(config: FinetuneConfig, progress: bool = False) -> Prepared:
    """Read and check the data, encode it, build the task and the starting model, and check
    that a batch fits in memory."""
    source = resolve_source(config.model)
    if source.folder is None:  # a preset or a config file: no weights, no vocabulary
        raise ValueError(
            f"fine-tuning starts from a model folder (weights and vocabulary); {config.model!r} "
            f"is a {source.kind} ({source.description})"
        )
    directory = source.folder
    tokenizer = BertTokenizer.from_pretrained(directory)
    task, train_split, dev, report = TASKS[config.task].read(config, tokenizer)
    if not train_split.features:
        raise ValueError(f"{config.train}: no training examples left after reading")
    report["train"] = train_split.source.describe()
    if dev is not None:
        report["dev"] = dev.source.describe()
    for line in (report["train"], report.get("dev")):
        if line and progress:
            print(line)
    features = train_split.features
    if config.max_train_examples and config.max_train_examples < len(features):
        features = random.Random(config.seed).sample(features, config.max_train_examples)
        train_split = Split(train_split.source, features)
    overrides: dict[str, Any] = {}
    if config.dropout is not None:
        overrides = dict(
            hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout
        )
    torch.manual_seed(config.seed)  # the fresh head follows the seed
    model = task.build_model(directory, **overrides)
    check_memory(model, features, config)
    per_epoch = math.ceil(len(features) / config.batch_size)
    steps = max(1, math.ceil(config.epochs * per_epoch))
    return Prepared(tokenizer, task, train_split, dev, report, model, per_epoch, steps)


def finetune(
    config: FinetuneConfig,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
    prepared: Prepared | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fine-tune; returns the results (also written to ``out_dir/results.json``).
    ``prepared``: the run's pieces from ``prepare(config)``, when the caller already has them
    (its model is the one trained). ``resume``: continue the stopped run in ``out_dir``.
    Raises ``TrainingInterrupted`` (a ``KeyboardInterrupt``) when a signal stops the run,
    after its checkpoint is saved."""
    if resume and overwrite:
        raise ValueError("pass --resume to continue a run or --overwrite to replace it, not both")
    started = time.perf_counter()
    budget_from = loop.clock()  # what max_seconds counts starts here
    out = Path(out_dir)
    settings = json.loads(json.dumps(asdict(config)))  # as run.json holds them
    check_run_folder(out, settings, resume, overwrite)
    run = prepared or prepare(config, progress)
    task, tokenizer, dev, model = run.task, run.tokenizer, run.dev, run.model
    tc = TrainConfig(
        out_dir=str(out),
        steps=run.steps,
        lr=config.lr,
        # A share of the planned steps: with max_seconds the loop scales the whole schedule,
        # warm-up included, to the steps that fit in the budget.
        warmup_steps=int(config.warmup_ratio * run.steps),
        weight_decay=config.weight_decay,
        precision=config.precision,
        seed=config.seed,
        log_every=max(1, min(20, run.per_epoch // 5)),
        device=config.device,
        max_seconds=config.max_seconds,
    )
    if overwrite:
        names = ("metrics.jsonl", CHECKPOINT, CHECKPOINT + ".prev", "results.json", BEST_FILE)
        for name in (*names, RUN_FILE):
            (out / name).unlink(missing_ok=True)
        for name in ("model", "best"):
            shutil.rmtree(out / name, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        (out / RUN_FILE).write_text(json.dumps(settings, indent=2) + "\n", "utf-8")
    key = task.main_metric
    # The best evaluation so far (its model is in out/best); a resumed run reads it back.
    best: dict[str, Any] = {}
    if resume and (out / BEST_FILE).is_file():
        best = json.loads((out / BEST_FILE).read_text("utf-8"))
    spent = {"eval": 0.0}
    # The loop's status line stays open on a terminal: a dev line must start a line of its own.
    newline = "\n" if sys.stderr.isatty() else ""

    def evaluate(m: torch.nn.Module, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        result, details = task.evaluate_with_details(m, dev)
        if not best or result[key] > best["metrics"][key]:
            best.update(step=step, metrics=result, details=details)
            m.save_pretrained(out / "best")  # the best model so far, kept
            tokenizer.save_pretrained(out / "best")
            (out / BEST_FILE).write_text(json.dumps(best) + "\n", "utf-8")
        spent["eval"] += time.perf_counter() - t0
        if progress:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items())
            print(f"{newline}epoch {step / run.per_epoch:.2f} (step {step}): dev {shown}")
        return result

    data = run.batches(config.batch_size, config.seed)
    eval_seconds = 0.0
    if config.max_seconds is not None and dev is not None:
        model.to(config.device)
        eval_seconds = evaluation_seconds(task, model, dev)
        if progress:
            print(f"one dev evaluation: ~{eval_seconds:.1f} s (a batch of it timed)")
    last = train(
        model,
        task,
        data,
        tc,
        resume=resume,
        evaluate=evaluate if dev is not None else None,
        eval_every=run.per_epoch,
        started=budget_from,
        eval_seconds=eval_seconds,
    )
    step = int(last.get("step", 0))
    # A finished run has nothing to resume: its checkpoint (optimiser state included, twice
    # the model's size) is not kept.
    for name in (CHECKPOINT, CHECKPOINT + ".prev", BEST_FILE):
        (out / name).unlink(missing_ok=True)
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
        "steps": step,
        "planned_steps": int(last.get("planned_steps", run.steps)),  # the plan of a budget
        # Training time over the whole run, a resumed run's included (max_seconds counts the
        # wall time, evaluation included); evaluation and wall time are this call's.
        "seconds": float(last.get("train_seconds", 0.0)),
        "eval_seconds": spent["eval"],
        "wall_seconds": time.perf_counter() - started,
        "train_examples": len(run.train.features),
        "main_metric": key,
        "best_step": best.get("step"),
        "dev": best.get("metrics"),
    }
    if best.get("details") is not None:  # e.g. the per-type table of entities, best model's
        results["dev_full"] = best["details"]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", "utf-8")
    try:
        from bertlab.train.curves import plot_run

        plot_run(out)
    except ValueError as e:  # matplotlib missing: the run stands without its picture
        logger.warning("no curves.png: %s", e)
    return results


def resume_command(config: FinetuneConfig, out_dir: str | Path) -> str:
    """The ``bertlab finetune`` command that continues the run of ``config`` in ``out_dir``:
    every setting that differs from its default, and ``--resume``."""
    import shlex

    words = ["bertlab", "finetune", config.task]
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name == "task" or (value == f.default and f.name != "train"):
            continue
        words += [f"--{f.name.replace('_', '-')}", str(value)]
    return shlex.join([*words, "-o", str(out_dir), "--resume"])

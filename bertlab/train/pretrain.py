"""Pre-training: masked LM + next sentence prediction on a prepared corpus (reference 003, 004).

    bertlab prepare wiki.train.tokens -o data/128 --max-seq-length 128
    bertlab prepare wiki.train.tokens -o data/512 --max-seq-length 512
    bertlab pretrain --data data/128 --long-data data/512 --model mini --steps 10000 -o runs/mini

The pieces: ``bertlab.data.stream`` decides which examples each step trains on and masks them
(the same global batch for any number of processes; dynamic or static masks);
``bertlab.tasks.pretraining`` is the objective (MLM + NSP loss and metrics, each rank's share
of the global mean); ``bertlab.train.loop`` is the loop every task shares. This module checks every
setting before any training starts (vocabulary and sequence lengths against the model, batch
divisibility, each phase's batch against the memory there is: ``bertlab.train.memory``, the run
folder), builds the phase schedule (most steps at the short length, the last ``long_fraction``
at the long one, as BERT was trained: reference 001), evaluates on a fixed masked sample of a
held-out corpus (MLM loss and accuracy, NSP loss and accuracy), and saves the final model in the
Hugging Face layout with its vocabulary.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from bertlab.data.corpus import read_meta
from bertlab.data.masking import MaskingConfig
from bertlab.data.stream import Phases, evaluation_batches
from bertlab.distributed import together, world
from bertlab.nn.config import resolve_source
from bertlab.nn.heads import BertForMaskedLM, BertForPreTraining
from bertlab.tasks.pretraining import PretrainingObjective
from bertlab.train import loop
from bertlab.train.loop import TrainConfig, train
from bertlab.train.memory import check_fits, step_memory
from bertlab.train.runs import (
    CHECKPOINT,
    CHECKPOINTS,
    RUN_FILE,
    ShardedCheckpoints,
    Start,
    check_run_folder,
    check_shared_folder,
    saved_world_size,
)

logger = logging.getLogger("bertlab")


# ============================================================================ the command
@dataclass(frozen=True)
class PretrainConfig:
    """What ``bertlab pretrain`` takes; ``train`` holds the optimisation settings."""

    data: str  # a prepared corpus (the short phase)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(out_dir="", steps=1))
    model: str = "mini"  # a preset, a config.json, or a model folder (continue its training)
    batch_size: int = 32  # global, per optimizer step
    long_data: str | None = None  # the long phase's corpus (e.g. 512 tokens)
    long_fraction: float = 0.1  # share of the steps on long_data
    long_batch_size: int | None = None  # default: batch_size
    eval_data: str | None = None
    eval_examples: int = 512
    eval_every: int = 0  # 0: ten times over the run
    masking: str = "dynamic"  # or "static"
    mask_rate: float = 0.15
    max_predictions: int | None = None  # per sequence; default ceil(rate * length)
    whole_word: bool = False
    dropout: float | None = None  # override the model's hidden and attention dropout

    def __post_init__(self) -> None:
        if self.masking not in ("dynamic", "static"):
            raise ValueError(f"masking {self.masking!r} is not 'dynamic' or 'static'")
        if not 0.0 <= self.long_fraction < 1.0:
            raise ValueError(f"long_fraction must be in [0, 1), got {self.long_fraction}")
        for name in ("batch_size", "eval_examples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.long_batch_size is not None and self.long_batch_size < 1:
            raise ValueError(f"long_batch_size must be >= 1, got {self.long_batch_size}")


def build_model(source: str, vocab_size: int, dropout: float | None) -> BertForPreTraining:
    """A preset name, a config.json (fresh weights) or a model folder (its weights)."""
    over = {"vocab_size": vocab_size}
    if dropout is not None:
        over |= {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    found = resolve_source(source)
    if found.kind != "preset" and found.config.vocab_size != vocab_size:
        where = f"the model in {found.folder} has" if found.folder else f"{found.description} sets"
        raise ValueError(
            f"the vocabulary has {vocab_size} tokens but {where} vocab_size "
            f"{found.config.vocab_size}: they must match"
        )
    if found.folder is None:
        return BertForPreTraining(found.config.replace(**over))
    drop = {k: v for k, v in over.items() if k != "vocab_size"}
    return BertForPreTraining.from_pretrained(found.folder, **drop)


def check_memory(model: nn.Module, config: PretrainConfig, data: Phases) -> None:
    """Refuse, before the first step, a phase whose batch cannot fit in the memory of the
    device (``bertlab.train.memory``): each process's micro-batch at the phase's sequence
    length, with its masked positions scored over the vocabulary."""
    tc = config.train
    parameters = sum(p.numel() for p in model.parameters())
    resident = 4 * parameters if torch.device(tc.device).type == "cpu" else 0  # built there
    for phase, (_, stream) in enumerate(data.streams):
        size = (config.long_batch_size or config.batch_size) if phase else config.batch_size
        rows = stream.micro // stream.world_size
        option = f"--{'long-' if phase else ''}batch-size {size}"
        if rows != size:
            option += f" ({rows:,} sequences a micro-batch in each process)"
        estimate = step_memory(
            model.config,
            parameters,
            rows,
            int(stream.meta["max_seq_length"]),
            predicted=stream.masking.max_predictions,
            precision=tc.precision,
            checkpointing=bool(getattr(model, "is_gradient_checkpointing", False)),
        )
        check_fits(estimate, option, tc.device, resident)


def pretrain(config: PretrainConfig, resume: bool | str = False, overwrite: bool = False) -> dict:
    """Pre-train; returns the last metrics. Every setting is checked before training starts.

    ``resume``: True continues the run in the folder (``--resume``); ``"auto"`` continues it
    when it holds a checkpoint and starts it otherwise (``--resume auto``), which is also what
    a process that torchrun restarted does, whatever it was asked (``runs.check_run_folder``).
    A run may continue on another number of processes when its global batches can be kept.

    Many processes: every rank checks everything (its own shards among them) before the first
    collective, and a failure on any rank stops them all, naming the rank and its error
    (``bertlab.distributed.together``)."""
    tc = config.train
    rank, world_size = world()
    out = Path(tc.out_dir)
    budget_from = loop.clock()  # what max_seconds counts starts here
    with together():  # a collective: every rank has checked the folder before rank 0 writes in it
        setup = _set_up(config, resume, overwrite)
    model, data, start = setup.model, setup.data, setup.start
    if rank == 0:  # the folder is ready: from here on, a run lives in it
        if start.replace:
            for name in (RUN_FILE, CHECKPOINT, CHECKPOINT + ".prev", "metrics.jsonl"):
                (out / name).unlink(missing_ok=True)
            for name in ("model", CHECKPOINTS):
                shutil.rmtree(out / name, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_FILE).write_text(json.dumps(setup.settings, indent=2) + "\n", "utf-8")
    if world_size > 1:
        torch.distributed.barrier()
        check_shared_folder(out)

    logger.info(
        "pre-training %s: %d steps in %d phase(s), batch %d, %d process(es)",
        config.model,
        tc.steps,
        len(data.streams),
        config.batch_size,
        world_size,
    )
    # A signal raises TrainingInterrupted out of here, after the loop saved its checkpoint:
    # the model folder is written only by a run that reached its end (its steps, or its plan).
    metrics = train(
        model,
        setup.objective,
        data,
        tc,
        resume=start.resume,
        evaluate=setup.evaluate,
        eval_every=setup.eval_every,
        checkpoints=ShardedCheckpoints(out / CHECKPOINTS, legacy=out / CHECKPOINT),
        started=budget_from,
        eval_seconds=setup.eval_seconds,
    )
    if rank == 0:
        model.save_pretrained(out / "model")
        setup.tokenizer.save_pretrained(out / "model")
    return metrics


class _Setup(NamedTuple):
    model: nn.Module
    objective: PretrainingObjective
    data: Phases
    tokenizer: Any
    settings: dict[str, Any]  # run.json
    start: Start
    evaluate: Callable[[nn.Module, int], dict[str, float]] | None
    eval_every: int
    eval_seconds: float  # one evaluation, estimated (with a time budget), else 0


def _set_up(config: PretrainConfig, resume: bool | str, overwrite: bool) -> _Setup:
    """Everything ``pretrain`` checks and builds before its first collective: the corpora (and
    this rank's shards), the model, the data stream, the memory, the run folder, the objective
    and the evaluation."""
    tc = config.train
    rank, world_size = world()
    out = Path(tc.out_dir)
    settings = {
        **asdict(config),
        "train": {k: v for k, v in asdict(tc).items() if k not in ("log_every", "save_every")},
        "world_size": world_size,
    }
    settings["train"]["betas"] = list(settings["train"]["betas"])
    # The number of processes may change between a run and its resumption (the global batches
    # stay the same: bertlab.data.stream), so it is not one of the settings --resume compares.
    start = check_run_folder(out, settings, resume, overwrite, free=("world_size",), elastic=True)
    before = saved_world_size(out) if start.resume else None

    streams_meta = [("data", config.data)] + (
        [("long_data", config.long_data)] if config.long_data else []
    )
    metas = {
        name: read_meta(directory)
        for name, directory in streams_meta
        + ([("eval_data", config.eval_data)] if config.eval_data else [])
    }
    vocab_size = int(metas["data"]["vocab_size"])
    for name, meta in metas.items():
        if int(meta["vocab_size"]) != vocab_size or meta["vocab_dir"] != metas["data"]["vocab_dir"]:
            raise ValueError(
                f"{name} was prepared with another vocabulary ({meta['vocab_dir']}, "
                f"{meta['vocab_size']} tokens) than data "
                f"({metas['data']['vocab_dir']}, {vocab_size})"
            )
    nsp = all(m["nsp"] for m in metas.values())
    if any(m["nsp"] for m in metas.values()) and not nsp:
        raise ValueError("some corpora were prepared with --no-nsp and some without: all or none")

    torch.manual_seed(tc.seed)  # the initial weights follow the seed too
    model = build_model(config.model, vocab_size, config.dropout)
    mc = model.config
    for name, meta in metas.items():
        if int(meta["max_seq_length"]) > mc.max_position_embeddings:
            raise ValueError(
                f"{name} holds sequences of up to {meta['max_seq_length']} tokens, "
                f"above the model's max_position_embeddings "
                f"{mc.max_position_embeddings}"
            )
    if not nsp:  # MLM only: no pooler, no NSP head
        mlm = BertForMaskedLM(mc)
        mlm.load_state_dict(model.state_dict(), strict=False)
        model = mlm  # type: ignore[assignment]

    from bertlab.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(metas["data"]["vocab_dir"])
    continuation = None
    if config.whole_word:
        from bertlab.data.masking import continuation_table

        continuation = continuation_table(tokenizer.vocab)

    def masking(seq_len: int) -> MaskingConfig:
        return MaskingConfig.for_length(
            seq_len, config.mask_rate, config.max_predictions, config.whole_word
        )

    try:
        data = Phases.build(
            tc.steps,
            config.data,
            config.batch_size,
            config.long_data,
            config.long_fraction,
            config.long_batch_size,
            masking,
            mask_token_id=tokenizer.mask_token_id,
            vocab_size=vocab_size,
            grad_accum=tc.grad_accum,
            seed=tc.seed,
            static=config.masking == "static",
            continuation=continuation,
        )
    except ValueError as e:
        if before is None or before == world_size:
            raise
        raise ValueError(
            f"the run in {out} ran on {before} process(es); {world_size} cannot continue it "
            f"with the same global batches: {e}"
        ) from None
    if before is not None and before != world_size and rank == 0:
        logger.warning(
            "the run in %s ran on %d process(es); it continues on %d, on the same global batches",
            out,
            before,
            world_size,
        )
    check_memory(model, config, data)
    if tc.max_seconds is not None and len(data.streams) > 1 and rank == 0:
        # The phases are laid out on TrainConfig.steps; a time plan that ends sooner cuts the
        # long phase short or skips it.
        logger.warning(
            "--max-seconds with --long-data: the long phase starts at step %d of %d; a time "
            "budget that plans fewer steps shortens it or leaves it out",
            data.streams[1][0],
            tc.steps,
        )

    objective = PretrainingObjective(world_size)
    eval_fn, eval_every = None, 0
    if config.eval_data:
        seq_len = int(metas["eval_data"]["max_seq_length"])
        batches = evaluation_batches(
            config.eval_data,
            config.eval_examples,
            min(64, config.eval_examples),
            masking(seq_len),
            tokenizer.mask_token_id,
            vocab_size,
            seed=tc.seed,
        )
        eval_every = config.eval_every or max(1, tc.steps // 10)

        def eval_fn(model: nn.Module, step: int) -> dict[str, float]:
            return objective.evaluate(model, batches, tc.device)

    eval_seconds = 0.0
    if eval_fn is not None and tc.max_seconds is not None:
        eval_seconds = evaluation_seconds(model, objective, batches, tc.device)
    return _Setup(
        model, objective, data, tokenizer, settings, start, eval_fn, eval_every, eval_seconds
    )


def evaluation_seconds(
    model: nn.Module, objective: PretrainingObjective, batches: list, device: str
) -> float:
    """One evaluation's seconds, estimated by measuring one batch (after a first that pays the
    one-off costs) and scaling it to the evaluation's batches, with a fifth more for noise;
    so that a time budget keeps room for the final evaluation before one has run."""
    model.to(device).eval()
    objective.evaluate(model, batches[:1], device)  # one-off costs, not timed
    t0 = loop.clock()
    objective.evaluate(model, batches[:1], device)
    took = loop.clock() - t0
    model.train()
    return took * len(batches) * 1.2

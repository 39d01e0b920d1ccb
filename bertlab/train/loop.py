"""One training loop for every task: pre-training and fine-tuning alike.

    train(model, task, data, config) -> the last step's metrics

``task`` follows ``bertlab.tasks.Task``: ``task(model, batch)`` -> (loss, metrics).
``data(step, micro)`` gives the batch for an optimizer step and micro-batch, deterministically,
so a run can stop anywhere and resume on the very batch it would have seen. The loop does the
rest: AdamW (fused; no decay on biases and LayerNorm) or LAMB, linear warm-up then linear decay,
gradient accumulation and clipping, bfloat16 autocast, checkpoints that lose nothing (model,
optimiser, RNG states, step, time plan; periodically and on SIGINT/SIGTERM, into a store that
counts a checkpoint only once it is written whole: ``bertlab.train.runs``), a metrics file and a
progress line. A loss that is not finite stops the run, naming the step and the last good
checkpoint. A signal saves a checkpoint, then ``TrainingInterrupted`` leaves ``train``.

A time budget (``TrainConfig.max_seconds``) bounds the whole wait, evaluations and checkpoints
included, and is planned, not just enforced: the loop times a few steps, fixes how many steps
fit with room for the evaluations, and fits the learning-rate schedule to them (see ``Plan``);
no step starts that would leave no room for itself and the final evaluation.

Many processes (``torchrun``; the caller has run ``torch.distributed.init_process_group``): the
model is wrapped in DistributedDataParallel and the task runs inside the wrapper's forward pass,
``data`` gives each rank its own rows, and only rank 0 writes. DDP averages the gradients over
ranks, so a task whose loss is "this rank's share of the global loss" (its sum over its rows
divided by the global count) multiplies it by the world size; its metrics are shares too, and
the loop sums them over ranks. A task that does so gives the same run on any number of
processes (``bertlab.tasks.pretraining`` does).

The steps of a run, in order (``Run``'s methods, called by ``train``): ``restore`` (on resume),
then per optimizer step ``step`` (accumulate, check, clip, update; it ends with ``time_plan``,
which fixes the plan once and says whether the next step fits the budget), ``evaluate``,
``log``, ``checkpoint`` when due; at the end ``checkpoint``. A signal ends the run with
``checkpoint`` and ``TrainingInterrupted``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertlab.distributed import rng_state, set_rng_state, sum_over_ranks, world
from bertlab.files import atomic_write
from bertlab.progress import Progress
from bertlab.tasks import Task
from bertlab.train.runs import CHECKPOINT, Checkpoints, FileCheckpoints

__all__ = [
    "CHECKPOINT",
    "Plan",
    "Task",
    "TrainConfig",
    "TrainingInterrupted",
    "linear_schedule",
    "param_groups",
    "train",
]

logger = logging.getLogger("bertlab")
clock = time.perf_counter  # the loop's clock (a test may replace it with a deterministic one)


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped ``train``: the step finished, its checkpoint saved.

    ``step``: the optimizer steps done; ``checkpoint``: the saved file (None when the run keeps
    no checkpoints); ``signum``: the signal; ``at_once``: a second Ctrl-C stopped the run in
    the middle of a step, so ``step`` and ``checkpoint`` are the last checkpoint's (None when
    none was saved yet). A KeyboardInterrupt, so a caller that does not
    catch it stops as on Ctrl-C; ``bertlab pretrain`` catches it and says how to continue.
    """

    def __init__(
        self,
        step: int,
        checkpoint: Path | None,
        signum: int = signal.SIGINT,
        at_once: bool = False,
    ):
        where = f"checkpoint saved in {checkpoint}" if checkpoint else "no checkpoint kept"
        if at_once:
            where = (
                f"stopped at once; the last checkpoint is in {checkpoint}"
                if checkpoint
                else "stopped at once, before any checkpoint was saved"
            )
        super().__init__(f"interrupted at step {step}; {where}")
        self.step = step
        self.checkpoint = checkpoint
        self.signum = signum
        self.at_once = at_once


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation settings of a run.

    ``max_seconds``: a budget of the run's wall time: training steps, evaluations and checkpoint
    writing all count, from ``train``'s ``started`` (the caller's start, so that reading the
    data counts too); a resumed run continues the clock of the one it resumes. The loop times
    the first steps, plans how many of ``steps`` fit with room for the evaluations, scales
    warm-up and decay to that plan so that the learning rate reaches 0 at the budget (see
    ``Plan``), and never starts a step unless the step (predicted as the slowest of the recent
    ones), the evaluation due after it and the final checkpoint still fit.
    """

    out_dir: str
    steps: int
    lr: float = 1e-4
    warmup_steps: int = 0  # of ``steps``; a time plan scales it with the planned steps
    weight_decay: float = 0.01
    optimizer: str = "adamw"  # or "lamb"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    max_grad_norm: float = 1.0  # 0 = no clipping
    grad_accum: int = 1  # micro-batches per optimizer step
    precision: str = "float32"  # or "bfloat16" (autocast; weights stay float32)
    seed: int = 0
    log_every: int = 10
    save_every: int = 0  # 0 = only at the end (and on SIGINT/SIGTERM)
    device: str = "cpu"
    compile: bool = False  # torch.compile the model (dynamic shapes)
    max_seconds: float | None = None  # a wall-time budget, planned (see the docstring)
    checkpoints: bool = True  # False: no checkpoint.pt at all (a run that will not resume)

    def __post_init__(self) -> None:
        for name in ("steps", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} must be in [0, steps={self.steps}]")
        if self.optimizer not in ("adamw", "lamb"):
            raise ValueError(f"optimizer {self.optimizer!r} is not 'adamw' or 'lamb'")
        if self.precision not in ("float32", "bfloat16"):
            raise ValueError(f"precision {self.precision!r} is not 'float32' or 'bfloat16'")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")


# ============================================================================ optimisation
def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weight matrices only: never on biases or LayerNorm (as BERT)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019): Adam's update, rescaled per tensor by ||w|| / ||update||, for
    large-batch pre-training."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["m"], state["v"], state["step"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                trust = (w_norm / u_norm) if w_norm > 0 and u_norm > 0 else torch.tensor(1.0)
                p.add_(update, alpha=-group["lr"] * float(trust))


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Learning-rate factor: 0 -> 1 over ``warmup`` steps, then down to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


# ============================================================================ the time plan
SKIPPED_STEPS = 1  # the first step of a process pays one-off costs (allocation, kernels, state)
TIMED_STEPS = 3  # at least this many steps after it are timed for the plan,
TIMED_FRACTION = 0.05  # and at least this share of the budget (one step's time is noisy),
TIMED_SECONDS = 60.0  # or this long, whichever is shorter
# The plan fills this share of the budget's remaining seconds. Step times drift (a busy
# machine, longer batches): a run planned to the last second is cut by the guard with its rate
# still up, where one planned with room ends its schedule, the rate decayed to 0.
PLAN_SHARE = 0.9
# A plan is fitted again, longer, when at the mean step time so far it would end before this
# share of the budget: steps that sped up leave the rest of the budget to more steps. (Between
# it and the whole budget a plan stands: a refit fills PLAN_SHARE, so it does not swing.)
GROW_BELOW = 0.8


RECENT_STEPS = 5  # the next step is predicted as the slowest of this many recent ones


@dataclass(frozen=True)
class Plan:
    """How many steps a time budget holds, fitted once the first steps are timed and kept in
    the checkpoint.

    After ``SKIPPED_STEPS`` steps the loop times the next ones, at least ``TIMED_STEPS`` of them
    and ``TIMED_FRACTION`` of the budget (or ``TIMED_SECONDS``), takes their mean time
    (``seconds_per_step``, averaged over ranks so every rank plans alike) and fits the rest of
    the budget: ``steps`` = the steps done + the whole steps that ``PLAN_SHARE`` of the
    remaining seconds hold, once the final evaluation and checkpoint (``reserve``) and the
    evaluations due on the way (``eval_every``, ``eval_seconds`` each) are set aside, never
    more than ``TrainConfig.steps``. From then on the schedule warms up over ``warmup`` steps
    (``TrainConfig.warmup_steps`` scaled by steps / ``TrainConfig.steps``, or up to the step of
    the plan if that is later, so that a short run still reaches its peak rate) and decays to 0
    at ``steps``; the few steps before the plan ran on the unplanned schedule's first values.

    Step times drift after the plan. Should the steps slow down so that the planned ones no
    longer fit (a busy machine, longer batches), or speed up so that the plan would end with
    more than ``1 - GROW_BELOW`` of the budget unused (a first pass through the data that paid
    for caches and kernels, a neighbour that went quiet), the plan is fitted again from the
    mean step time so far, shorter or longer. A plan fitted again (``previous``) keeps the
    warm-up it had; past its warm-up, the rate goes on from where it is (``since``, ``start``:
    the step of the refit and the rate there, as a share of the peak) straight down to 0 at the
    new ``steps``, so it never jumps, up or down, and never climbs back to its peak. A resumed
    run keeps the plan, so it takes the very steps of an unbroken one.
    """

    steps: int
    warmup: int
    seconds_per_step: float
    since: int = 0  # a plan fitted again past its warm-up: the step of the refit,
    start: float = 1.0  # and the rate there (a share of the peak), which falls to 0 at ``steps``

    def factor(self, step: int) -> float:
        """The learning-rate factor of optimizer step ``step`` (0-based) under this plan."""
        if self.since and step >= self.since:
            return max(0.0, self.start * (self.steps - step) / max(1, self.steps - self.since))
        return linear_schedule(self.warmup, self.steps)(step)

    @classmethod
    def fit(
        cls,
        config: TrainConfig,
        done: int,
        elapsed: float,
        per_step: float,
        reserve: float = 0.0,
        eval_every: int = 0,
        eval_seconds: float = 0.0,
        previous: Plan | None = None,
    ) -> Plan:
        assert config.max_seconds is not None, "a plan needs a time budget"
        left = max(0.0, config.max_seconds - elapsed - reserve) * PLAN_SHARE
        fits = config.steps - done
        if per_step > 0 or eval_seconds > 0:
            per = per_step + (eval_seconds / eval_every if eval_every else 0.0)
            fits = min(fits, math.floor(left / per) + 1 if per > 0 else fits)
            # The evaluations between here and the end (the final one is in ``reserve``).
            while fits > 0 and (
                fits * per_step + evaluations(done, done + fits, eval_every) * eval_seconds > left
            ):
                fits -= 1
        steps = max(done, min(config.steps, done + max(0, fits)))
        if previous is not None:  # fitted again: the warm-up it had, and the rate where it is
            warmup = min(previous.warmup, steps)
            if done >= previous.warmup:
                return cls(steps, warmup, per_step, done, previous.factor(done))
        else:
            # A plan that comes after its scaled warm-up would have ended (a short budget) ends
            # the warm-up where it is made: the rate is at its peak there, then decays to 0.
            warmup = max(round(config.warmup_steps * steps / config.steps), min(done, steps))
        return cls(steps, warmup, per_step)


def evaluations(done: int, end: int, every: int) -> int:
    """The evaluations every ``every`` steps after step ``done`` and before step ``end``."""
    if not every or end <= done + 1:
        return 0
    return (end - 1) // every - done // every


# ============================================================================ the loop
_NOT_SHOWN = {"step", "planned_steps", "lr", "tokens_per_s", "train_seconds"}


class _Forward(nn.Module):
    """What DistributedDataParallel wraps: the task's whole forward pass, loss included, so that
    a task may call the model's parts (encoder, heads) and DDP still sees the one forward call
    its gradient exchange is keyed on. Holds the model; the checkpoint saves the model alone."""

    def __init__(self, model: nn.Module, task: Task):
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        return self.task(self.model, batch)


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, config.weight_decay)
    if config.optimizer == "lamb":
        return Lamb(groups, lr=config.lr, betas=config.betas, eps=config.eps)
    # The fused kernel updates all parameters in one pass: on CPU several times faster than the
    # default per-tensor loop, which for a small model is a large share of a fine-tuning step.
    fused = torch.device(config.device).type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused)


class Run:
    """One call of ``train``: the model, its optimiser, and where the run stands (steps done,
    time plan, training seconds). ``train`` calls its steps in order; each is one method."""

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        data: Callable[[int, int], dict[str, torch.Tensor]],
        config: TrainConfig,
        resume: bool = False,
        evaluate: Callable[[nn.Module, int], dict[str, float]] | None = None,
        eval_every: int = 0,
        checkpoints: Checkpoints | None = None,
        started: float | None = None,
        eval_seconds: float = 0.0,
    ):
        self.config, self.data = config, data
        self.evaluate_fn, self.eval_every = evaluate, eval_every
        self.rank, self.world_size = world()
        self.main = self.rank == 0
        self.out = Path(config.out_dir)
        self.store = checkpoints or FileCheckpoints(self.out / CHECKPOINT)
        self.checkpoint_path: Path | None = None  # the last checkpoint saved or restored
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed + self.rank)
        random.seed(config.seed + self.rank)
        self.model = model.to(config.device).train()
        self.optimizer = _optimizer(model, config)
        self.done = 0  # optimizer steps done
        self.plan: Plan | None = None
        self.saved: int | None = None  # the step of the last checkpoint
        self.seconds_before = 0.0  # training seconds of the runs this one continues
        self.untimed_seconds = 0.0  # evaluation and checkpoint writing: not training time
        self.spent_before = 0.0  # budget seconds (all of them) of the runs this one continues
        # One evaluation's seconds: the caller's estimate, then the slowest one measured; and the
        # slowest checkpoint. The budget keeps room for them at the end of the run.
        self.eval_seconds = eval_seconds if evaluate is not None and eval_every else 0.0
        self.evaluated = False  # an evaluation was measured in this process
        self.save_seconds = 0.0
        self.durations: list[float] = []  # training seconds of each step of this process
        self.why_late = ""  # what the guard predicted when it stopped the run
        self.tokens = 0  # real (unpadded) tokens this process's run has trained on
        self.ends: list[float] = []  # training seconds at the end of each step of this process
        self.signum = 0  # the signal this process received
        self.stopping = False  # a signal reached some rank: every rank stops after this step
        self.late = False  # the next step would pass the time budget
        if resume:
            self.restore()
        self.budget_from = clock() if started is None else started
        if config.max_seconds is not None and self.spent() + self.reserve() >= config.max_seconds:
            # A resumed run whose budget is spent, or one whose preparation spent it, or
            # whose final evaluation alone would pass it.
            self.late = True
            self.why_late = f"{self.spent():.1f} s spent before the first step" + (
                f", and the final evaluation (~{self.reserve():.2g} s) would not fit after it"
                if self.reserve()
                else ""
            )
        if config.max_seconds is not None and self.world_size > 1:  # every rank starts, or none
            self.late = sum_over_ranks([float(self.late)])[0] > 0
            if self.late and not self.why_late:
                self.why_late = "another process found no room for a step"
        # Wrapped after restore: DDP broadcasts rank 0's weights when it is built.
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        self.forward: nn.Module = _Forward(self.model, task)
        if self.world_size > 1:
            cuda = config.device.startswith("cuda")
            self.ddp = self.forward = nn.parallel.DistributedDataParallel(
                self.forward, device_ids=[torch.device(config.device).index] if cuda else None
            )
        if config.compile:
            self.forward = torch.compile(self.forward, dynamic=True)  # type: ignore[assignment]
        self.started = clock()

    # ------------------------------------------------------------------ where the run stands
    @property
    def total(self) -> int:
        """The steps this run ends at: the time plan's, else ``TrainConfig.steps``."""
        return self.plan.steps if self.plan else self.config.steps

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) under the schedule in force."""
        c = self.config
        if self.plan is not None:
            return c.lr * self.plan.factor(step)
        return c.lr * linear_schedule(c.warmup_steps, c.steps)(step)

    def seconds(self) -> float:
        """Training seconds so far, over this run and the ones it continues (evaluation and
        checkpoint writing left out)."""
        return self.seconds_before + clock() - self.started - self.untimed_seconds

    def spent(self) -> float:
        """What the time budget counts: every second since the budget's start (training,
        evaluation, checkpoints, the caller's preparation), over this run and the ones it
        continues."""
        return self.spent_before + clock() - self.budget_from

    def reserve(self) -> float:
        """Seconds kept for the end of the run: its final evaluation and checkpoint."""
        return self.eval_seconds + (self.save_seconds if self.config.checkpoints else 0.0)

    def evaluation_due(self) -> bool:
        """Whether an evaluation runs after the step just done, whatever the budget says."""
        return (
            self.evaluate_fn is not None
            and bool(self.eval_every)
            and (self.done % self.eval_every == 0 or self.done == self.total)
        )

    # ------------------------------------------------------------------ the steps
    def restore(self) -> None:
        """Continue from the newest readable checkpoint: weights, optimiser, RNG, step, plan."""
        found = self.store.load(self.model, self.optimizer)
        if found is None:
            raise FileNotFoundError(f"--resume: no readable checkpoint in {self.out}")
        self.checkpoint_path, state = found
        ranks = state.get("rng_ranks") or [state["rng"]]
        if len(ranks) != self.world_size and self.main:
            logger.warning(
                "the checkpoint holds the random states of %d processes, this run "
                "has %d: dropout draws will differ from an unbroken run",
                len(ranks),
                self.world_size,
            )
        set_rng_state(ranks[self.rank] if len(ranks) == self.world_size else ranks[0])
        self.done = self.saved = int(state["step"])
        self.plan = Plan(**state["plan"]) if state.get("plan") else None
        self.seconds_before = float(state.get("train_seconds", 0.0))
        self.spent_before = float(state.get("spent_seconds", self.seconds_before))
        if self.main:
            logger.warning("resuming %s at step %d", self.out, self.done)

    def step(self) -> dict[str, float]:
        """One optimizer step: its micro-batches forward and backward (gradients exchanged
        after the last), the metrics summed over ranks and checked, clipping, the update at
        this step's learning rate; then the time plan. Returns the step's metrics."""
        c, step = self.config, self.done
        device, low = c.device.split(":")[0], c.precision == "bfloat16"
        sums: dict[str, float] = {}
        tokens = 0
        for micro in range(c.grad_accum):
            batch = {k: v.to(c.device) for k, v in self.data(step, micro).items()}
            last = micro == c.grad_accum - 1
            with self.ddp.no_sync() if self.ddp is not None and not last else nullcontext():
                with torch.autocast(device, dtype=torch.bfloat16, enabled=low):
                    loss, m = self.forward(batch)
                (loss / c.grad_accum).backward()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + float(v) / c.grad_accum
            if "attention_mask" in batch:
                tokens += int(batch["attention_mask"].sum())
        # Metrics are per-rank shares: their sums are the global values. The token count and
        # the stop request travel in the same message, so that every rank stops at one step.
        keys = sorted(sums)
        *values, tokens, asked = sum_over_ranks(
            [sums[k] for k in keys] + [tokens, float(self.signum)]
        )
        sums = dict(zip(keys, values, strict=True))
        if not all(math.isfinite(v) for v in sums.values()):
            good = f"{self.checkpoint_path} (step {self.saved})" if self.checkpoint_path else None
            raise FloatingPointError(
                f"loss is not finite at step {step + 1} ({sums}); the run stops here. "
                f"Last good checkpoint: {good or 'none yet'}"
            )
        if c.max_grad_norm:
            nn.utils.clip_grad_norm_(self.model.parameters(), c.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr(step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.done = step + 1
        self.tokens += int(tokens)
        self.stopping = asked > 0  # from the message, so the same on every rank
        self.time_plan()
        # "lr" is the rate after this step, as a scheduler reports it: 0 once the run is over.
        return {"step": self.done, "lr": self.lr(self.done), **sums}

    def time_plan(self) -> None:
        """After a step, with a time budget: fix the plan once enough steps are timed, and
        decide (the same on every rank) whether the next step still fits in the budget: the
        next step, predicted as the slowest of the last ``RECENT_STEPS`` (the first steps'
        one-off costs left out once there are others), the evaluation due after this step, and
        room for the final evaluation and checkpoint."""
        c = self.config
        self.ends.append(self.seconds())
        previous = self.ends[-2] if len(self.ends) > 1 else self.seconds_before
        self.durations.append(self.ends[-1] - previous)
        if c.max_seconds is None:
            return
        n, timed = len(self.ends), 0.0
        if n > SKIPPED_STEPS:  # the mean step after the skipped ones of this process
            timed = self.ends[-1] - self.ends[SKIPPED_STEPS - 1]
            per_step = timed / (n - SKIPPED_STEPS)
        else:  # only skipped steps so far: one-off costs included, an overestimate
            per_step = (self.ends[-1] - self.seconds_before) / n
        enough = n >= SKIPPED_STEPS + TIMED_STEPS and (
            timed >= min(TIMED_FRACTION * c.max_seconds, TIMED_SECONDS)
        )
        # A budget too short to wait for the timed steps (twice their seconds would not fit):
        # plan now, from the steps timed so far (one at least, past the skipped ones), rather
        # than spend it on the unplanned schedule.
        to_time = max(0, SKIPPED_STEPS + TIMED_STEPS - n)
        tight = c.max_seconds - self.spent() - self.reserve() < 2 * to_time * per_step
        enough = enough or (n > SKIPPED_STEPS and tight)
        recent = self.durations[SKIPPED_STEPS:] or self.durations
        next_step = max(recent[-RECENT_STEPS:])
        pending = self.eval_seconds if self.evaluation_due() else 0.0
        spent = self.spent()
        ends_at = spent + pending + next_step + self.reserve()
        # One message: every rank learns whether any rank is late or ready to plan, and the
        # mean step time, seconds spent and room kept at the end, so that all stop, and plan,
        # at the same step.
        late, ready, *means = sum_over_ranks(
            [
                float(ends_at > c.max_seconds),
                float(enough),
                per_step,
                spent,
                pending,
                self.reserve(),
                self.eval_seconds,
            ]
        )
        per_step, elapsed, pending, reserve, eval_seconds = (m / self.world_size for m in means)
        self.late = late > 0
        if self.late:
            self.why_late = (
                f"{spent:.1f} s spent; the next step (~{next_step:.2g} s, the slowest of the "
                f"last {min(len(recent), RECENT_STEPS)})"
                + (f", the evaluation due now (~{pending:.2g} s)" if pending else "")
                + (f" and the final evaluation and checkpoint (~{self.reserve():.2g} s)")
                + f" would end at {ends_at:.1f} s"
            )
        ongoing = self.plan is not None and self.done < self.plan.steps
        ends = elapsed  # when the plan would end, at the mean step time so far
        if ongoing:
            ends += (
                pending
                + (self.plan.steps - self.done) * per_step
                + evaluations(self.done, self.plan.steps, self.eval_every) * eval_seconds
                + reserve
            )
        # The steps slowed down since the plan, so the planned ones would not all fit: it
        # shrinks. Or they sped up, so it would end with a good part of the budget unused and
        # more steps are wanted: it grows (if the refit holds more steps).
        shrink = ongoing and ends > c.max_seconds
        grow = ongoing and self.plan.steps < c.steps and ends < GROW_BELOW * c.max_seconds
        if (self.plan is None and ready > 0) or shrink or grow:
            before = self.plan
            plan = Plan.fit(
                c,
                self.done,
                elapsed + pending,
                per_step,
                reserve,
                self.eval_every if self.evaluate_fn is not None else 0,
                eval_seconds,
                previous=before,
            )
            if before is None or (
                plan.steps < before.steps if shrink else plan.steps > before.steps
            ):  # the first plan, or a refit that moved the plan the way it was made for
                self.plan = plan
                if self.main:
                    self._say_plan(before, per_step, reserve)

    def _say_plan(self, before: Plan | None, per_step: float, reserve: float) -> None:
        """One warning line: the plan just made, and why a plan was made again."""
        c, plan = self.config, self.plan
        again = ""
        if before is not None:
            faster = plan.steps > before.steps
            again = (
                f" (fitted again at step {self.done}: steps were "
                f"{'faster' if faster else 'slower'} than the {before.seconds_per_step:.3g}s "
                f"planned, {before.steps} steps before)"
            )
        kept = f", {reserve:.3g}s kept for the final evaluation and checkpoint" if reserve else ""
        logger.warning(
            "time budget %gs: %d of %d steps fit (%.3gs a step%s)%s; warm-up %d steps, "
            "the learning rate decays to 0 at step %d",
            c.max_seconds,
            plan.steps,
            c.steps,
            per_step,
            kept,
            again,
            plan.warmup,
            plan.steps,
        )

    def evaluate(self, metrics: dict[str, float]) -> None:
        """Held-out metrics (``eval_*``) every ``eval_every`` steps and at the end, on the
        unwrapped model in eval mode; their time is not training time (the budget counts it,
        and keeps room for the slowest evaluation measured: the caller's estimate until then)."""
        if self.evaluate_fn is None or not self.eval_every:
            return
        if not (self.done % self.eval_every == 0 or self.done == self.total or self.late):
            return
        t0 = clock()
        self.model.eval()
        with torch.no_grad():
            result = self.evaluate_fn(self.model, self.done)
        self.model.train()
        metrics.update({f"eval_{k}": v for k, v in result.items()})
        took = clock() - t0
        self.untimed_seconds += took
        # The caller's estimate until one is measured; then the slowest measured.
        self.eval_seconds = max(self.eval_seconds, took) if self.evaluated else took
        self.evaluated = True

    def log(self, metrics: dict[str, float], file: Any, progress: Progress | None) -> None:
        """Throughput, time and plan into the metrics; one JSON line; the progress line."""
        elapsed = self.seconds()
        run_seconds = elapsed - self.seconds_before
        metrics["tokens_per_s"] = self.tokens / run_seconds if run_seconds > 0 else 0.0
        metrics["train_seconds"] = elapsed
        metrics["planned_steps"] = self.total
        if file is not None:
            file.write(json.dumps(metrics) + "\n")
            file.flush()
        if progress is not None and (
            self.done % self.config.log_every == 0 or self.done in (1, self.total)
        ):
            rate = len(self.ends) / run_seconds if run_seconds > 0 else 0.0
            eta = (self.total - self.done) / rate if rate > 0 else 0.0
            shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k not in _NOT_SHOWN)
            progress.update(
                f"step {self.done}/{self.total} {shown} {metrics['tokens_per_s']:,.0f} tok/s "
                f"eta {eta:,.0f}s"
            )

    def checkpoint(self, wait: bool = True) -> Path | None:
        """Save everything a resume needs into the run's store (every rank's random state goes
        in, so that dropout resumes exactly); ``wait=False`` lets a store that can write in the
        background do so. None when the run keeps no checkpoints."""
        if not self.config.checkpoints:
            return None
        if self.saved == self.done and self.checkpoint_path is not None:  # saved at this step
            if wait:
                self.store.close()
            return self.checkpoint_path
        t0 = clock()
        self.saved = self.done
        ranks = [rng_state()]
        if self.world_size > 1:
            ranks = [None] * self.world_size
            torch.distributed.all_gather_object(ranks, rng_state())
        state = {
            "rng": ranks[0],
            "rng_ranks": ranks,
            "step": self.done,
            "plan": asdict(self.plan) if self.plan else None,
            "train_seconds": self.seconds(),
            "spent_seconds": self.spent(),
            "config": asdict(self.config),
        }
        self.checkpoint_path = self.store.save(self.model, self.optimizer, state, wait)
        took = clock() - t0
        self.untimed_seconds += took
        self.save_seconds = max(self.save_seconds, took)
        return self.checkpoint_path

    @contextmanager
    def signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM ask the run to stop after the current step, and rank 0 says so at
        once; a second SIGINT stops at once, from the last checkpoint saved
        (``TrainingInterrupted`` with ``at_once``). Handlers can only be installed from the
        main thread; elsewhere signals keep their handlers."""

        def on_signal(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.signum and signum == signal.SIGINT:
                last = self.checkpoint_path if self.saved is not None else None
                raise TrainingInterrupted(self.saved or 0, last, signum, at_once=True)
            self.signum = signum
            if self.main:
                saving = (
                    f"saving a checkpoint in {self.out}"
                    if self.config.checkpoints
                    else "no checkpoint is kept"
                )
                again = (
                    "; Ctrl-C again stops at once, losing the steps after the last checkpoint"
                    if signum == signal.SIGINT
                    else ""
                )
                # os.write, not print: the handler may run in the middle of a print to stderr.
                os.write(
                    2, f"\n{name}: stopping after the current step, {saving}{again}\n".encode()
                )

        previous = {}
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def train(
    model: nn.Module,
    task: Task,
    data: Callable[[int, int], dict[str, torch.Tensor]],
    config: TrainConfig,
    resume: bool = False,
    evaluate: Callable[[nn.Module, int], dict[str, float]] | None = None,
    eval_every: int = 0,
    checkpoints: Checkpoints | None = None,
    started: float | None = None,
    eval_seconds: float = 0.0,
) -> dict[str, float]:
    """Train ``model`` for ``config.steps`` optimizer steps (or the steps a time budget
    plans); returns the last step's metrics (``step``, ``planned_steps``, ``lr``, the task's
    metrics, ``eval_*``, ``tokens_per_s``, ``train_seconds``; ``stopped_by_time`` when the
    budget cut the run before its plan).

    ``data(step, micro)`` -> batch dict (this rank's rows); ``task(model, batch)`` -> (loss,
    metrics). ``evaluate(model, step)`` runs every ``eval_every`` steps and at the end on every
    rank, on the unwrapped model in eval mode. Rank 0 writes ``metrics.jsonl`` in
    ``config.out_dir``; ``checkpoints`` keeps the checkpoints (by default
    ``runs.FileCheckpoints``: ``checkpoint.pt`` there). The data position is the step: ``data``
    is a function of it. A resumed run drops the metrics rows after its checkpoint's step (a
    killed process may have logged steps it never saved), so the file reads as an unbroken
    run's. Raises ``TrainingInterrupted`` after saving when SIGINT/SIGTERM arrives.

    With ``config.max_seconds``: ``started`` is when the budget's clock started (a value of
    ``loop.clock``; default: now), so that the caller's reading of the data counts;
    ``eval_seconds`` is the caller's estimate of one evaluation (e.g. a timed batch scaled to
    the evaluation set), room for which the budget keeps until one is measured.
    """
    run = Run(
        model, task, data, config, resume, evaluate, eval_every, checkpoints, started, eval_seconds
    )
    metrics: dict[str, float] = {}
    progress = Progress() if run.main else None
    file = None
    if run.main:
        path = run.out / "metrics.jsonl"
        if resume:
            _keep_rows(path, run.done)
        file = open(path, "a" if resume else "w")  # noqa: SIM115
    try:
        with run.signals():
            if progress is not None and run.done < run.total and not run.late:
                budget = f", within {config.max_seconds:g} s" if config.max_seconds else ""
                progress.note(
                    f"training: step {run.done + 1} of {run.total} starting{budget}; "
                    "Ctrl-C stops after the current step"
                )
            while run.done < run.total and not run.late:
                metrics = run.step()
                run.evaluate(metrics)
                run.log(metrics, file, progress)
                # One process reads its own signal at once (after an evaluation too); many
                # agree on it in the step's message, so that all stop at the same step.
                if run.stopping or (run.world_size == 1 and run.signum):
                    saved = run.checkpoint()
                    raise TrainingInterrupted(run.done, saved, run.signum or signal.SIGINT)
                if config.save_every and run.done % config.save_every == 0:
                    run.checkpoint(wait=False)
            if run.done < run.total:  # the budget ran out before the plan's end
                metrics["stopped_by_time"] = 1.0
                if run.main:
                    logger.warning(
                        "time budget of %gs: stopping at step %d of %d, as no further step "
                        "fits: %s",
                        config.max_seconds,
                        run.done,
                        run.total,
                        run.why_late,
                    )
            run.checkpoint()
            run.store.close()
    finally:
        if file is not None:
            file.close()
        if progress is not None:
            progress.close()
    return metrics


def _keep_rows(path: Path, step: int) -> None:
    """Keep the rows of ``metrics.jsonl`` up to ``step`` (and none after a line that a killed
    process left unfinished)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text("utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            break
        if int(row.get("step", 0)) > step:
            break
        kept.append(line + "\n")
    atomic_write(path, lambda p: Path(p).write_text("".join(kept), "utf-8"))

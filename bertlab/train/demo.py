"""The fine-tuning of ``bertlab demo``, planned to the machine it runs on.

The demo fine-tunes a sentiment classifier on the bundled SST-2 sample (5,000 training and
1,000 dev sentences) within a cap of seconds, ``CAP_SECONDS`` unless ``--seconds`` says. Machines
differ several times over in speed, so it measures before it plans: ``measure`` times a few
training steps at two batch sizes and a batch of dev sentences through the model; ``plan`` then
chooses the batch size, the number of steps and the dev sentences so that training, evaluation
and saving fit in what is left of the cap:

- the whole ``epochs`` (two by default) at batch 32 where they fit, on all 1,000 dev sentences;
- on a slower machine, fewer steps; below ``MIN_STEPS`` at batch 32, batch 16 (nearly twice the
  updates for the same seconds, which is what a short run needs) and the dev sample cut to what
  ``EVAL_SHARE`` of the cap holds, so that a slow CPU still ends with a trained model, its
  learning rate decayed to zero, rather than a few steps into a schedule laid out for more.

``bertlab.train.finetune`` then runs the plan with the rest of the cap as its ``max_seconds``,
so the loop's guard still holds the cap should the machine slow down after the measurement.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the command line reads CAP_SECONDS without loading the training side
    from bertlab.train.finetune import Prepared

CAP_SECONDS = 180.0  # the demo's fine-tuning, measuring and evaluation included
EPOCHS = 2.0  # what a machine fast enough gets: dev accuracy about 0.86
BATCH_SIZES = (32, 16)  # tried in order: the first at which MIN_STEPS fit (else the last)
MIN_STEPS = 150  # fewer updates than this at batch 32: the smaller batch learns more per second
EVAL_SHARE = 0.2  # the most of the seconds left that the dev evaluation may take
MIN_DEV = 200  # dev sentences evaluated however slow the machine (an accuracy worth reading)
ROOM = 0.85  # the share of the training seconds planned: step times drift
SAVE_SECONDS = 2.0  # writing the model and its tokenizer, the curves


@dataclass(frozen=True)
class Speed:
    """What ``measure`` found: a training step costs ``fixed + per_row * rows`` seconds (the
    update, then the rows' forward and backward); a dev sentence ``per_dev`` seconds."""

    fixed: float
    per_row: float
    per_dev: float

    def step(self, rows: int) -> float:
        return self.fixed + self.per_row * rows


@dataclass(frozen=True)
class DemoPlan:
    """The run ``plan`` chose: ``steps`` optimizer steps of ``batch_size`` sentences, scored on
    the first ``dev_examples`` dev sentences; ``full``: the whole epochs asked for fit."""

    batch_size: int
    steps: int
    dev_examples: int
    full: bool
    seconds: float  # what the plan expects training and evaluation to take

    def epochs(self, train_examples: int) -> float:
        """The epochs that make ``FinetuneConfig`` plan exactly ``steps`` steps (it takes the
        ceiling of epochs times the steps of an epoch)."""
        per_epoch = math.ceil(train_examples / self.batch_size)
        return (self.steps - 0.5) / per_epoch


def plan(
    speed: Speed,
    seconds: float,
    train_examples: int = 5000,
    dev_examples: int = 1000,
    epochs: float = EPOCHS,
) -> DemoPlan:
    """The demo's run for a machine of ``speed`` in ``seconds``: see the module docstring."""
    if not seconds > 0:
        raise ValueError(f"the demo's fine-tuning needs seconds > 0, got {seconds}")
    dev = dev_examples
    if speed.per_dev * dev > EVAL_SHARE * seconds:
        held = math.floor(EVAL_SHARE * seconds / speed.per_dev) if speed.per_dev > 0 else dev
        dev = min(dev_examples, max(MIN_DEV, held))
    evaluating = dev * speed.per_dev
    training = max(0.0, seconds - evaluating - SAVE_SECONDS) * ROOM
    for batch in BATCH_SIZES:
        full = math.ceil(epochs * math.ceil(train_examples / batch))
        step = speed.step(batch)
        fits = math.floor(training / step) if step > 0 else full
        if fits >= min(full, MIN_STEPS) or batch == BATCH_SIZES[-1]:
            steps = max(1, min(full, fits))
            return DemoPlan(batch, steps, dev, steps == full, steps * step + evaluating)
    raise AssertionError("unreachable: the last batch size always returns")


def measure(prepared: Prepared, seed: int = 0) -> Speed:
    """Time training steps at the two batch sizes of ``BATCH_SIZES`` (two each, after one that
    pays the one-off costs) on a copy of the model, and dev sentences through it
    (``finetune.evaluation_seconds``). The run's own model and random state are untouched."""
    from bertlab.train import loop
    from bertlab.train.finetune import evaluation_seconds

    model = copy.deepcopy(prepared.model).train()
    optimizer = torch.optim.AdamW(loop.param_groups(model, 0.01), lr=1e-5, fused=True)
    rng = torch.get_rng_state()
    small, large = min(BATCH_SIZES), max(BATCH_SIZES)

    def seconds_a_step(rows: int, steps: int) -> float:
        data = prepared.batches(rows, seed)
        t0 = loop.clock()
        for step in range(steps):
            loss, _ = prepared.task(model, data(step, 0))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (loop.clock() - t0) / steps

    try:
        # one step at each size pays the one-off costs, not timed: the optimizer's state, the
        # kernels chosen for each shape, the memory the larger batch takes from the system
        seconds_a_step(large, 1)
        seconds_a_step(small, 1)
        t_large, t_small = seconds_a_step(large, 2), seconds_a_step(small, 2)
        per_dev = 0.0
        if prepared.dev is not None and prepared.dev.features:
            estimate = evaluation_seconds(prepared.task, model, prepared.dev)  # with its margin
            per_dev = estimate / len(prepared.dev.features)
    finally:
        torch.set_rng_state(rng)
    per_row = max(0.0, (t_large - t_small) / (large - small))
    return Speed(max(0.0, t_small - per_row * small), per_row, per_dev)

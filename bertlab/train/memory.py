"""What one training step holds in memory at its peak, estimated before the first step, and the
refusal of a batch that cannot fit.

    estimate = step_memory(config, parameters, rows=32, seq_len=128, predicted=20)
    check_fits(estimate, "--batch-size 32", "cpu")   # ValueError if it cannot fit

The peak of a step is its tensors: the weights, their gradients, the optimizer's two moments per
weight (AdamW and LAMB alike), what autograd keeps of the forward pass for the backward one
(the activations), and what the backward pass allocates while it runs (the workspace). The
activations grow with the rows and the tokens of a batch and dominate at large batches; they
are counted per token and per layer from what the encoder's layer keeps, measured with
PyTorch's memory tracker on float32 training steps of several shapes (the test
tests/test_train_memory.py holds the estimate to the measured peak):

* 40 H + 8 I bytes a token: about ten H-wide float32 tensors (the layer's input, the query,
  key and value, the attention's context and output, the residual sums and their LayerNorms,
  dropout masks) and two I-wide ones (the feed-forward's product and its activation);
* 12 A S bytes a token: the attention probabilities of the written-out equation, which training
  runs on each sequence's own rows (``attention.packed_attention``): the scores, the
  probabilities and the dropped probabilities, float32, for every head and key. A fused GPU
  kernel keeps less; the estimate then errs on the safe side;
* 16 H bytes a token for the embeddings (their sum, its LayerNorm and dropout);
* the pre-training head: 12 V bytes for every predicted position (its scores over the
  vocabulary, their softmax and its gradient) and 16 H for the transform before it; the
  fine-tuning heads' outputs (a few numbers a token or a row) are left out;
* the workspace: 8 I bytes a token (one layer's feed-forward gradients during the backward).

Every sequence is counted at the full ``seq_len``: the worst batch the run can draw (packed
batches compute real tokens only, so a batch of short sentences takes less). bfloat16 autocast
keeps products in bfloat16 and LayerNorm, softmax and the loss in float32 (0.8 of float32's
activations, measured) and a bfloat16 copy of the weights for the forward pass. Gradient
checkpointing keeps each layer's input (4 H bytes a token a layer) and recomputes one layer at
a time during the backward. On full-length batches the estimate came out 1.1 to 1.2 times the
peak the tracker measured (every part is counted at its largest, together): a bound to refuse
on, not a prediction of the process's resident memory, which adds the interpreter, the
libraries and the data.

What is available: on a GPU, ``torch.cuda.mem_get_info``'s free memory; on the CPU,
``MemAvailable`` in /proc/meminfo (psutil's ``available`` where there is no /proc), less
where a cgroup limit is lower, shared by the processes of the machine (``LOCAL_WORLD_SIZE``
under torchrun). Where none can be read, nothing is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Bytes a token keeps for the backward pass, by what they scale with (float32; see above).
PER_HIDDEN = 40  # x H, per layer
PER_INTERMEDIATE = 8  # x I, per layer
PER_PROBABILITY = 12  # x A x S, per layer
EMBEDDINGS = 16  # x H, once
WORKSPACE = 8  # x I, once
HEAD_SCORES = 12  # x V, per predicted position
HEAD_TRANSFORM = 16  # x H, per predicted position
BF16_ACTIVATIONS = 0.8  # autocast's activations against float32's, measured
OPTIMIZER_MOMENTS = 2  # float32 values per weight: AdamW's and LAMB's first and second moments


@dataclass(frozen=True)
class StepMemory:
    """A training step's peak, by part, in bytes."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # kept for the backward pass, with the backward's own workspace
    rows: int  # sequences in the step's micro-batch (this process's)
    seq_len: int

    @property
    def model(self) -> int:
        """Weights, gradients and optimizer state: what the batch size does not change."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.model + self.activations

    @property
    def per_row(self) -> float:
        """Activation bytes of one sequence."""
        return self.activations / self.rows


def step_memory(
    config: Any,
    parameters: int,
    rows: int,
    seq_len: int,
    *,
    predicted: int = 0,
    precision: str = "float32",
    checkpointing: bool = False,
) -> StepMemory:
    """The peak of one training step of a BERT of ``config`` (a BertConfig: hidden_size,
    intermediate_size, num_attention_heads, num_hidden_layers, vocab_size) with ``parameters``
    float32 weights, on ``rows`` sequences of ``seq_len`` tokens. ``predicted``: positions per
    sequence scored over the vocabulary (pre-training's masked tokens; 0 for fine-tuning);
    ``precision``: "float32" or "bfloat16" (autocast); ``checkpointing``: gradient
    checkpointing of the encoder's layers."""
    H, I = config.hidden_size, config.intermediate_size
    A, L, V = config.num_attention_heads, config.num_hidden_layers, config.vocab_size
    tokens = rows * seq_len
    layer = tokens * (PER_HIDDEN * H + PER_INTERMEDIATE * I + PER_PROBABILITY * A * seq_len)
    # Checkpointing: every layer's input kept, one layer's activations at a time recomputed.
    layers = (L * tokens * 4 * H + layer) if checkpointing else L * layer
    head = rows * predicted * (HEAD_SCORES * V + HEAD_TRANSFORM * H)
    activations = layers + tokens * EMBEDDINGS * H + head
    weights = 4 * parameters
    if precision == "bfloat16":
        activations = round(activations * BF16_ACTIVATIONS)
        weights += 2 * parameters  # autocast's bfloat16 copies, kept through the forward pass
    activations += tokens * WORKSPACE * I
    return StepMemory(
        weights=weights,
        gradients=4 * parameters,
        optimizer=OPTIMIZER_MOMENTS * 4 * parameters,
        activations=activations,
        rows=rows,
        seq_len=seq_len,
    )


# ============================================================================ what there is
def cgroup_room(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes left under this process's cgroup memory limit (v2's memory.max, else v1's
    memory/memory.limit_in_bytes, in ``root``), None where there is no limit to read."""
    for limit, used in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            cap = (root / limit).read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:  # v1 writes "no limit" as a huge number
                return None
            return max(0, int(cap) - int((root / used).read_text()))
        except (OSError, ValueError):
            continue
    return None


def cpu_available() -> int | None:
    """Bytes the machine can still give this process: MemAvailable (psutil's figure where there
    is no /proc), or the room under a lower cgroup limit; None where neither can be read."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            import psutil

            free = int(psutil.virtual_memory().available)
        except ImportError:
            return None
    room = cgroup_room()
    return free if room is None else min(free, room)


def available(device: str) -> tuple[int, str] | None:
    """(bytes one process may use on ``device``, how that was found), or None if unknown."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        return free, f"cuda:{index} has {gib(free)} free"
    if dev.type != "cpu":
        return None
    free = cpu_available()
    if free is None:
        return None
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if processes > 1:
        share = free // processes
        where = f"this machine has {gib(free)} available, {gib(share)} for each of its "
        return share, where + f"{processes} processes"
    return free, f"this machine has {gib(free)} available"


def gib(n: float) -> str:
    """Bytes, in the unit that reads best: "412.3 GiB", "87 MiB"."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"


def check_fits(estimate: StepMemory, option: str, device: str, resident: int = 0) -> StepMemory:
    """Refuse a step that cannot fit on ``device``, before any step runs: ValueError naming
    ``option`` (the setting that chose the batch, e.g. "--batch-size 100000"), the estimate
    and the limit. ``resident``: bytes of the step already held there (the weights of a model
    already built on the CPU), which the free memory no longer counts. Returns ``estimate``."""
    found = available(device)
    if found is None:
        return estimate
    free, where = found
    room = free + resident
    if estimate.total <= room:
        return estimate
    fit = int((room - estimate.model) // estimate.per_row) if room > estimate.model else 0
    fits = "fits" if fit == 1 else "fit"
    advice = (
        f"about {sequences(fit)} of {estimate.seq_len} tokens {fits}" if fit else "not one fits"
    )
    raise ValueError(
        f"{option} needs about {gib(estimate.total)} for a training step (weights, gradients "
        f"and optimizer state {gib(estimate.model)}, activations {gib(estimate.activations)} "
        f"for {sequences(estimate.rows)} of {estimate.seq_len} tokens); {where}: {advice}"
    )


def sequences(n: int) -> str:
    """'1 sequence', '5,333 sequences'."""
    return f"{n:,} sequence{'' if n == 1 else 's'}"

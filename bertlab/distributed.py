"""Many processes (``torchrun``): who this process is, sums over all of them, and the random
state a run saves and restores. A leaf: imports nothing of bertlab, so the data stream, the task
objects and the training loop can all use it."""

from __future__ import annotations

import random
from typing import Any

import torch


def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) unless torch.distributed is initialised."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def sum_over_ranks(values: list[float]) -> list[float]:
    """Each value summed over the ranks (the identity on one process)."""
    if world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(t)
    return t.tolist()


def rng_state() -> dict[str, Any]:
    """Every random generator a run draws from: torch's (CPU and CUDA) and Python's."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

"""Many processes (``torchrun``): who this process is, sums over all of them, the random state a
run saves and restores, and the device a user names. A leaf: imports nothing of bertlab, so the
data stream, the task objects, the training loop, loading and the pipelines can all use it."""

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


Device = int | str | torch.device | None


def as_device(device: Device) -> torch.device:
    """A device as transformers' pipelines and device maps take it: -1 or "cpu" the CPU, 0 (or
    "cuda:0") the first GPU, a torch.device as it is; None the CPU. A GPU this machine does not
    have is refused, naming how many it has."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        found = device
    elif isinstance(device, int) and not isinstance(device, bool):
        if device < -1:
            raise ValueError(f"device {device} is not -1 (the CPU) or a GPU index (0 or more)")
        found = torch.device("cpu" if device == -1 else f"cuda:{device}")
    elif isinstance(device, str):
        try:
            found = torch.device(device)
        except RuntimeError:
            raise ValueError(
                f"device {device!r} is not a device name such as 'cpu', 'cuda' or 'cuda:0'"
            ) from None
    else:
        raise TypeError(f"device must be an int, a str or a torch.device, got {device!r}")
    if found.type == "cuda":
        count = torch.cuda.device_count()
        if found.index is not None and found.index >= count or count == 0:
            raise ValueError(f"device {device!r} asked for, but this machine has {count} CUDA GPUs")
    return found

"""Many processes (``torchrun``): joining them, who this process is, sums over all of them, one
failure stopping every one of them, the random state a run saves and restores, and the device a
user names. A leaf: imports nothing of bertlab, so the data stream, the task objects, the training
loop, loading and the pipelines can all use it."""

from __future__ import annotations

import base64
import os
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch

# How long a process waits in a collective (a sum, a barrier, a checkpoint's plan) for the others
# before it stops with an error, unless the command names another limit.
TIMEOUT_S = 900.0


def launched() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process as one
    of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def restarted() -> int:
    """How many times torchrun has restarted this job after a process failed (its
    ``--max-restarts``); 0 on the first attempt and outside torchrun."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def start(device: str, timeout_s: float = TIMEOUT_S) -> str:
    """Join the processes torchrun started (its environment names the rendezvous, the rank and
    the world size) and return this process's device: ``cuda`` becomes ``cuda:LOCAL_RANK``.
    gloo carries the CPU's tensors and every object, nccl the GPU's; a collective that waits
    longer than ``timeout_s`` for another process raises instead of hanging."""
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if restarted() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store for all its attempts (torch's default since 2.4),
        # where the processes of a restarted job can read the addresses the failed ones
        # published, and fail to connect (pytorch/pytorch#135712). A prefix of the attempt
        # keeps each attempt's keys apart. (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's
        # environment gives each attempt a store of its own instead: docs/guides/cluster.md.)
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = torch.distributed.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, False, timeout
        )
        store = torch.distributed.PrefixStore(f"bertlab/attempt-{restarted()}/", store)
        torch.distributed.init_process_group(
            backend, store=store, rank=rank, world_size=size, timeout=timeout
        )
    else:
        torch.distributed.init_process_group(backend, timeout=timeout)
    return device


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


# The exceptions a failure on one rank is raised as on the others (the command line reports these
# as bad input); any other becomes a RuntimeError.
_RAISED_AS = {
    e.__name__: e
    for e in (
        ValueError,
        IndexError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
    )
}


def agree(error: BaseException | None) -> None:
    """Every rank learns whether any rank failed, and all stop together: a collective that
    every rank reaches, whether its own work raised (``error``) or not. A rank that failed
    raises its own error; the others raise one that names the first rank that failed and its
    message (``rank 1 of 2 stopped: ...``), of the same type when it is one the command line
    reports as bad input. Without it, a rank that fails alone leaves the others waiting in their
    next collective. The identity (``error`` raised, if any) on one process."""
    rank, size = world()
    if size == 1:
        if error is not None:
            raise error
        return
    reports: list[tuple[str, str] | None] = [None] * size
    mine = None if error is None else (type(error).__name__, str(error))
    torch.distributed.all_gather_object(reports, mine)
    if error is not None:
        raise error
    failed = [(r, report) for r, report in enumerate(reports) if report is not None]
    if failed:
        r, (name, message) = failed[0]
        more = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        raise _RAISED_AS.get(name, RuntimeError)(f"rank {r} of {size} stopped{more}: {message}")


@contextmanager
def together() -> Iterator[None]:
    """``with together(): ...``: the block's exception, on any rank, stops every rank as it
    leaves the block (``agree``). Put work that may fail on one rank only (reading its own
    files) in one, before the next collective."""
    error = None
    try:
        yield
    except Exception as e:  # raised again by agree, on this rank and (named) on the others
        error = e
    agree(error)


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


def rng_to_json(state: dict[str, Any]) -> dict[str, Any]:
    """``rng_state()`` as JSON values (a checkpoint's state file): torch's generator states as
    base64 bytes, Python's as its version, its 625 words packed the same way, and its cached
    Gaussian. ``rng_from_json`` reads it back exactly."""
    version, words, gauss = state["python"]
    packed = struct.pack(f"<{len(words)}I", *words)
    out: dict[str, Any] = {
        "torch": base64.b64encode(state["torch"].numpy().tobytes()).decode("ascii"),
        "python": [version, base64.b64encode(packed).decode("ascii"), gauss],
    }
    if "cuda" in state:
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode("ascii") for s in state["cuda"]]
    return out


def rng_from_json(data: dict[str, Any]) -> dict[str, Any]:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()

    version, packed, gauss = data["python"]
    raw = base64.b64decode(packed)
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    state: dict[str, Any] = {"torch": tensor(data["torch"]), "python": (version, words, gauss)}
    if "cuda" in data:
        state["cuda"] = [tensor(s) for s in data["cuda"]]
    return state


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

"""A run folder: its settings (``run.json``), its checkpoints, and the check that a new run does
not overwrite an old one nor a resumed run change its settings. Used by the loop and by
``bertlab pretrain`` and ``bertlab finetune``.

A run keeps its checkpoints in one of two stores, behind one protocol (``Checkpoints``), which
the loop calls: ``save`` what a resume needs, ``load`` the newest one that reads back whole.

- ``FileCheckpoints``: one file, ``checkpoint.pt`` (and the one before it, ``.prev``), written
  by rank 0 with ``torch.save`` and read with ``weights_only=True``. Fine-tuning keeps these.
- ``ShardedCheckpoints``: a folder per checkpoint under ``checkpoints/``, written with
  ``torch.distributed.checkpoint`` (DCP): every rank writes its part of the tensors (DCP gives
  each replicated tensor to one rank, spreading the bytes over them), in the background while
  training goes on (``dcp.async_save``); a JSON file holds the rest (step, time plan, each
  rank's random state). It reads back on any number of processes. Pre-training keeps these.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import shutil
import socket
import threading
import uuid
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from bertlab.distributed import restarted, rng_from_json, rng_to_json, together, world
from bertlab.files import atomic_write

logger = logging.getLogger("bertlab")

CHECKPOINT = "checkpoint.pt"  # FileCheckpoints
CHECKPOINTS = "checkpoints"  # ShardedCheckpoints: one folder per checkpoint in it
RUN_FILE = "run.json"  # the settings of a run folder; --resume must repeat them


# ============================================================================ the run folder
def has_checkpoint(out: Path) -> bool:
    """Whether ``out`` holds a checkpoint of either store that a run could resume from."""
    if (out / CHECKPOINT).exists() or (out / (CHECKPOINT + ".prev")).exists():
        return True
    return bool(ShardedCheckpoints.complete(out / CHECKPOINTS))


class Start(NamedTuple):
    """How a run starts in its folder: ``resume`` its checkpoint, or start afresh, first
    clearing what an earlier run left there (``replace``)."""

    resume: bool
    replace: bool


def check_run_folder(
    out: Path,
    settings: dict[str, Any],
    resume: bool | str,
    overwrite: bool,
    free: tuple[str, ...] = (),
    elastic: bool = False,
) -> Start:
    """Before a run writes anything: a new run needs a folder that holds no run (or
    ``overwrite``); a resumed one needs its checkpoint and the settings in its ``run.json``,
    but for the ``free`` ones (which may change between a run and its resumption).

    ``resume="auto"`` resumes when the folder holds a checkpoint, and otherwise starts the run:
    in an empty folder, or over an attempt of this very run (the same settings) that stopped
    before its first checkpoint. ``elastic``: a process that torchrun restarted after a failure
    (``--max-restarts``) behaves as ``"auto"`` whatever it was asked, so that the job it
    belongs to continues from its last checkpoint, even one that began with ``overwrite``."""
    if resume == "auto" or (elastic and restarted()):
        if has_checkpoint(out):
            resume = True
        else:
            held = _held(out)
            same = (out / RUN_FILE).is_file() and not _changed(out, settings, free)
            if held and not (same or overwrite):
                raise FileExistsError(
                    f"{out} already holds a run ({', '.join(held)}) with other settings and no "
                    "checkpoint: --resume auto does not replace it (--overwrite does)"
                )
            if held:
                logger.warning("%s holds no checkpoint yet: the run starts again", out)
            return Start(False, bool(held))
    if resume:
        if not has_checkpoint(out):
            raise FileNotFoundError(f"--resume: {out} holds no checkpoint to resume from")
        changed = _changed(out, settings, free) if (out / RUN_FILE).is_file() else []
        if changed:
            raise ValueError(f"--resume: these settings differ from the run in {out}: " + changed)
        return Start(True, False)
    held = _held(out)
    if held and not overwrite:
        raise FileExistsError(
            f"{out} already holds a run ({', '.join(held)}): pass --resume to continue it "
            "or --overwrite to replace it"
        )
    return Start(False, bool(held))


def _held(out: Path) -> list[str]:
    names = (RUN_FILE, CHECKPOINT, CHECKPOINTS, "metrics.jsonl", "model")
    return [n for n in names if (out / n).exists()]


def _changed(out: Path, settings: dict[str, Any], free: tuple[str, ...]) -> str:
    """The settings (but the free ones) that differ from the run.json in ``out``, as
    ``key before -> after``; empty when none do."""
    before = json.loads((out / RUN_FILE).read_text("utf-8"))
    keys = sorted(k for k in set(before) | set(settings) if k not in free)
    return ", ".join(
        f"{k} {before.get(k)!r} -> {settings.get(k)!r}"
        for k in keys
        if before.get(k) != settings.get(k)
    )


def saved_world_size(out: Path) -> int | None:
    """The number of processes that last ran the run in ``out`` (its run.json), if known."""
    try:
        return int(json.loads((out / RUN_FILE).read_text("utf-8"))["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_shared_folder(out: Path) -> None:
    """Many processes: every one must see the run folder rank 0 writes in (checkpoints are
    written by all and read by all), so on several machines it must be on a filesystem they
    share. Rank 0 leaves a file there; a rank that cannot see it stops every rank, naming its
    machine. Call it on every rank once the folder exists."""
    rank, size = world()
    if size == 1:
        return
    token = [uuid.uuid4().hex if rank == 0 else None]
    torch.distributed.broadcast_object_list(token)
    probe = out / f".shared-{token[0]}"
    if rank == 0:
        probe.touch()
    torch.distributed.barrier()
    try:
        with together():
            if not probe.exists():
                raise ValueError(
                    f"{out} is not the folder rank 0 writes in: rank {rank} (on "
                    f"{socket.gethostname()}) does not see the file rank 0 left there. The "
                    "processes of a run need its folder on a filesystem they all share (NFS, "
                    "Lustre, ...): each writes its part of every checkpoint there"
                )
    finally:
        if rank == 0:
            probe.unlink(missing_ok=True)


# ============================================================================ the stores
class Checkpoints(Protocol):
    """Where a run keeps what a resume needs. Every rank calls each method.

    ``save(model, optimizer, state, wait)``: the model's and the optimiser's tensors, and
    ``state`` (JSON-able values: the step, the time plan, the random states); returns where it
    goes. ``wait=False`` may write in the background (the next ``save`` or ``close`` waits for
    it); a checkpoint counts only once written whole, so a process killed mid-write resumes from
    the one before. ``load(model, optimizer)``: the newest checkpoint that reads back whole,
    into the model and the optimiser in place; returns where it was and its ``state``, or None
    when there is none (a damaged one is skipped with a warning). ``close()``: wait for a write
    in the background."""

    def save(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, wait: bool
    ) -> Path: ...

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[Path, dict[str, Any]] | None: ...

    def close(self) -> None: ...


class FileCheckpoints:
    """``checkpoint.pt``: everything in one file that rank 0 writes (``torch.save``, then an
    atomic rename; the previous one kept as ``.prev``); read with ``weights_only=True``."""

    def __init__(self, path: Path):
        self.path = path

    def save(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, wait: bool
    ) -> Path:
        if world()[0] == 0:
            full = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **state}
            save_checkpoint(self.path, full)
        return self.path

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[Path, dict[str, Any]] | None:
        state = load_checkpoint(self.path)
        if state is None:
            return None
        model.load_state_dict(state.pop("model"))
        optimizer.load_state_dict(state.pop("optimizer"))
        return self.path, state

    def close(self) -> None:
        pass


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically (temporary file, fsync, rename); the previous one is kept as .prev."""
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    atomic_write(path, lambda p: torch.save(state, p))


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The newest checkpoint that reads back whole; a damaged one is skipped with a warning."""
    for candidate in (path, path.with_name(path.name + ".prev")):
        if not candidate.exists():
            continue
        try:
            # Our own files: optimiser states hold plain Python numbers and tuples as well as
            # tensors, which weights_only allows; nothing else is unpickled.
            return torch.load(candidate, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or corrupted file
            logger.warning("checkpoint %s is damaged (%s); trying the previous one", candidate, e)
    return None


STATE_FILE = "state.json"  # in a sharded checkpoint's folder, written once its tensors are whole
KEPT = 2  # sharded checkpoints kept: the newest and the one before it


class ShardedCheckpoints:
    """``checkpoints/step-00001000/``: a DCP checkpoint (``.metadata``, one ``__R_0.distcp`` per
    rank that wrote tensors) and ``state.json``.

    What is saved: the model's state dict under ``model.``; the optimiser's per-parameter state
    under ``optimizer.<parameter name>.<key>`` (its tensors; its numbers, such as LAMB's step
    count, go to ``state.json``; its hyperparameters are the run's settings, which ``--resume``
    checks); in ``state.json`` the step (the data stream is a function of it), the time plan,
    the training seconds, the world size and each rank's random generators.

    Writing: every rank calls ``dcp.async_save`` (``dcp.save`` where this torch has no
    ``async_save``, or with ``asynchronous=False``) into ``step-N.partial``, on a process group
    of its own so that the background write does not interleave with the training's
    collectives. Its tensors are copied first (DCP's stager), so training goes on while they are
    written. Once every rank's part is written and fsynced (DCP's coordinator then writes
    ``.metadata``), rank 0 writes ``state.json`` and renames the folder to ``step-N``: only a
    renamed folder is a checkpoint. Rank 0 then deletes all but the ``KEPT`` newest.

    Reading: the newest checkpoint that reads back whole (else the one before it, else a
    ``legacy`` one-file checkpoint, which runs of earlier versions wrote), on any number of
    processes (the tensors of a data-parallel run are whole on every
    rank, so each rank reads all of them). Nothing in the files is unpickled beyond DCP's
    metadata classes: the ``.metadata`` file goes through an unpickler that finds only those
    (``_MetadataUnpickler``), tensors are read with ``weights_only=True``, and an entry that is
    not a tensor is refused (``_safe_loading``).
    """

    def __init__(self, folder: Path, asynchronous: bool = True, legacy: Path | None = None):
        self.folder, self.legacy = folder, legacy
        self.rank, self.world_size = world()
        self.asynchronous = asynchronous and hasattr(_dcp(), "async_save")
        if asynchronous and not self.asynchronous and self.rank == 0:
            logger.warning(
                "torch %s has no torch.distributed.checkpoint.async_save: checkpoints are "
                "written synchronously",
                torch.__version__,
            )
        self.pending: Future | None = None  # the write running in the background
        self.failed: Exception | None = None  # what finishing it raised
        self.finished = threading.Event()  # set once rank 0 has finished the last write
        self.group = None
        if self.world_size > 1:  # a group of its own for the writes in the background
            self.group = torch.distributed.new_group(backend="gloo")
        else:  # one process: DCP says at every call that it assumes so (even when told)
            warnings.filterwarnings(
                "ignore", "torch.distributed is (disabled, )?unavailable or uninitialized"
            )
        if self.rank == 0 and folder.is_dir():  # what a kill left (no write is running): a
            # write or a deletion cut short (step-N.partial), or a deletion by a version before
            # _delete renamed first, which may have removed the state file and left the parts
            for stale in folder.glob("step-*"):
                if stale.is_dir() and (
                    stale.name.endswith(".partial") or not (stale / STATE_FILE).is_file()
                ):
                    shutil.rmtree(stale, ignore_errors=True)

    @staticmethod
    def complete(folder: Path) -> list[Path]:
        """The checkpoints written whole in ``folder``, newest first."""
        if not folder.is_dir():
            return []
        found = [
            p
            for p in folder.glob("step-*")
            if p.is_dir() and not p.name.endswith(".partial") and (p / STATE_FILE).is_file()
        ]
        return sorted(found, key=lambda p: p.name, reverse=True)

    # ------------------------------------------------------------------ writing
    def save(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, wait: bool
    ) -> Path:
        self.close()  # one write at a time
        dcp = _dcp()
        tensors, numbers = _optimizer_entries(model, optimizer)
        final = self.folder / f"step-{int(state['step']):08d}"
        partial = final.with_name(final.name + ".partial")  # each rank creates it if need be
        entries = {"model": model.state_dict(), "optimizer": tensors}
        full_state = {
            **{k: v for k, v in state.items() if k != "rng"},
            "rng_ranks": [rng_to_json(r) for r in state["rng_ranks"]],
            "world_size": self.world_size,
            "optimizer_numbers": numbers,
        }
        where = {"checkpoint_id": partial, "process_group": self.group}
        where["no_dist"] = self.world_size == 1
        if self.asynchronous and not wait:
            saved = dcp.async_save(entries, **where)
            # torch returns a Future, or a response whose upload_completion is one
            self.pending = getattr(saved, "upload_completion", saved)
            if self.rank == 0:
                self.finished.clear()
                finish = functools.partial(self._finish, partial, final, full_state)
                self.pending.add_done_callback(finish)
        else:
            dcp.save(entries, **where)
            if self.rank == 0:
                _finish(partial, final, full_state)
            if self.world_size > 1:  # every rank returns once the checkpoint is whole
                torch.distributed.barrier(group=self.group)
        return final

    def _finish(self, partial: Path, final: Path, state: dict, written: Future) -> None:
        """Rank 0, in the writing thread, once the background write is done (a future's
        result can be read before its callbacks have run: ``close`` waits for ``finished``)."""
        try:
            if written.exception() is None:
                _finish(partial, final, state)
        except Exception as e:  # raised by close()
            self.failed = e
        finally:
            self.finished.set()

    def close(self) -> None:
        """Wait for the write in the background, if one is running (on rank 0, until its
        checkpoint counts); raise what it raised."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()
            if self.rank == 0:
                self.finished.wait()
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed

    # ------------------------------------------------------------------ reading
    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[Path, dict[str, Any]] | None:
        for path in self.complete(self.folder):
            try:
                return path, self._load(path, model, optimizer)
            except (KeyboardInterrupt, SystemExit):
                raise
            # Every rank sees the error (DCP's load gathers them), and falls back alike; DCP's
            # CheckpointException is a BaseException.
            except BaseException as e:
                if self.rank == 0:
                    logger.warning(
                        "checkpoint %s is damaged (%s); trying the previous one", path, e
                    )
        if self.legacy is not None:  # a run that an earlier bertlab saved in one file
            return FileCheckpoints(self.legacy).load(model, optimizer)
        return None

    def _load(
        self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        dcp = _dcp()
        state = json.loads((path / STATE_FILE).read_text("utf-8"))
        safe_reader, tensors_only = _safe_loading()
        reader = safe_reader(path)
        stored = reader.read_metadata().state_dict_metadata
        # The optimiser's tensors, allocated from the checkpoint's own shapes and types; the
        # model's go straight into its parameters (DCP loads in place).
        tensors: dict[str, torch.Tensor] = {}
        for key, meta in stored.items():
            if key.startswith("optimizer."):
                if not hasattr(meta, "size"):
                    raise ValueError(f"{key} in {path} is not a tensor")
                tensors[key.removeprefix("optimizer.")] = torch.empty(
                    meta.size, dtype=meta.properties.dtype
                )
        entries = {"model": model.state_dict(), "optimizer": tensors}
        dcp.load(
            entries,
            storage_reader=reader,
            planner=tensors_only(),
            process_group=self.group,
            no_dist=self.world_size == 1,
        )
        model.load_state_dict(entries["model"])
        optimizer.load_state_dict(
            _optimizer_state(model, optimizer, tensors, state.pop("optimizer_numbers", {}))
        )
        state["rng_ranks"] = [rng_from_json(r) for r in state["rng_ranks"]]
        return state


def _dcp() -> Any:
    import torch.distributed.checkpoint as dcp  # on first use: see _safe_loading

    return dcp


def _finish(partial: Path, final: Path, state: dict) -> None:
    """Rank 0, once every rank's part is written: the state file, the rename that makes the
    checkpoint count, and the older ones deleted."""
    atomic_write(partial / STATE_FILE, lambda p: Path(p).write_text(json.dumps(state), "utf-8"))
    if final.exists():  # an earlier attempt's checkpoint of the same step
        shutil.rmtree(final)
    os.replace(partial, final)
    for old in ShardedCheckpoints.complete(final.parent)[KEPT:]:
        _delete(old)


def _delete(checkpoint: Path) -> None:
    """Delete a checkpoint folder: renamed to ``*.partial`` first, so that a process killed
    while it deletes leaves a folder the next start removes, never a ``step-N`` half gone."""
    doomed = checkpoint.with_name(checkpoint.name + ".partial")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(checkpoint, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _parameter_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _optimizer_entries(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, float | int]]:
    """The optimiser's per-parameter state by parameter name: ``{name.key: tensor}`` and its
    plain numbers ``{name.key: number}``."""
    names = _parameter_names(model)
    tensors: dict[str, torch.Tensor] = {}
    numbers: dict[str, float | int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                entry = f"{names[id(p)]}.{key}"
                if torch.is_tensor(value):
                    tensors[entry] = value
                else:
                    numbers[entry] = value
    return tensors, numbers


def _optimizer_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, torch.Tensor],
    numbers: dict[str, float | int],
) -> dict[str, Any]:
    """An ``optimizer.state_dict()`` from the entries ``_optimizer_entries`` made, for this
    optimiser's parameters (``load_state_dict`` moves and casts them as it always does)."""
    by_name: dict[str, dict[str, Any]] = {}
    for entry, value in {**tensors, **numbers}.items():
        name, _, key = entry.rpartition(".")  # an optimiser's keys hold no dots
        by_name.setdefault(name, {})[key] = value
    names = _parameter_names(model)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {i: by_name[names[id(p)]] for i, p in enumerate(params) if names[id(p)] in by_name}
    return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle: this unpickler finds DCP's metadata classes, torch's
    sizes, dtypes and layouts, and nothing else, so a crafted file cannot run code."""

    MODULES = ("torch.distributed.checkpoint.metadata",)
    NAMES = {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module in self.MODULES or (module, name) in self.NAMES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"a checkpoint's metadata refers to {module}.{name}, which is not part of DCP's "
            "metadata: it is not read"
        )


@functools.cache
def _safe_loading() -> tuple[type, type]:
    """DCP's file reader and load planner, made safe (``torch.distributed.checkpoint`` is
    imported here, on first use: it takes over half a second).

    The reader reads ``.metadata`` through ``_MetadataUnpickler``; the planner refuses entries
    that are not tensors, which DCP would read with ``torch.load(weights_only=False)`` (bertlab
    never writes any)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise ValueError(
                f"the checkpoint holds {read_item.dest_index.fqn} as pickled bytes, not a "
                "tensor: bertlab's checkpoints hold tensors only, so it is not read"
            )

    return SafeReader, TensorsOnly

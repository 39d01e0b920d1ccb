"""A run folder: its settings (``run.json``), its checkpoint and the previous one, and the check
that a new run does not overwrite an old one nor a resumed run change its settings. Used by the
loop and by ``bertlab pretrain`` and ``bertlab finetune``."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from bertlab.files import atomic_write

logger = logging.getLogger("bertlab")

CHECKPOINT = "checkpoint.pt"
RUN_FILE = "run.json"  # the settings of a run folder; --resume must repeat them


def check_run_folder(out: Path, settings: dict[str, Any], resume: bool, overwrite: bool) -> None:
    """Before a run writes anything: a new run needs a folder that holds no run (or
    ``overwrite``); a resumed one needs its checkpoint and the settings in its ``run.json``."""
    if resume:
        if not (out / CHECKPOINT).exists() and not (out / (CHECKPOINT + ".prev")).exists():
            raise FileNotFoundError(f"--resume: {out} holds no checkpoint to resume from")
        if (out / RUN_FILE).is_file():
            before = json.loads((out / RUN_FILE).read_text("utf-8"))
            changed = sorted(
                k for k in set(before) | set(settings) if before.get(k) != settings.get(k)
            )
            if changed:
                raise ValueError(
                    f"--resume: these settings differ from the run in {out}: "
                    + ", ".join(f"{k} {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
                )
        return
    held = [n for n in (RUN_FILE, CHECKPOINT, "metrics.jsonl", "model") if (out / n).exists()]
    if held and not overwrite:
        raise FileExistsError(
            f"{out} already holds a run ({', '.join(held)}): pass --resume to continue it "
            "or --overwrite to replace it"
        )


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

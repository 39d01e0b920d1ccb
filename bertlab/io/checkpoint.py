"""Checkpoints: Hugging Face and legacy BERT folders <-> bertlab models.

One explicit key table: a checkpoint key is brought to its canonical spelling (``gamma``/``beta``
-> ``weight``/``bias``, the ``bert.`` prefix removed from backbone keys), then matched to the
model's own keys. Everything is checked (names and shapes) before a single weight is copied; the
model is only returned when the whole load succeeded, so a failed load leaves nothing behind.

Weights are read with safetensors, or with ``torch.load(weights_only=True)`` for
``pytorch_model.bin``: never by unpickling arbitrary objects.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertlab.files import atomic_write, resolve_model_dir
from bertlab.nn.config import BertConfig

logger = logging.getLogger("bertlab")

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_BIN = "pytorch_model.bin"
PT_BIN_INDEX = "pytorch_model.bin.index.json"


# Backbone keys start with one of these (after the "bert." prefix is removed).
_BACKBONE = ("embeddings.", "encoder.", "pooler.")
# Keys that checkpoints carry but that are not weights of their own: buffers, and the MLM
# decoder's weight and bias, which are tied to the word embeddings and to cls.predictions.bias.
_TIED_OR_BUFFERS = (
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "cls.predictions.decoder.weight",
    "cls.predictions.decoder.bias",
)


@dataclass
class LoadingInfo:
    """What a load did with the checkpoint's keys (model key names)."""

    missing_keys: list[str] = field(default_factory=list)  # newly initialised
    unexpected_keys: list[str] = field(default_factory=list)  # in the file, not in the model
    mismatched_keys: list[tuple[str, tuple, tuple]] = field(
        default_factory=list
    )  # key, file, model


# ============================================================================ reading
def read_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a model folder: single file or sharded, safetensors or pytorch_model.bin."""
    d = resolve_model_dir(directory)
    for name, reader in (
        (SAFETENSORS, _read_safetensors),
        (SAFETENSORS_INDEX, _read_sharded),
        (PT_BIN, _read_torch_bin),
        (PT_BIN_INDEX, _read_sharded),
    ):
        if (d / name).is_file():
            return reader(d / name)
    raise FileNotFoundError(
        f"no weights in {d}: expected one of {SAFETENSORS}, {SAFETENSORS_INDEX}, {PT_BIN}, "
        f"{PT_BIN_INDEX}"
    )


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ValueError(f"weights file {path} is truncated or corrupted: {e}") from e


def _read_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path} holds objects other than tensors; bertlab refuses to unpickle them "
            f"(weights_only=True): {e}"
        ) from e
    except Exception as e:  # the unpickler fails on damaged bytes in many different ways
        raise ValueError(f"weights file {path} is truncated or corrupted: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a flat dict of tensors")
    return state


def _read_sharded(index_path: Path) -> dict[str, torch.Tensor]:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index_path} is not a valid shard index: {e}") from e
    reader = _read_safetensors if index_path.name == SAFETENSORS_INDEX else _read_torch_bin
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / shard
        if not shard_path.is_file():
            raise FileNotFoundError(f"shard {shard} listed in {index_path} is missing")
        state.update(reader(shard_path))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise ValueError(f"{index_path} lists tensors no shard holds: {missing[:5]}")
    return state


# ============================================================================ the key table
def canonical_key(key: str) -> str:
    """A checkpoint key in canonical form: backbone keys without the ``bert.`` prefix, LayerNorm
    ``gamma``/``beta`` as ``weight``/``bias`` (the TF-era spelling)."""
    if key.endswith(".gamma"):
        key = key[: -len("gamma")] + "weight"
    elif key.endswith(".beta"):
        key = key[: -len("beta")] + "bias"
    if key.startswith("bert.") and key[len("bert.") :].startswith(_BACKBONE):
        key = key[len("bert.") :]
    return key


def _model_keys(model: torch.nn.Module) -> dict[str, str]:
    """canonical key -> the model's own state-dict key, tied duplicates left out."""
    keys = {}
    for key in model.state_dict():
        if key == "cls.predictions.decoder.weight" and model.config.tie_word_embeddings:
            continue
        keys[canonical_key(key)] = key
    return keys


def match_state_dict(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    ignore_mismatched_sizes: bool = False,
) -> tuple[dict[str, torch.Tensor], LoadingInfo]:
    """Map a checkpoint onto a model's keys. Returns (tensors by model key, what was done).
    Raises ValueError naming every key whose shape differs (unless ignore_mismatched_sizes)."""
    wanted = _model_keys(model)
    own = model.state_dict()
    canon = {canonical_key(k): v for k, v in state.items()}
    # Legacy checkpoints may carry the output bias only as the decoder's bias.
    if "cls.predictions.bias" not in canon and "cls.predictions.decoder.bias" in canon:
        canon["cls.predictions.bias"] = canon["cls.predictions.decoder.bias"]
    found: dict[str, torch.Tensor] = {}
    info = LoadingInfo()
    for ckey, tensor in canon.items():
        if ckey in wanted:
            key = wanted[ckey]
            if tuple(tensor.shape) != tuple(own[key].shape):
                info.mismatched_keys.append((key, tuple(tensor.shape), tuple(own[key].shape)))
            else:
                found[key] = tensor
        elif ckey not in _TIED_OR_BUFFERS:
            info.unexpected_keys.append(ckey)
    info.missing_keys = sorted(set(wanted.values()) - set(found))
    if info.mismatched_keys and not ignore_mismatched_sizes:
        lines = "\n".join(
            f"  {k}: checkpoint {list(a)}, model {list(b)}" for k, a, b in info.mismatched_keys
        )
        raise ValueError(
            "checkpoint shapes do not match the model (pass ignore_mismatched_sizes=True to "
            f"initialise these afresh):\n{lines}"
        )
    return found, info


# ============================================================================ load / save
def load_pretrained(
    cls: type,
    path: str | os.PathLike,
    *,
    attn_implementation: str | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    output_loading_info: bool = False,
    config: BertConfig | None = None,
    **config_overrides: Any,
):
    """Build ``cls`` from a model folder and load its weights.

    A base model's weights load into a task model (the new head is initialised and reported)
    and a task model's into a base model (the head's weights are reported as unused). With
    ``strict=True`` any missing or unexpected key is an error instead.
    ``config_overrides`` (e.g. ``num_labels=3``) change the stored config.
    """
    directory = resolve_model_dir(path)
    if attn_implementation is not None:
        config_overrides["attn_implementation"] = attn_implementation
    if config is None:
        config = BertConfig.from_json_file(directory / "config.json", **config_overrides)
    elif config_overrides:
        config = config.replace(**config_overrides)
    state = read_state_dict(directory)  # fails before any model is built
    model = cls(config)
    found, info = match_state_dict(model, state, ignore_mismatched_sizes)
    if strict and (info.missing_keys or info.unexpected_keys):
        raise ValueError(
            f"strict load of {directory} into {cls.__name__}: missing {info.missing_keys}, "
            f"unexpected {info.unexpected_keys}"
        )
    with torch.no_grad():
        own = model.state_dict()
        for key, tensor in found.items():
            own[key].copy_(tensor)
    if dtype is not None:
        model.to(dtype)
    reports = (
        ("weights not in the folder, newly initialised (train before use)", info.missing_keys),
        ("weights in the folder that the model does not use", info.unexpected_keys),
        ("weights of another shape, newly initialised", [k for k, _, _ in info.mismatched_keys]),
    )
    for what, keys in reports:
        if keys:
            logger.warning("%s from %s: %s: %s", cls.__name__, directory, what, ", ".join(keys))
    model.eval()
    return (model, info) if output_loading_info else model


def save_pretrained(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Write ``config.json`` and ``model.safetensors``, each atomically (temp file + rename)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    config = model.config.replace(architectures=(type(model).__name__,))
    keep = set(_model_keys(model).values())
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if k in keep}
    atomic_write(d / SAFETENSORS, lambda p: save_file(state, p, metadata={"format": "pt"}))
    atomic_write(d / "config.json", config.to_json_file)

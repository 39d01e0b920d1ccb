"""Checkpoints: Hugging Face and legacy BERT folders <-> bertlab models.

One explicit key table: a checkpoint key is brought to its canonical spelling (``gamma``/``beta``
-> ``weight``/``bias``, the ``bert.`` prefix removed from backbone keys), then matched to the
model's own keys. Everything is checked (names and shapes) before a single weight is copied; the
model is only returned when the whole load succeeded, so a failed load leaves nothing behind.

Weights are read with safetensors, or with ``torch.load(weights_only=True)`` for
``pytorch_model.bin``: never by unpickling arbitrary objects.
"""

from __future__ import annotations

import inspect
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

from bertlab.distributed import as_device
from bertlab.files import HUB_KEYWORDS, atomic_write, resolve_model_dir
from bertlab.io import tf_checkpoint
from bertlab.nn.config import BertConfig, as_dtype, read_config_dict

logger = logging.getLogger("bertlab")

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_BIN = "pytorch_model.bin"
PT_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PT_BIN, PT_BIN_INDEX)


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
    error_msgs: list[str] = field(default_factory=list)  # always empty: a failed load raises

    def __getitem__(self, key: str) -> list:
        """Read as the dict transformers returns (``info["missing_keys"]``)."""
        return getattr(self, key)

    def keys(self) -> list[str]:
        return ["missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"]


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
    """canonical key -> the model's own state-dict key (a tied decoder weight is not one:
    nn/surface.py leaves it out of the state dict)."""
    return {canonical_key(key): key for key in model.state_dict()}


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


def copy_weights(model: torch.nn.Module, found: dict[str, torch.Tensor]) -> None:
    """Copy matched tensors (``match_state_dict``'s first result) into the model's own."""
    with torch.no_grad():
        own = model.state_dict()
        for key, tensor in found.items():
            own[key].copy_(tensor)


# ============================================================================ load / save
def load_pretrained(
    cls: type,
    path: str | os.PathLike,
    *model_args: Any,
    config: BertConfig | str | os.PathLike | None = None,
    dtype: torch.dtype | str | None = None,
    torch_dtype: torch.dtype | str | None = None,
    attn_implementation: str | None = None,
    device_map: Any = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    strict: bool = False,
    ignore_mismatched_sizes: bool = False,
    output_loading_info: bool = False,
    **kwargs: Any,
):
    """Build ``cls`` from a model folder and load its weights, with transformers' keywords.

    ``path``: a folder (Hugging Face or bertlab: config.json + safetensors / pytorch_model.bin;
    or an original TensorFlow checkpoint with bert_config.json), the bundled default's name, or
    a name in the local Hugging Face cache (``cache_dir``, ``revision``, ``subfolder`` say
    where; the other hub keywords are accepted and do nothing: nothing is downloaded, and none
    is written into the config).
    ``dtype`` / ``torch_dtype``: a torch dtype, its name ("bfloat16"), or "auto" (the default,
    as in transformers: the config's dtype, else that of the stored weights).
    Any other keyword that names a config attribute (``num_labels``, ``id2label``,
    ``output_hidden_states`` ...) overrides it; ``add_pooling_layer`` goes to ``BertModel``.

    A base model's weights load into a task model (the new head is initialised and reported)
    and a task model's into a base model (the head's weights are reported as unused). With
    ``strict=True`` any missing or unexpected key is an error instead. The model is returned in
    eval mode, and only when the whole load succeeded.
    """
    if model_args:
        raise TypeError(
            f"{cls.__name__}.from_pretrained takes the folder as its only positional argument; "
            f"got {len(model_args)} more"
        )
    hub = {k: kwargs.pop(k) for k in list(kwargs) if k in HUB_KEYWORDS}
    init_kwargs = {}
    if "add_pooling_layer" in kwargs:
        if "add_pooling_layer" not in inspect.signature(cls.__init__).parameters:
            raise TypeError(
                f"add_pooling_layer is a keyword of BertModel, not of {cls.__name__} (whose "
                "heads decide whether they have a pooler)"
            )
        init_kwargs["add_pooling_layer"] = bool(kwargs.pop("add_pooling_layer"))
    source = Path(path)
    if not source.is_dir() and tf_checkpoint.is_tf_checkpoint(source):
        directory = source.parent  # a checkpoint prefix such as .../bert_model.ckpt
    else:
        directory = source = resolve_model_dir(path, **hub)
    tf = None
    has_weights = any((directory / name).is_file() for name in WEIGHT_FILES)
    if state_dict is None and not has_weights and tf_checkpoint.is_tf_checkpoint(source):
        # TensorFlow's files, read without it; variables bertlab does not map are reported
        # below as unused, by name, like any other unexpected weight
        tf = tf_checkpoint.read_tf_checkpoint(source, strict=False)
        state_dict = tf.state_dict
    config = _config_for(directory, config, tf, attn_implementation, kwargs)
    state = read_state_dict(directory) if state_dict is None else state_dict
    wanted = _resolve_dtype(dtype, torch_dtype, config, state)
    device = _resolve_device_map(device_map)
    config.dtype = wanted
    config.name_or_path = str(path)
    model = cls(config, **init_kwargs)
    found, info = match_state_dict(model, state, ignore_mismatched_sizes)
    if tf is not None:
        info.unexpected_keys += tf.unmapped
        if tf.skipped:
            logger.info("%s: skipped %d optimizer variables", directory, len(tf.skipped))
    if strict and (info.missing_keys or info.unexpected_keys):
        raise ValueError(
            f"strict load of {directory} into {cls.__name__}: missing {info.missing_keys}, "
            f"unexpected {info.unexpected_keys}"
        )
    copy_weights(model, found)
    if wanted != torch.float32 or device is not None:
        model.to(device=device, dtype=wanted)
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


def _config_for(
    directory: Path,
    config: BertConfig | str | os.PathLike | None,
    tf: Any,
    attn_implementation: str | None,
    overrides: dict[str, Any],
) -> BertConfig:
    """The config a load builds: the folder's (or the one given, copied), with the keyword
    overrides applied. A keyword that is not an attribute of the config is refused by name."""
    if config is None:
        data = tf.config if tf is not None else read_config_dict(directory)
        config = BertConfig.from_dict(data)
    elif isinstance(config, BertConfig):
        config = config.replace()
    else:
        config = BertConfig.from_pretrained(config)
    if attn_implementation is not None:
        overrides["attn_implementation"] = attn_implementation
    unknown = [k for k in overrides if not hasattr(config, k)]
    if unknown:
        raise TypeError(
            f"from_pretrained got an unexpected keyword argument {unknown[0]!r}: it is not an "
            "attribute of the config (which keywords override), not add_pooling_layer, dtype, "
            "torch_dtype, device_map, state_dict, strict, ignore_mismatched_sizes or "
            f"output_loading_info, and not a hub keyword ({', '.join(sorted(HUB_KEYWORDS))})"
        )
    labels = {k: overrides.pop(k) for k in ("id2label", "label2id") if k in overrides}
    config.update(labels)  # names first, so that a num_labels beside them is checked against them
    config.update(overrides)
    config.validate()
    return config


def _resolve_dtype(
    dtype: torch.dtype | str | None,
    torch_dtype: torch.dtype | str | None,
    config: BertConfig,
    state: dict[str, torch.Tensor],
) -> torch.dtype:
    """from_pretrained's dtype (or its older name torch_dtype): a floating-point torch dtype,
    its name, or "auto" / None: the config's dtype, else that of the stored weights."""
    if dtype is not None and torch_dtype is not None and dtype != torch_dtype:
        raise ValueError(f"dtype={dtype!r} and torch_dtype={torch_dtype!r} disagree; give one")
    value = dtype if dtype is not None else torch_dtype
    if value is None or value == "auto":
        stored = (t.dtype for t in state.values() if t.is_floating_point())
        value = config.dtype or next(stored, torch.float32)
    found = as_dtype(value)
    if not found.is_floating_point:
        raise ValueError(
            f"dtype {value!r} is not a floating-point dtype; give float32, bfloat16, float16, "
            "float64 (a torch.dtype or its name) or 'auto'"
        )
    return found


def _resolve_device_map(device_map: Any) -> torch.device | None:
    """device_map as transformers takes it, for a model that lives on one device: a device, its
    name or index, "auto" (the GPU when there is one), or {"": device}."""
    if isinstance(device_map, dict):
        if set(device_map) != {""}:
            raise ValueError(
                f"device_map {device_map!r} splits the model; bertlab loads a model onto one "
                "device: give a device, 'auto', or {'': device}"
            )
        device_map = device_map[""]
    if device_map is None:
        return None
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return as_device(device_map)


def save_pretrained(
    model: torch.nn.Module,
    directory: str | os.PathLike,
    state_dict: dict[str, torch.Tensor] | None = None,
    safe_serialization: bool = True,
    is_main_process: bool = True,
    push_to_hub: bool = False,
    **kwargs: Any,
) -> None:
    """Write ``config.json`` and ``model.safetensors`` (``pytorch_model.bin`` with
    ``safe_serialization=False``), each atomically (temp file + rename). ``state_dict``: the
    tensors to write instead of the model's own. Other keywords of transformers'
    save_pretrained (``max_shard_size``, ...) are accepted; everything is one file."""
    if push_to_hub:
        raise ValueError("push_to_hub=True: bertlab never uploads; it writes the folder only")
    if not is_main_process:
        return
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    config = model.config.replace(architectures=(type(model).__name__,))  # validated: no file yet
    config.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    keep = set(_model_keys(model).values())
    source = model.state_dict() if state_dict is None else state_dict
    state = {k: v.detach().contiguous().cpu() for k, v in source.items() if k in keep}
    if safe_serialization:
        atomic_write(d / SAFETENSORS, lambda p: save_file(state, p, metadata={"format": "pt"}))
        stale = PT_BIN
    else:
        atomic_write(d / PT_BIN, lambda p: torch.save(state, p))
        stale = SAFETENSORS
    (d / stale).unlink(missing_ok=True)  # a file of the other format would be read first
    atomic_write(d / "config.json", config.to_json_file)

"""Google's original TensorFlow BERT checkpoints -> Hugging Face names and config, without
TensorFlow.

The original releases (the BERT zips, the 24 compact models, BioBERT v1.0 ...) are a folder with
``bert_config.json``, ``vocab.txt`` and a TensorFlow checkpoint (``bert_model.ckpt.index`` +
``.data-*``), read by ``tf_bundle.py``. This module maps the variables to the Hugging Face names
that bertlab's key table (``checkpoint.py``) reads, checks them against ``bert_config.json``, and
converts a folder (``convert_tf_checkpoint``, the ``bertlab convert`` command).

Variable names are mapped by one table (``hf_name``): dense ``kernel`` -> ``weight`` transposed
(the original code computes ``x @ kernel``, a ``torch.nn.Linear`` holds ``kernel.T``),
LayerNorm ``gamma``/``beta`` -> ``weight``/``bias``, ``layer_N`` -> ``layer.N``,
``cls/predictions/output_bias`` -> ``cls.predictions.bias``, ``cls/seq_relationship/
output_weights`` -> ``cls.seq_relationship.weight`` (already (2, H): not transposed).
Optimiser state (Adam and LAMB slots, ``global_step``, ``beta1_power`` ...) is skipped and
counted; any other variable is reported by name, and refused unless ``strict=False``.

It imports ``nn/`` (the config and the models), the tokenizer and the leaves; never TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertlab.io.tf_bundle import (
    DTYPES,
    TFEntry,
    check_shards,
    check_whole,
    crc32c,
    find_prefix,
    is_tf_checkpoint,
    read_index,
    read_tensor,
    read_tf_variables,
)
from bertlab.nn.config import NETWORK_FIELDS, BertConfig

__all__ = [
    "TFCheckpoint",
    "crc32c",
    "is_tf_checkpoint",
    "read_tf_checkpoint",
    "read_tf_variables",
]

BERT_CONFIG = "bert_config.json"
VOCAB = "vocab.txt"


# ============================================================================ names and shapes
# Optimiser state, skipped: the last part of the name, or the whole name.
_OPTIMIZER_LEAVES = {
    "adam_m",
    "adam_v",
    "lamb_m",
    "lamb_v",
    "Adam",
    "Adam_1",
    "AdamWeightDecayOptimizer",
    "AdamWeightDecayOptimizer_1",
    "BERTAdam",
    "BERTAdam_1",
    "LAMB",
    "LAMB_1",
    "Momentum",
}
_OPTIMIZER_NAMES = {"global_step", "loss_scale", "good_steps", "current_loss_scale"}


def is_optimizer_variable(name: str) -> bool:
    """Optimiser state rather than a weight: Adam/LAMB slots (``.../adam_m``, ``.../Adam_1``,
    ``.../AdamWeightDecayOptimizer``), ``global_step``, ``beta1_power`` and ``beta2_power``,
    loss-scaling counters."""
    leaf = name.rsplit("/", 1)[-1]
    return leaf in _OPTIMIZER_LEAVES or name in _OPTIMIZER_NAMES or leaf.endswith("_power")


_EMBEDDINGS = {"word_embeddings", "position_embeddings", "token_type_embeddings"}
_LAYER_MODULES = {
    "attention/self/query": "dense",
    "attention/self/key": "dense",
    "attention/self/value": "dense",
    "attention/output/dense": "dense",
    "attention/output/LayerNorm": "norm",
    "intermediate/dense": "dense",
    "output/dense": "dense",
    "output/LayerNorm": "norm",
}
_MODULES = {
    "bert/embeddings/LayerNorm": "norm",
    "bert/pooler/dense": "dense",
    "cls/predictions/transform/dense": "dense",
    "cls/predictions/transform/LayerNorm": "norm",
}
_LEAVES = {
    "dense": {"kernel": "weight", "bias": "bias"},
    "norm": {"gamma": "weight", "beta": "bias"},
}
_HEAD_NAMES = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
}


def hf_name(name: str) -> tuple[str, bool] | None:
    """The Hugging Face name of an original BERT variable and whether it is transposed (every
    dense ``kernel``), or None for a variable bertlab does not map."""
    if name in _HEAD_NAMES:
        return _HEAD_NAMES[name], False
    if name.startswith("bert/embeddings/") and name.rsplit("/", 1)[1] in _EMBEDDINGS:
        if name.count("/") == 2:
            return f"{name.replace('/', '.')}.weight", False
    module, _, leaf = name.rpartition("/")
    kind = _MODULES.get(module)
    target = module
    m = re.fullmatch(r"bert/encoder/layer_(\d+)/(.+)", module)
    if m and m.group(2) in _LAYER_MODULES:
        kind = _LAYER_MODULES[m.group(2)]
        target = f"bert/encoder/layer/{int(m.group(1))}/{m.group(2)}"
    if kind is None or leaf not in _LEAVES[kind]:
        return None
    return f"{target.replace('/', '.')}.{_LEAVES[kind][leaf]}", leaf == "kernel"


def expected_shape(hf: str, config: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """The shape ``config`` implies for a mapped (Hugging Face) name, and the config keys that
    give it (for the error message)."""
    V, H, I = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    if hf.endswith("word_embeddings.weight"):
        return (V, H), "vocab_size, hidden_size"
    if hf.endswith("position_embeddings.weight"):
        return (config["max_position_embeddings"], H), "max_position_embeddings, hidden_size"
    if hf.endswith("token_type_embeddings.weight"):
        return (config["type_vocab_size"], H), "type_vocab_size, hidden_size"
    if hf == "cls.predictions.bias":
        return (V,), "vocab_size"
    if hf.startswith("cls.seq_relationship."):
        return ((2, H) if hf.endswith("weight") else (2,)), "hidden_size"
    if ".intermediate.dense." in hf:
        return ((I, H) if hf.endswith("weight") else (I,)), "intermediate_size, hidden_size"
    if re.search(r"layer\.\d+\.output\.dense\.weight$", hf):
        return (H, I), "hidden_size, intermediate_size"
    if hf.endswith("weight") and "LayerNorm" not in hf:
        return (H, H), "hidden_size"
    return (H,), "hidden_size"


def required_names(config: dict[str, Any]) -> list[str]:
    """The backbone's Hugging Face names for ``config`` (the heads are optional)."""
    names = [f"bert.embeddings.{e}.weight" for e in sorted(_EMBEDDINGS)]
    names += ["bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"]
    for n in range(config["num_hidden_layers"]):
        for module in _LAYER_MODULES:
            names += [
                f"bert.encoder.layer.{n}.{module.replace('/', '.')}.{w}" for w in ("weight", "bias")
            ]
    return names + ["bert.pooler.dense.weight", "bert.pooler.dense.bias"]


# The keys of Google's bert_config.json: the network's fields up to initializer_range.
_CONFIG_KEYS = NETWORK_FIELDS[: NETWORK_FIELDS.index("initializer_range") + 1]


def hf_config(bert_config: dict[str, Any], path: Path) -> dict[str, Any]:
    """A ``bert_config.json`` in the Hugging Face ``config.json`` form: the same keys as
    transformers' BertConfig (``model_type`` "bert", ``layer_norm_eps`` 1e-12 as the original
    LayerNorm, ``pad_token_id`` 0, the MLM decoder tied to the word embeddings ...), with every
    key of the file as written (its other keys kept too). So ``hidden_act`` stays ``"gelu"``:
    the exact GELU, the one the released checkpoints were trained with."""
    if not isinstance(bert_config, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    missing = [k for k in _CONFIG_KEYS if k not in bert_config]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    config = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        **{k: bert_config[k] for k in _CONFIG_KEYS},
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "use_cache": True,
        "classifier_dropout": None,
        "is_decoder": False,
        "add_cross_attention": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "tie_word_embeddings": True,
    }
    config.update(bert_config)
    try:
        BertConfig.from_dict(config)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from e
    return config


# ============================================================================ the checkpoint
@dataclass
class TFCheckpoint:
    """An original BERT checkpoint read into Hugging Face form.

    ``config``: the ``config.json`` dict (``BertConfig.from_dict(config)`` builds the model);
    ``state_dict``: tensors under Hugging Face names (``bert.embeddings.word_embeddings.weight``,
    ``cls.predictions.bias`` ...), dtype as stored; ``skipped``: the optimiser variables left
    out (TensorFlow names); ``unmapped``: other variables bertlab does not map (TensorFlow names;
    empty unless read with ``strict=False``); ``vocab_file``: the folder's ``vocab.txt`` or None;
    ``prefix``: the checkpoint prefix read. ``config["architectures"]`` names the class the
    weights fill: BertForPreTraining (both pre-training heads), BertForMaskedLM (the masked-LM
    head only) or BertModel."""

    config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    prefix: Path
    vocab_file: Path | None = None
    skipped: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)


def read_tf_checkpoint(
    path: str | os.PathLike, *, strict: bool = True, config_file: str | os.PathLike | None = None
) -> TFCheckpoint:
    """Read an original BERT TensorFlow checkpoint: a folder (with one ``*.index``), an
    ``.index`` file or a prefix such as ``.../bert_model.ckpt``; ``bert_config.json`` beside it
    (or ``config_file``).

    Everything is checked before a tensor is returned: the index (magic number, block
    checksums), the shards (all present), every mapped variable (whole, a supported dtype, the
    shape ``bert_config.json`` implies, every backbone weight present), then each tensor's
    bytes and checksum as it is read. Optimiser state is skipped (``.skipped``). A variable that
    bertlab does not map raises ValueError naming it; with ``strict=False`` it is listed in
    ``.unmapped`` instead and not read.
    """
    prefix = find_prefix(path)
    config_path = Path(config_file) if config_file else prefix.parent / BERT_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(
            f"no {BERT_CONFIG} beside the checkpoint {prefix} (looked for {config_path}): the "
            "sizes of the network are not in the checkpoint itself"
        )
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path} is not valid JSON: {e}") from e
    config = hf_config(raw, config_path)
    header, entries = read_index(Path(f"{prefix}.index"))
    num_shards = check_shards(prefix, header)

    skipped, unmapped = [], []
    mapped: dict[str, tuple[str, bool, TFEntry]] = {}
    for name, entry in entries.items():
        if name.startswith("\x00"):  # the slices of a partitioned variable, named below
            continue
        if is_optimizer_variable(name):
            skipped.append(name)
            continue
        check_whole(prefix, name, entry)
        target = hf_name(name)
        if target is None:
            unmapped.append(name)
        else:
            mapped[name] = (*target, entry)
    if unmapped and strict:
        raise ValueError(
            f"{prefix}.index holds variables bertlab does not map: {', '.join(unmapped)} "
            "(strict=False, or bertlab convert --skip-unmapped, reads the rest and lists them)"
        )
    _check_shapes(prefix, config, mapped, config_path)

    state: dict[str, torch.Tensor] = {}
    shards: dict[int, Any] = {}
    try:
        for name, (hf, transpose, entry) in mapped.items():
            tensor = read_tensor(prefix, name, entry, num_shards, shards)
            state[hf] = tensor.t().contiguous() if transpose else tensor
    finally:
        for f in shards.values():
            f.close()
    heads = {k.split(".")[1] for k in state if k.startswith("cls.")}
    if heads != {"predictions", "seq_relationship"}:
        config["architectures"] = ["BertForMaskedLM" if heads == {"predictions"} else "BertModel"]
    vocab = prefix.parent / VOCAB
    return TFCheckpoint(
        config=config,
        state_dict=state,
        prefix=prefix,
        vocab_file=vocab if vocab.is_file() else None,
        skipped=skipped,
        unmapped=unmapped,
    )


def _check_shapes(
    prefix: Path,
    config: dict[str, Any],
    mapped: dict[str, tuple[str, bool, TFEntry]],
    config_path: Path,
) -> None:
    """Every mapped variable has the shape and dtype ``config`` implies; no backbone weight is
    missing; no layer beyond ``num_hidden_layers``."""
    layers = config["num_hidden_layers"]
    for name, (hf, transpose, entry) in mapped.items():
        m = re.match(r"bert\.encoder\.layer\.(\d+)\.", hf)
        if m and int(m.group(1)) >= layers:
            raise ValueError(
                f"variable {name} in {prefix}.index belongs to layer {m.group(1)}, but "
                f"{config_path.name} has num_hidden_layers {layers}"
            )
        want, keys = expected_shape(hf, config)
        if transpose:
            want = want[::-1]
        if tuple(entry.shape) != want:
            names = keys.split(", ")[: len(want)]  # a bias: the first size only
            values = ", ".join(f"{k} {config[k]}" for k in names)
            raise ValueError(
                f"variable {name} in {prefix}.index has shape {list(entry.shape)}, but "
                f"{config_path.name} ({values}) implies {list(want)}"
            )
        if entry.dtype not in DTYPES or DTYPES[entry.dtype][1] not in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.float64,
        ):
            raise ValueError(
                f"variable {name} in {prefix}.index has dtype {entry.dtype_name}; bertlab reads "
                "weights in float32, float16, bfloat16 or float64"
            )
    have = {hf for hf, _, _ in mapped.values()}
    missing = [n for n in required_names(config) if n not in have]
    if missing:
        raise ValueError(
            f"{prefix}.index lacks {len(missing)} weight(s) that {config_path.name} requires: "
            + ", ".join(missing[:8])
            + (" ..." if len(missing) > 8 else "")
        )

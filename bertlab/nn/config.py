"""BertConfig: the hyper-parameters of a BERT network, validated, and read from / written to the
Hugging Face ``config.json`` layout.

The defaults are bert-base-uncased (L=12, H=768, A=12, vocabulary 30522), the sizes that
../shared/reference/004 calls T, A, L, H, FFD, S and P. Presets give the published sizes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertlab.files import HUB_KEYWORDS, resolve_model_dir
from bertlab.nn.activations import ACTIVATIONS

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "packed")
POSITION_INITS = ("normal", "sinusoidal")

# (layers, hidden, heads). Intermediate size is 4*hidden and heads hidden/64 in the published
# compact models (Turc et al. 2019); base and large are the original paper's sizes.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# What a forward returns when the call does not say, and attributes every transformers config
# carries. They are attributes like the rest; config.json holds them only when not the default.
RUNTIME_DEFAULTS: dict[str, Any] = {
    "output_hidden_states": False,
    "output_attentions": False,
    "return_dict": True,
    "dtype": None,  # the dtype the weights were saved in (torch.float32 ...; its name in json)
    "use_cache": True,  # no effect on an encoder; Trainer and PEFT set it
    "is_decoder": False,  # bertlab is the encoder: True is refused
    "add_cross_attention": False,  # refused when True, as is_decoder
    "chunk_size_feed_forward": 0,  # no effect on results (bertlab chunks on its own)
    "bos_token_id": None,
    "eos_token_id": None,
    "tokenizer_class": None,
    "finetuning_task": None,
}

# Keys of a config.json that describe the file or the library, not the network: dropped on
# read, regenerated on write.
_FILE_KEYS = {"transformers_version", "_name_or_path", "model_type", "_attn_implementation"}

# The network's hyper-parameters, in the order of the constructor and of config.json.
NETWORK_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "tie_word_embeddings",
    "problem_type",
    "position_init",
)
# Every attribute bertlab reads; the others are a config's ``extra``, kept and written back.
_KNOWN = frozenset(
    {*NETWORK_FIELDS, *RUNTIME_DEFAULTS, "attn_implementation", "architectures"}
    | {"id2label", "label2id"}
)
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


class BertConfig:
    """Hyper-parameters of a BERT network. Defaults are bert-base-uncased.

    Attribute names and behaviour are those of transformers' BertConfig, so code and files move
    both ways unchanged: it is mutable (``config.num_labels = 5`` renames the labels
    ``LABEL_0..4``), keys bertlab does not know are kept as attributes and written back, and
    ``to_dict`` / ``to_json_string`` / ``update`` work as there. Values are checked when the
    config is built or read, before a model's forward after a change, and before it is saved
    (``validate``): a bad value is named with its limit.
    """

    model_type = "bert"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        classifier_dropout: float | None = None,
        tie_word_embeddings: bool = True,
        # Task heads: problem_type as in transformers ("regression",
        # "single_label_classification", "multi_label_classification" or None = infer).
        problem_type: str | None = None,
        # bertlab option (harmless to transformers in config.json): "normal" (as BERT) or
        # "sinusoidal" (the fixed encoding of Vaswani et al. as the learned table's starting
        # point, reference 003). Only affects initialisation.
        position_init: str = "normal",
        # Attention kernel: "packed" (the default: padding removed after the embeddings, every
        # layer on real tokens only), "sdpa" (scaled_dot_product_attention on the padded batch)
        # or "eager" (explicit, can return probabilities). A runtime choice: not saved.
        attn_implementation: str = "packed",
        architectures: list[str] | tuple[str, ...] | None = None,
        num_labels: int | None = None,
        id2label: dict[int, str] | None = None,
        label2id: dict[str, int] | None = None,
        **kwargs: Any,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.pad_token_id = pad_token_id
        self.classifier_dropout = classifier_dropout
        self.tie_word_embeddings = tie_word_embeddings
        self.problem_type = problem_type
        self.position_init = position_init
        self.attn_implementation = kwargs.pop("_attn_implementation", None) or attn_implementation
        self.architectures = list(architectures) if architectures is not None else None
        if "torch_dtype" in kwargs:  # the older name of dtype
            kwargs.setdefault("dtype", kwargs.pop("torch_dtype"))
        for name, default in RUNTIME_DEFAULTS.items():
            setattr(self, name, kwargs.pop(name, default))
        self._set_labels(num_labels, id2label, label2id)
        for key in _FILE_KEYS:
            kwargs.pop(key, None)
        kwargs.update(kwargs.pop("extra", None) or {})  # bertlab's earlier way to pass them
        for key, value in kwargs.items():  # keys bertlab does not use: kept and written back
            setattr(self, key, value)
        self.validate()

    def _set_labels(self, num_labels: int | None, id2label: dict | None, label2id: dict | None):
        if id2label is None and label2id is not None:
            id2label = {int(i): name for name, i in label2id.items()}
        if id2label is not None:
            id2label = {int(k): str(v) for k, v in id2label.items()}  # keys checked by validate
            if num_labels is not None and num_labels != len(id2label):
                raise ValueError(
                    f"BertConfig: num_labels={num_labels} disagrees with the {len(id2label)} "
                    f"names in id2label {id2label}"
                )
            self.id2label = id2label
        else:
            self.num_labels = 2 if num_labels is None else num_labels
        if label2id is not None:
            self.label2id = {str(k): int(v) for k, v in label2id.items()}

    # ----------------------------------------------------------------------------- attributes
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "torch_dtype":
            name = "dtype"
        if name == "dtype":
            value = as_dtype(value)
        if name == "id2label" and value is not None:
            value = {int(k): v for k, v in value.items()}
            self.__dict__.pop("label2id", None)  # follows the new names unless set after
        object.__setattr__(self, name, value)  # a property (num_labels, ...) runs its setter
        self.__dict__["_checked"] = False  # validated again before the next forward

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @num_labels.setter
    def num_labels(self, n: int) -> None:
        """A new label count names the labels LABEL_0..n-1, as in transformers."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"BertConfig.num_labels must be a positive integer, got {n!r}")
        if self.__dict__.get("id2label") is None or len(self.id2label) != n:
            self.id2label = {i: f"LABEL_{i}" for i in range(n)}

    @property
    def label2id(self) -> dict[str, int]:
        return self.__dict__.get("label2id") or {v: k for k, v in self.id2label.items()}

    @label2id.setter
    def label2id(self, value: dict[str, int]) -> None:
        self.__dict__["label2id"] = dict(value)

    @property
    def torch_dtype(self) -> str | None:
        """The older name of ``dtype``."""
        return self.dtype

    @property
    def use_return_dict(self) -> bool:
        return self.return_dict

    @property
    def name_or_path(self) -> str:
        return self.__dict__.get("_name_or_path", "")

    @name_or_path.setter
    def name_or_path(self, value: str) -> None:
        self.__dict__["_name_or_path"] = str(value)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def labels(self) -> list[str]:
        """Label names, index order."""
        return [self.id2label[i] for i in range(self.num_labels)]

    @property
    def extra(self) -> dict[str, Any]:
        """Attributes bertlab does not use (from a config.json or set by other code)."""
        return {k: v for k, v in self.__dict__.items() if k not in _KNOWN and not k.startswith("_")}

    # ----------------------------------------------------------------------------- checks
    def validate(self) -> None:
        """Check every value, naming the one that is wrong and its limit."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"BertConfig.hidden_act {self.hidden_act!r} is not supported; "
                f"choose one of {', '.join(ACTIVATIONS)}"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            p = getattr(self, name)
            if p is not None and not (isinstance(p, (int, float)) and 0.0 <= p < 1.0):
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {p!r}")
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ValueError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not (isinstance(self.pad_token_id, int) and 0 <= self.pad_token_id < self.vocab_size):
            raise ValueError(
                f"BertConfig.pad_token_id ({self.pad_token_id!r}) must be in [0, vocab_size = "
                f"{self.vocab_size})"
            )
        if self.position_init not in POSITION_INITS:
            raise ValueError(
                f"BertConfig.position_init {self.position_init!r} is not one of {POSITION_INITS}"
            )
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"BertConfig.attn_implementation {self.attn_implementation!r} is not one of "
                f"{', '.join(ATTN_IMPLEMENTATIONS)}"
            )
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(
                f"BertConfig.problem_type {self.problem_type!r} is not one of {PROBLEM_TYPES}"
            )
        labels = self.id2label
        if not isinstance(labels, dict) or sorted(labels) != list(range(len(labels))) or not labels:
            raise ValueError(f"BertConfig.id2label must map 0..n-1 to names, got {labels!r}")
        for name in ("is_decoder", "add_cross_attention"):
            if getattr(self, name):
                raise ValueError(
                    f"BertConfig.{name} is True: bertlab implements BERT's encoder only "
                    "(bidirectional attention, no cross-attention, no cache)"
                )
        self.__dict__["_checked"] = True

    def check(self) -> None:
        """``validate`` if anything changed since the last check (cheap before each forward)."""
        if not self.__dict__.get("_checked"):
            self.validate()

    # ----------------------------------------------------------------------------- copies
    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some attributes changed (validated again)."""
        data = self.to_dict()
        data["attn_implementation"] = self.attn_implementation
        if "num_labels" in changes or "label2id" in changes:
            data.pop("id2label", None)
            data.pop("label2id", None)
        return type(self).from_dict({**data, **changes})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BertConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__} {self.to_json_string()}"

    def update(self, values: dict[str, Any]) -> None:
        """Set several attributes at once (as transformers' ``PretrainedConfig.update``)."""
        for key, value in values.items():
            setattr(self, key, value)

    def update_from_string(self, text: str) -> None:
        """``"num_labels=3,output_hidden_states=true"``: each value parsed as the attribute's
        current type."""
        for item in text.split(","):
            key, sep, raw = item.partition("=")
            if not sep or not hasattr(self, key):
                raise ValueError(f"update_from_string: {item!r} does not set a known attribute")
            old = getattr(self, key)
            if isinstance(old, bool):
                value: Any = raw.lower() in ("true", "1", "y", "yes")
            elif isinstance(old, (int, float)):
                value = type(old)(raw)
            else:
                value = raw
            setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    # ----------------------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A published size: tiny, mini, small, medium, base or large (plus overrides)."""
        key = name.lower().removeprefix("bert-").removesuffix("-uncased")
        if key not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[key]
        sizes = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        return cls(**{**sizes, **overrides})

    # ----------------------------------------------------------------------------- json
    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> BertConfig:
        """From a Hugging Face style dict. Unknown keys become attributes; never a crash on
        them. A folder of another architecture is refused, naming it."""
        if ("num_labels" in overrides or "label2id" in overrides) and "id2label" not in overrides:
            # A new label count replaces the stored label names (as in transformers).
            data = {k: v for k, v in data.items() if k not in ("id2label", "label2id")}
        data = {**data, **overrides}
        check_model_type(data.get("model_type", "bert"))
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type {data['position_embedding_type']!r} is not supported; "
                "bertlab implements BERT's absolute (learned) position embeddings"
            )
        data = {k: v for k, v in data.items() if k != "position_embedding_type"}
        if "id2label" in data and "num_labels" in data and "num_labels" not in overrides:
            data.pop("num_labels")  # a file's id2label decides
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` content (transformers reads it back unchanged)."""
        out: dict[str, Any] = {"model_type": "bert"}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        for name in NETWORK_FIELDS:
            out[name] = getattr(self, name)
        out["position_embedding_type"] = "absolute"
        out["id2label"] = dict(enumerate(self.labels))  # (JSON writes the keys as strings)
        out["label2id"] = dict(self.label2id)
        for name, default in RUNTIME_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                out[name] = str(value).removeprefix("torch.") if name == "dtype" else value
        out.update(self.extra)
        return out

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text. (``use_diff`` is accepted for transformers' callers: bertlab
        always writes every network field, so a file says what it builds.)"""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides: Any) -> BertConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no config file at {path}")
        return cls.from_dict(read_json_object(path), **overrides)

    def to_json_file(self, path: str | os.PathLike, use_diff: bool = True) -> None:
        self.validate()
        Path(path).write_text(self.to_json_string())

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> BertConfig:
        """From a model folder (its ``config.json``; a TensorFlow checkpoint's
        ``bert_config.json``), a ``.json`` file, or a name in the local Hugging Face cache.
        Hub keywords (``cache_dir``, ``revision``, ...) choose where to look; any other keyword
        overrides an attribute."""
        hub = {k: kwargs.pop(k) for k in list(kwargs) if k in HUB_KEYWORDS}
        return_unused = kwargs.pop("return_unused_kwargs", False)
        p = Path(path)
        if p.suffix == ".json" and p.is_file():
            config = cls.from_json_file(p, **kwargs)
        else:
            folder = resolve_model_dir(path, **hub)
            config = cls.from_dict(read_config_dict(folder), **kwargs)
            config.__dict__["_name_or_path"] = str(path)
        return (config, {}) if return_unused else config

    def save_pretrained(self, directory: str | os.PathLike, **kwargs: Any) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.to_json_file(Path(directory) / "config.json")


def as_dtype(value: Any) -> torch.dtype | None:
    """A dtype as transformers holds it, from a torch.dtype or its name ("bfloat16",
    "torch.float32"); config.json writes the name."""
    if value is None or isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"dtype {value!r} is not a torch dtype (such as 'float32')")
    return found


def check_model_type(model_type: Any) -> None:
    """Refuse a config of another architecture, naming it and what bertlab reads."""
    if model_type != "bert":
        raise ValueError(
            f"this is a {model_type!r} model (config.json model_type {model_type!r}); bertlab "
            "reads BERT only: a folder whose config.json has model_type 'bert' (with "
            "model.safetensors or pytorch_model.bin and vocab.txt), or an original TensorFlow "
            "BERT checkpoint with bert_config.json"
        )


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object, or a ValueError naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_config_dict(folder: Path) -> dict[str, Any]:
    """A model folder's config as a dict: config.json, or a TensorFlow checkpoint's
    bert_config.json (which names no model_type: it is BERT)."""
    for name in ("config.json", "bert_config.json"):
        path = folder / name
        if path.is_file():
            return read_json_object(path)
    hint = ""
    if any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        # What transformers' Trainer.save_model writes for a model not of its own classes.
        hint = (
            ": it holds weights only; write their config beside them with "
            "model.config.save_pretrained(folder), or save with model.save_pretrained(folder)"
        )
    raise FileNotFoundError(f"no config.json (or bert_config.json) in {folder}{hint}")


@dataclass(frozen=True)
class Source:
    """Where a model comes from: a preset or a config file (fresh weights), or a model folder
    (its config and weights)."""

    config: BertConfig
    kind: str  # "preset", "file" or "folder"
    folder: Path | None  # the model folder whose weights to load; None: fresh weights
    description: str  # "preset base", the file or the folder, for messages


def resolve_source(source: str | os.PathLike, **overrides: Any) -> Source:
    """A preset name (``base``, ``bert-base-uncased``, ...), a ``config.json`` file or a model
    folder (or the bundled default's name) -> its config, with ``overrides`` applied. The one
    reading of a model source, for the command line, pre-training and fine-tuning."""
    name = str(source)
    if name.lower().removeprefix("bert-").removesuffix("-uncased") in PRESETS:
        return Source(BertConfig.preset(name, **overrides), "preset", None, f"preset {name}")
    path = Path(source)
    if path.suffix == ".json" and path.is_file():
        return Source(BertConfig.from_json_file(path, **overrides), "file", None, str(path))
    folder = resolve_model_dir(source)
    return Source(BertConfig.from_pretrained(folder, **overrides), "folder", folder, str(folder))

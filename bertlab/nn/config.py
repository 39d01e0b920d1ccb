"""BertConfig: the hyper-parameters of a BERT network, frozen, validated, and read from / written
to the Hugging Face ``config.json`` layout.

The defaults are bert-base-uncased (L=12, H=768, A=12, vocabulary 30522), the sizes that
../shared/reference/004 calls T, A, L, H, FFD, S and P. Presets give the published sizes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertlab.files import resolve_model_dir

ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu")
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

# Keys of a Hugging Face config.json that describe the file or the library, not the network.
# They are dropped on read and regenerated on write.
_HF_BOOKKEEPING = {
    "transformers_version",
    "_name_or_path",
    "torch_dtype",
    "dtype",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "use_cache",
    "is_decoder",
    "add_cross_attention",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "bos_token_id",
    "eos_token_id",
    "gradient_checkpointing",
    "num_labels",  # derived from id2label
    "_attn_implementation",
}


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT network. Defaults are bert-base-uncased.

    Field names follow the Hugging Face ``config.json`` so that files move both ways unchanged.
    ``extra`` keeps keys bertlab does not use (they are written back on save).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    classifier_dropout: float | None = None
    tie_word_embeddings: bool = True
    # Task heads: number of labels and their names; problem_type as in transformers
    # ("regression", "single_label_classification", "multi_label_classification" or None = infer).
    num_labels: int = 2
    id2label: dict[int, str] | None = None
    problem_type: str | None = None
    # bertlab options (not used by transformers, harmless to it when written to config.json).
    # position_init: "normal" (as BERT) or "sinusoidal" (the fixed encoding of Vaswani et al.
    # used as the starting point of the learned table, reference 003). Only affects init.
    position_init: str = "normal"
    # Attention kernel: "packed" (the default: padding removed after the embeddings, every
    # layer on real tokens only, attention per sequence), "sdpa"
    # (torch.nn.functional.scaled_dot_product_attention on the padded batch, as the reference)
    # or "eager" (explicit, can return probabilities). A runtime choice: not saved.
    attn_implementation: str = "packed"
    architectures: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "num_labels",
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
            if p is not None and not 0.0 <= p < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {p!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id ({self.pad_token_id}) must be in [0, vocab_size = "
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
        if self.problem_type not in (
            None,
            "regression",
            "single_label_classification",
            "multi_label_classification",
        ):
            raise ValueError(f"BertConfig.problem_type {self.problem_type!r} is not recognised")
        if self.id2label is not None:
            labels = {int(k): str(v) for k, v in self.id2label.items()}
            if sorted(labels) != list(range(len(labels))):
                raise ValueError(f"BertConfig.id2label keys must be 0..n-1, got {sorted(labels)}")
            object.__setattr__(self, "id2label", labels)
            object.__setattr__(self, "num_labels", len(labels))
        if self.architectures is not None:
            object.__setattr__(self, "architectures", tuple(self.architectures))

    # ----------------------------------------------------------------------------- derived
    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def labels(self) -> list[str]:
        """Label names, index order (LABEL_i when none were given)."""
        if self.id2label is None:
            return [f"LABEL_{i}" for i in range(self.num_labels)]
        return [self.id2label[i] for i in range(self.num_labels)]

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (validated again)."""
        if "num_labels" in changes and "id2label" not in changes:
            changes["id2label"] = None
        return dataclasses.replace(self, **changes)

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
        """From a Hugging Face style dict. Unknown keys go to ``extra``; never a crash on them."""
        if "num_labels" in overrides and "id2label" not in overrides:
            # A new label count replaces the stored label names (as in transformers).
            data = {k: v for k, v in data.items() if k not in ("id2label", "label2id")}
        data = {**data, **overrides}
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(
                f"config model_type is {model_type!r}, not 'bert': bertlab loads BERT "
                "checkpoints only"
            )
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"position_embedding_type {data['position_embedding_type']!r} is not supported; "
                "bertlab implements BERT's absolute (learned) position embeddings"
            )
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in names:
                kwargs[key] = value
            elif key not in _HF_BOOKKEEPING and key not in (
                "model_type",
                "position_embedding_type",
            ):
                extra[key] = value
        if kwargs.get("id2label") is None and "num_labels" in data:
            kwargs["num_labels"] = data["num_labels"]
        if "id2label" in kwargs and kwargs["id2label"] is not None:
            names_by_id = {int(k): v for k, v in kwargs["id2label"].items()}
            # transformers writes LABEL_i placeholders; keep them implicit.
            if all(v == f"LABEL_{i}" for i, v in names_by_id.items()):
                kwargs["num_labels"] = len(names_by_id)
                kwargs["id2label"] = None
            else:
                kwargs["id2label"] = names_by_id
        extra.pop("label2id", None)
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` content (transformers reads it back unchanged)."""
        out: dict[str, Any] = {"model_type": "bert"}
        if self.architectures:
            out["architectures"] = list(self.architectures)
        for f in dataclasses.fields(self):
            if f.name in (
                "extra",
                "architectures",
                "id2label",
                "num_labels",
                "attn_implementation",
            ):
                continue
            out[f.name] = getattr(self, f.name)
        out["position_embedding_type"] = "absolute"
        out["id2label"] = {str(i): name for i, name in enumerate(self.labels)}
        out["label2id"] = {name: i for i, name in enumerate(self.labels)}
        out.update(self.extra)
        return out

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides: Any) -> BertConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no config file at {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
        return cls.from_dict(data, **overrides)

    def to_json_file(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertConfig:
        """From a model folder (its ``config.json``) or a ``.json`` file."""
        p = Path(path)
        if p.suffix == ".json" and p.is_file():
            return cls.from_json_file(p, **overrides)
        return cls.from_json_file(resolve_model_dir(path) / "config.json", **overrides)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.to_json_file(Path(directory) / "config.json")


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

"""Small typed outputs of the models, with the field names transformers uses.

Each is a dataclass; fields that were not computed are None. Like transformers' outputs they can
also be indexed (``out[0]`` is the first field that is not None, ``out["logits"]`` a field by name)
so code written for transformers runs unchanged. Each is also a registered pytree (its fields in
order, None included), so torch.compile, torch.export and ONNX export can return it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.utils._pytree as pytree

Tensors = tuple[torch.Tensor, ...]


class ModelOutput:
    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(v for v in (getattr(self, f.name) for f in fields(self)) if v is not None)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())


@dataclass
class BaseModelOutputWithPooling(ModelOutput):
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H)
    hidden_states: Tensors | None = None  # L+1 of (B, T, H): embeddings, then each layer
    attentions: Tensors | None = None  # L of (B, A, T, T)


@dataclass
class BertForPreTrainingOutput(ModelOutput):
    loss: torch.Tensor | None = None  # MLM + NSP, when labels and next_sentence_label are given
    prediction_logits: torch.Tensor | None = None  # (B, T, V)
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class MaskedLMOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, V)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class NextSentencePredictorOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, 2): 0 = B follows A, 1 = B is random
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class SequenceClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, num_labels)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class TokenClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, num_labels)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class QuestionAnsweringModelOutput(ModelOutput):
    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class MultipleChoiceModelOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, C)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


def _register_pytrees() -> None:
    """Each output class as a pytree node: its children are its fields in order (None is an
    empty node), and unflattening builds the class again."""
    for cls in ModelOutput.__subclasses__():
        names = tuple(f.name for f in fields(cls))

        def flatten(out: ModelOutput, names: tuple[str, ...] = names) -> tuple[list, None]:
            return [getattr(out, n) for n in names], None

        def unflatten(values: list, context: None, cls: type = cls) -> ModelOutput:
            return cls(*values)

        def flatten_with_keys(out: ModelOutput, names: tuple[str, ...] = names):
            return [(pytree.GetAttrKey(n), getattr(out, n)) for n in names], None

        pytree.register_pytree_node(
            cls,
            flatten,
            unflatten,
            serialized_type_name=f"bertlab.{cls.__name__}",
            flatten_with_keys_fn=flatten_with_keys,
        )


_register_pytrees()

"""Small typed outputs of the models, with the field names and behaviour of transformers' outputs.

Each is a dataclass and a dict at once, as there: ``out.logits`` and ``out["logits"]`` read a
field; the dict holds the fields that were computed (not None), in order, so ``out.keys()``,
``"pooler_output" in out``, ``dict(out)`` and ``for key in out`` see those; ``out[0]`` and
``out.to_tuple()`` give the computed values in order, which is what ``return_dict=False``
returns. Each is also a registered pytree (its fields in order, None included), so
torch.compile, torch.export and ONNX export can return it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.utils._pytree as pytree

Tensors = tuple[torch.Tensor, ...]


class ModelOutput(dict):
    """Base of the outputs: the dataclass fields that are not None, as dict items too."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if value is not None:
            super().__setitem__(name, value)
        elif name in self:
            super().__delitem__(name)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self, key, value)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            return super().__getitem__(key)  # KeyError for a field that was not computed
        return self.to_tuple()[key]

    def to_tuple(self) -> tuple[Any, ...]:
        """The computed values in field order."""
        return tuple(self.values())

    def __reduce__(self):
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"a {type(self).__name__} cannot be changed this way; set a field")

    __delitem__ = setdefault = pop = popitem = update = clear = _refuse


@dataclass(eq=False)
class BaseModelOutputWithPooling(ModelOutput):
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H)
    hidden_states: Tensors | None = None  # L+1 of (B, T, H): embeddings, then each layer
    attentions: Tensors | None = None  # L of (B, A, T, T)


@dataclass(eq=False)
class BertForPreTrainingOutput(ModelOutput):
    loss: torch.Tensor | None = None  # MLM + NSP, when labels and next_sentence_label are given
    prediction_logits: torch.Tensor | None = None  # (B, T, V)
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
class MaskedLMOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, V)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
class NextSentencePredictorOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, 2): 0 = B follows A, 1 = B is random
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
class SequenceClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, num_labels)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
class TokenClassifierOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, num_labels)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
class QuestionAnsweringModelOutput(ModelOutput):
    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass(eq=False)
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

"""The ``Auto*`` entry points of transformers, for BERT folders: code that loads with
``AutoModelForSequenceClassification.from_pretrained(folder)`` runs unchanged and gets the
bertlab class. A folder of another architecture is refused, naming its ``model_type``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from bertlab.files import HUB_KEYWORDS, resolve_model_dir
from bertlab.nn.config import BertConfig, as_dtype, check_model_type
from bertlab.nn.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.nn.model import BertModel, BertPreTrainedModel
from bertlab.tokenizer import BertTokenizer


class _Auto:
    def __init__(self, *args: Any, **kwargs: Any):
        raise OSError(
            f"{type(self).__name__} is not built directly: use "
            f"{type(self).__name__}.from_pretrained(folder) or .from_config(config)"
        )


class AutoConfig(_Auto):
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> BertConfig:
        return BertConfig.from_pretrained(path, **kwargs)

    @staticmethod
    def for_model(model_type: str, **kwargs: Any) -> BertConfig:
        check_model_type(model_type)
        return BertConfig(**kwargs)


class _AutoModel(_Auto):
    model_class: type[BertPreTrainedModel]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *args: Any, **kwargs: Any):
        return cls.model_class.from_pretrained(path, *args, **kwargs)

    @classmethod
    def from_config(
        cls,
        config: BertConfig,
        dtype: torch.dtype | str | None = None,
        torch_dtype: torch.dtype | str | None = None,
        attn_implementation: str | None = None,
        **kwargs: Any,
    ) -> BertPreTrainedModel:
        """A model with fresh weights for ``config`` (a copy: the model's own), in ``dtype``
        (or its older name ``torch_dtype``); ``kwargs`` go to the model class."""
        if not isinstance(config, BertConfig):
            check_model_type(getattr(config, "model_type", type(config).__name__))
            raise TypeError(f"config must be a bertlab.BertConfig, got {type(config).__name__}")
        changes = (
            {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        )
        model = cls.model_class(config.replace(**changes), **kwargs)
        wanted = as_dtype(dtype if dtype is not None else torch_dtype)
        return model if wanted is None else model.to(wanted)


def _auto(name: str, model_class: type[BertPreTrainedModel]) -> type[_AutoModel]:
    doc = f"``{name}.from_pretrained(folder)`` / ``from_config(config)``: a {model_class.__name__}."
    return type(name, (_AutoModel,), {"model_class": model_class, "__doc__": doc})


AutoModel = _auto("AutoModel", BertModel)
AutoModelForPreTraining = _auto("AutoModelForPreTraining", BertForPreTraining)
AutoModelForMaskedLM = _auto("AutoModelForMaskedLM", BertForMaskedLM)
AutoModelForNextSentencePrediction = _auto(
    "AutoModelForNextSentencePrediction", BertForNextSentencePrediction
)
AutoModelForSequenceClassification = _auto(
    "AutoModelForSequenceClassification", BertForSequenceClassification
)
AutoModelForTokenClassification = _auto(
    "AutoModelForTokenClassification", BertForTokenClassification
)
AutoModelForQuestionAnswering = _auto("AutoModelForQuestionAnswering", BertForQuestionAnswering)
AutoModelForMultipleChoice = _auto("AutoModelForMultipleChoice", BertForMultipleChoice)

# The tokenizer classes a BERT folder's tokenizer_config.json may name.
BERT_TOKENIZERS = ("BertTokenizer", "BertTokenizerFast", None)


class AutoTokenizer(_Auto):
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *args: Any, **kwargs: Any) -> BertTokenizer:
        """The folder's WordPiece tokenizer. A folder whose config or tokenizer config names
        another architecture (RoBERTa's BPE, ...) is refused, naming it."""
        hub = {k: kwargs.pop(k) for k in list(kwargs) if k in HUB_KEYWORDS}
        folder = resolve_model_dir(path, **hub)
        for name, key in (("config.json", "model_type"), ("tokenizer_config.json", None)):
            file = folder / name
            if not file.is_file():
                continue
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{file} is not valid JSON: {e}") from e
            if key is not None and key in data:
                check_model_type(data[key])
            elif key is None and data.get("tokenizer_class") not in BERT_TOKENIZERS:
                raise ValueError(
                    f"{file} names tokenizer_class {data['tokenizer_class']!r}; bertlab reads "
                    "BERT's WordPiece tokenizer only (vocab.txt or a WordPiece tokenizer.json)"
                )
        return BertTokenizer.from_pretrained(folder, *args, **kwargs)

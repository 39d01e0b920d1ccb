"""The base of every pipeline: a model folder (or model object) and its tokenizer loaded once,
batches run without gradients, the device argument as transformers takes it
(distributed.as_device), and the checks of options shared by the pipelines of both name sets
(predict.py: bertlab's own; tasks.py: transformers' task names). ``compile=True`` runs every
single text, and the batches with little padding, as one compiled graph (nn/compiled.py): at
one short sentence 1.2x faster in float32 and bfloat16, 1.7x in int8; the first call compiles
(seconds).
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import torch

from bertlab.data.batch import pad
from bertlab.distributed import Device, as_device
from bertlab.files import resolve_model_dir
from bertlab.nn.compiled import Compiled
from bertlab.nn.model import BertModel
from bertlab.tokenizer import BertTokenizer


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Pipeline:
    task = "base"
    model_class: type = BertModel
    needs: tuple[str, ...] = ()  # weight names that must come from the folder

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module = "default",
        device: Device = None,
        batch_size: int = 32,
        tokenizer: str | os.PathLike | BertTokenizer | None = None,
        *,
        compile: bool = False,
        **defaults: Any,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be True or False, got {compile!r}")
        self.device, self.batch_size = as_device(device), batch_size
        if isinstance(model, torch.nn.Module):
            self.directory = None
            if tokenizer is None:
                raise ValueError(
                    f"a {self.task} pipeline built on a model object needs tokenizer= "
                    "(a BertTokenizer or a folder with vocab.txt)"
                )
        else:
            self.directory = resolve_model_dir(model)
        if isinstance(tokenizer, BertTokenizer):
            self.tokenizer = tokenizer
        else:
            folder = self.directory if tokenizer is None else resolve_model_dir(tokenizer)
            self.tokenizer = BertTokenizer.from_pretrained(folder)
        self.defaults: dict[str, Any] = {}
        self._settings(defaults)  # checked before the model is loaded
        self.defaults = defaults
        self.model = self._model(model)
        if device is None and self.directory is None:  # a model object stays where it is
            self.device = next(self.model.parameters()).device
        else:
            self.model.to(self.device)
        self.model.eval()
        # compile=True: single texts and batches with little padding through the compiled graph
        self.forward = Compiled(self.model) if compile else self.model

    def _options(self) -> dict[str, Any]:
        """The call's options (keywords) with their defaults, each checked. bertlab's own
        pipelines take theirs as arguments when called, so they have none here."""
        return {}

    def _settings(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` over those given when the pipeline was built, checked."""
        allowed = list(inspect.signature(self._options).parameters)
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            takes = ", ".join(allowed) if allowed else "none when it is built"
            raise TypeError(
                f"the {self.task} pipeline has no option {', '.join(unknown)} (its options: "
                f"{takes})"
            )
        return self._options(**{**self.defaults, **options})

    def _model(self, model: str | os.PathLike | torch.nn.Module) -> torch.nn.Module:
        if isinstance(model, torch.nn.Module):
            if not isinstance(model, self.model_class):
                raise TypeError(
                    f"a {self.task} pipeline needs a {self.model_class.__name__}, "
                    f"got a {type(model).__name__}"
                )
            return model
        loaded, info = self.model_class.from_pretrained(self.directory, output_loading_info=True)
        missing = [k for k in info.missing_keys if k.startswith(self.needs)] if self.needs else []
        if missing:
            raise ValueError(
                f"the model in {self.directory} has no trained weights for "
                f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in missing}))}: a {self.task} "
                f"pipeline needs a model trained for it"
            )
        return loaded

    @classmethod
    def parse(cls, line: str, n: int, **options: Any) -> Any:
        """One input line (the ``n``-th, counted from 1) -> this pipeline's input: the text."""
        return line

    def run(self, items: list, **options: Any) -> list:
        """The results of ``items``, one each, under ``bertlab predict``'s options (those this
        pipeline does not use are ignored)."""
        return self(items)

    @classmethod
    def text(cls, item: Any, result: Any) -> str:
        """One result as a line of text: the input, a tab, the result."""
        return f"{item}\t{result}"

    @classmethod
    def json_line(cls, item: Any, result: Any) -> str:
        """One result as a line of JSON: {"input": ..., "output": ...}."""
        return json.dumps({"input": item, "output": result}, ensure_ascii=False)

    def _encode(self, texts: list[str], pairs: list[str] | None = None, **kw) -> Any:
        return self.tokenizer(texts, pairs, truncation=True, **kw)

    def _batch(self, features: list[dict]) -> dict[str, torch.Tensor]:
        """The features padded into one batch, on the model's device."""
        padded = pad(features, self.tokenizer.pad_token_id)
        return {k: v.to(self.device) for k, v in padded.items()}

    def _run(self, features: list[dict]) -> Any:
        batch = self._batch(features)
        with torch.no_grad():
            return self.forward(**batch), batch


def _features(enc: Any) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": i, "token_type_ids": t}
        for i, t in zip(enc["input_ids"], enc["token_type_ids"], strict=True)
    ]


def _check_top_k(top_k: Any, none_ok: bool = False) -> None:
    if top_k is None and none_ok:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        allowed = "a positive int or None (every label)" if none_ok else "a positive int"
        raise ValueError(f"top_k {top_k!r} is not {allowed}")


def _check_flags(**flags: Any) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} {value!r} is not True or False")


def _texts(texts: str | list[str]) -> tuple[list[str], bool]:
    if isinstance(texts, str):
        return [texts], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a str or a list of str")
    return list(texts), False

"""The base of every pipeline: a model folder (or model object) and its tokenizer loaded once,
the device argument as transformers takes it (distributed.as_device), the checks of options
shared by the pipelines of both name sets (predict.py: bertlab's own; tasks.py: transformers'
task names), and the run of their rows through front.py, the one front half (texts checked,
encoded under the model's length, batched ``batch_size`` rows at a time in order, read by
``front.Reader``) without gradients. ``compile=True`` runs every single text, and the batches
with little padding, as one compiled graph (nn/compiled.py): faster at short inputs, most of
all in int8; the first call compiles (seconds).

Imports front.py, text.py, the network, the tokenizer and bertlab's files and devices.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from bertlab.distributed import Device, as_device
from bertlab.files import resolve_model_dir
from bertlab.nn.compiled import Compiled
from bertlab.nn.model import BertModel
from bertlab.pipelines.front import (
    Encoded,
    Reader,
    Row,
    batch_of,
    encode,
    head_name,
    max_tokens,
    per_text,
    rows_of,
    runnable,
)
from bertlab.pipelines.text import check_texts
from bertlab.tokenizer import BertTokenizer


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def load_model(
    cls: type, directory: Any, needs: tuple[str, ...] = (), task: str = "", **kwargs: Any
) -> torch.nn.Module:
    """``cls`` loaded from ``directory`` (``kwargs``: from_pretrained's, e.g. dtype), refused by
    name when the weights whose names start with ``needs`` are not in the folder: a randomly
    initialised head would answer, but with noise."""
    loaded, info = cls.from_pretrained(directory, output_loading_info=True, **kwargs)
    missing = [k for k in info.missing_keys if k.startswith(needs)] if needs else []
    if missing:
        raise ValueError(
            f"the model in {directory} has no trained weights for "
            f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in missing}))}: a {task} "
            f"pipeline needs a model trained for it"
        )
    return loaded


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
        self.head = head_name(self.model)
        # what a batch runs through: the model, or the encoder of a masked-LM model (whose head
        # reads the [MASK] rows alone); compile=True: single texts and batches with little
        # padding through its compiled graph
        run = runnable(self.model, self.head)
        self.forward = Compiled(run) if compile else run
        self.reader = Reader(self.model, self.forward, self.head, self.tokenizer.mask_token_id)
        self.limit = max_tokens(self.model.config, self.tokenizer)  # the longest row

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
        return load_model(self.model_class, self.directory, self.needs, self.task)

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

    def _encode(self, texts: Sequence[str], want: str, **kw: Any) -> list[Encoded]:
        """``front.encode`` under this model's length; texts past it are cut (``long``:
        "truncate" unless given)."""
        kw.setdefault("long", "truncate")
        return encode(self.tokenizer, texts, want, limit=self.limit, **kw)

    def _outputs(self, rows: list[Row]) -> list[Any]:
        """Each row's output (``front.Reader``), ``batch_size`` rows a batch, in order."""
        results: list[Any] = []
        with torch.no_grad():
            for chunk in _batches(rows, self.batch_size):
                batch = batch_of(chunk, self.tokenizer.pad_token_id, self.device)
                results += self.reader(chunk, batch)
        return results

    def _per_text(self, encoded: list[Encoded]) -> list[list[Any]]:
        """Each text's window outputs (one window unless it was split)."""
        return per_text(encoded, self._outputs(rows_of(encoded)))


def _fields(name: str, n: int, single: bool) -> list[str]:
    """How texts are named in refusals: ``name`` for one text, ``name[i]`` in a list."""
    return [name] if single else [f"{name}[{i}]" for i in range(n)]


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


def _texts(texts: Any, field: str = "texts") -> tuple[list[str], bool]:
    """A text or a list of texts, each checked (text.py) and named ``field``/``field[i]``."""
    return check_texts(texts, field)

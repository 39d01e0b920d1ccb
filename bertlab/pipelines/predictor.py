"""A pipeline as a function of batches of rows: ``Predictor``, the callable class that Ray Data's
``Dataset.map_batches`` (and any engine that maps batches of a table: Spark's pandas UDFs, a
plain loop over Parquet row groups) runs in its workers.

    ds.map_batches(Predictor, fn_constructor_kwargs={"task": "embed", "model": "runs/m"},
                   concurrency=2, num_cpus=1, batch_size=256)

A batch comes in as Ray gives it, a dict of numpy arrays, a pandas DataFrame or an Arrow table,
and goes out in the same format: its columns as they were, and the task's result columns after
them (``COLUMNS``), plus ``error``: null for a row that was computed, else why it was not (a
null, empty or invalid text), its result columns null. One bad row never fails a batch. Arrow
tables get typed columns (``arrow_types``), the same in every batch, so that the blocks of a
dataset join into one Parquet schema.

The instance is what the engine pickles and sends to its workers: it holds the settings only.
The model is loaded on the first batch, once per worker process (per Ray actor), with the torch
thread count set there (``threads``), and is never pickled. The rows run through the pipelines
(bertlab.pipelines), so a row's result is the one ``pipeline(task)(text)`` gives it.

Imports the pipelines and their text rules; numpy; pandas and pyarrow only when a batch is one of
theirs. Imports nothing of Ray: bertlab.pipelines.raydata runs it on a Ray cluster.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from bertlab.pipelines.text import InputError, check_text

TASKS = ("embed", "classify", "tag", "answer", "fill-mask")
ALIASES = {"qa": "answer", "question-answering": "answer", "ner": "tag"}
# The columns each task adds, before ``error``.
COLUMNS = {
    "embed": ("embedding",),
    "classify": ("label", "score"),
    "tag": ("entities",),
    "answer": ("answer", "score", "start", "end"),
    "fill-mask": ("candidates",),
}
ERROR = "error"


def arrow_types(task: str) -> dict[str, Any]:
    """The Arrow type of each result column of ``task`` (embed's vectors: a list of float32,
    fixed to the model's width when the table is made)."""
    import pyarrow as pa

    entity = pa.struct(
        [
            ("entity", pa.string()),
            ("text", pa.string()),
            ("start", pa.int64()),
            ("end", pa.int64()),
            ("score", pa.float64()),
        ]
    )
    candidate = pa.struct(
        [
            ("token", pa.string()),
            ("id", pa.int64()),
            ("score", pa.float64()),
            ("sequence", pa.string()),
        ]
    )
    return {
        "embedding": pa.list_(pa.float32()),
        "label": pa.string(),
        "score": pa.float64(),
        "value": pa.float64(),
        "entities": pa.list_(entity),
        "answer": pa.string(),
        "start": pa.int64(),
        "end": pa.int64(),
        "candidates": pa.list_(pa.list_(candidate)),
        ERROR: pa.string(),
    }


def _is_null(value: Any) -> bool:
    """None, NaN (pandas' missing string) or pandas.NA."""
    return value is None or value != value or type(value).__name__ == "NAType"


class Predictor:
    """``task`` (embed, classify, tag, answer (alias qa), fill-mask) with ``model`` (a folder or
    "default") over batches of rows: ``column`` holds the texts (answer: the questions);
    ``pair_column`` the second texts of classify, or answer's contexts (default "context").
    ``threads``: torch's thread count in each worker (``torch.set_num_threads``), to match the
    CPUs the engine gives it. ``batch_size``: the model's batch, within the engine's.
    ``options``: the task's, as ``bertlab predict`` takes them (embed: pooling, normalize;
    classify: top_k is 1; answer: max_answer_length, allow_no_answer; fill-mask: top_k).
    ``prefix`` goes before every added column's name (to run several tasks over one
    dataset)."""

    def __init__(
        self,
        task: str,
        model: str | os.PathLike = "default",
        column: str = "text",
        *,
        pair_column: str | None = None,
        threads: int | None = 1,
        batch_size: int = 32,
        device: str = "cpu",
        prefix: str = "",
        **options: Any,
    ):
        task = ALIASES.get(task, task)
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; a Predictor runs {', '.join(TASKS)}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        allowed = {
            "embed": {"pooling", "normalize"},
            "classify": set(),
            "tag": set(),
            "answer": {"max_answer_length", "allow_no_answer"},
            "fill-mask": {"top_k"},
        }[task]
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise TypeError(
                f"the {task} Predictor has no option {', '.join(unknown)} (its options: "
                f"{', '.join(sorted(allowed)) or 'none'})"
            )
        if task == "answer" and pair_column is None:
            pair_column = "context"
        self.task, self.model, self.column, self.pair_column = task, str(model), column, pair_column
        self.threads, self.batch_size, self.device, self.prefix = (
            threads,
            batch_size,
            device,
            prefix,
        )
        self.options = options
        self._pipe: Any = None

    def __getstate__(self) -> dict:  # the settings travel; a loaded model never does
        return {**self.__dict__, "_pipe": None}

    @property
    def columns(self) -> list[str]:
        """The names of the columns a batch gains, ``error`` last."""
        return [self.prefix + c for c in (*COLUMNS[self.task], ERROR)]

    def pipeline(self) -> Any:
        """The pipeline, loaded in this process on its first use, with its thread count."""
        if self._pipe is None:
            import torch

            from bertlab.pipelines import pipeline

            if self.threads is not None:
                torch.set_num_threads(self.threads)
            self._pipe = pipeline(self.task, self.model, self.device, self.batch_size)
        return self._pipe

    # ------------------------------------------------------------------------ a batch
    def __call__(self, batch: Any) -> Any:
        """One batch (a dict of numpy arrays, a pandas DataFrame or an Arrow table) -> the same
        kind of batch with the result columns and ``error`` added."""
        texts = self._values(batch, self.column)
        pairs = None if self.pair_column is None else self._values(batch, self.pair_column)
        results, errors = self.rows(texts, pairs)
        return self._attach(batch, results, errors)

    def rows(
        self, texts: list[Any], pairs: list[Any] | None = None
    ) -> tuple[dict[str, list], list[str | None]]:
        """The result columns (each a list, None where a row has no result) and the errors (None
        where a row was computed) of ``texts`` (with ``pairs``)."""
        n = len(texts)
        errors: list[str | None] = [None] * n
        for i in range(n):
            errors[i] = self._refusal(texts[i], self.column)
            if errors[i] is None and pairs is not None:
                errors[i] = self._refusal(pairs[i], self.pair_column)
        good = [i for i in range(n) if errors[i] is None]
        outputs: list[Any] = [None] * n
        if good:
            try:
                got = self._compute([texts[i] for i in good], pairs and [pairs[i] for i in good])
                for i, out in zip(good, got, strict=True):
                    outputs[i] = out
            except (InputError, ValueError):  # a row the task refuses: each row alone
                for i in good:
                    try:
                        outputs[i] = self._compute([texts[i]], pairs and [pairs[i]])[0]
                    except (InputError, ValueError) as e:
                        errors[i] = str(e)
        columns = {c: [None] * n for c in self._result_names()}
        for i, out in enumerate(outputs):
            if out is not None:
                for c, value in out.items():
                    columns[c][i] = value
        return columns, errors

    def _result_names(self) -> list[str]:
        return list(COLUMNS[self.task])

    @staticmethod
    def _refusal(text: Any, field: str) -> str | None:
        """Why a row's text cannot run, or None: null, not a string, empty, invalid."""
        if _is_null(text):
            return f"{field} is null"
        if not isinstance(text, str):
            return f"{field} is not a string ({type(text).__name__})"
        try:
            check_text(text, field, blank="{field} is empty")
        except InputError as e:
            return str(e)
        return None

    def _compute(self, texts: list[str], pairs: list[str] | None) -> list[dict[str, Any]]:
        """Each text's result columns, as plain values (embed's a float32 vector)."""
        pipe, o = self.pipeline(), self.options
        if self.task == "embed":
            vectors = pipe(
                texts, pooling=o.get("pooling", "mean"), normalize=o.get("normalize", True)
            )
            return [{"embedding": v} for v in vectors.numpy()]
        if self.task == "classify":
            got = pipe(texts, pairs, top_k=1)
            return [
                {"label": None, "score": r["value"]} if isinstance(r, dict)
                else {"label": r[0]["label"], "score": r[0]["score"]}
                for r in got
            ]  # fmt: skip
        if self.task == "tag":
            return [{"entities": r} for r in pipe(texts)]
        if self.task == "answer":
            items = [{"question": q, "context": c} for q, c in zip(texts, pairs, strict=True)]
            got = pipe.run(items, top_k=1, **o)
            return [{k: r[k] for k in ("answer", "score", "start", "end")} for r in got]
        got = pipe.run(texts, top_k=o.get("top_k", 5))  # fill-mask: a list per [MASK], always
        return [{"candidates": r if r and isinstance(r[0], list) else [r]} for r in got]

    # ------------------------------------------------------------------------ formats
    @staticmethod
    def _values(batch: Any, column: str) -> list[Any]:
        if isinstance(batch, dict):
            names = list(batch)
        elif hasattr(batch, "column_names"):  # an Arrow table
            names = list(batch.column_names)
        else:  # a pandas DataFrame
            names = list(batch.columns)
        if column not in names:
            raise ValueError(
                f"the batch has no column {column!r} (its columns: {', '.join(map(str, names))})"
            )
        if isinstance(batch, dict):
            return list(np.asarray(batch[column], dtype=object))
        if hasattr(batch, "column_names"):  # an Arrow table
            return batch.column(column).to_pylist()
        return batch[column].tolist()  # a pandas DataFrame

    def _attach(self, batch: Any, columns: dict[str, list], errors: list[str | None]) -> Any:
        columns = {**columns, ERROR: errors}
        if isinstance(batch, dict):
            out = dict(batch)
            for name, values in columns.items():
                out[self.prefix + name] = self._numpy(name, values, self._width())
            return out
        if hasattr(batch, "column_names"):  # an Arrow table
            import pyarrow as pa

            types = arrow_types(self.task)
            for name, values in columns.items():
                kind = types[name]
                if name == "embedding":  # fixed to the model's width, in every batch
                    kind = pa.list_(pa.float32(), self.pipeline().model.config.hidden_size)
                    values = [None if v is None else v.tolist() for v in values]
                batch = batch.append_column(self.prefix + name, pa.array(values, type=kind))
            return batch
        import pandas as pd

        out = batch.copy()  # a pandas DataFrame: a vector, a value, a list or None in each cell
        for name, values in columns.items():
            out[self.prefix + name] = pd.Series(values, index=out.index, dtype=object)
        return out

    def _width(self) -> int:
        """The model's hidden size: the width of embed's vectors."""
        return int(self.pipeline().model.config.hidden_size)

    @staticmethod
    def _numpy(name: str, values: list, width: int) -> np.ndarray:
        """A column as numpy: embed's vectors (N, ``width``) float32 (NaN in the rows without
        one), the scores float64 (NaN likewise), the others object arrays (None where
        missing)."""
        if name == "embedding":
            out = np.full((len(values), width), np.nan, dtype=np.float32)
            for i, v in enumerate(values):
                if v is not None:
                    out[i] = v
            return out
        if name in ("score", "value"):
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

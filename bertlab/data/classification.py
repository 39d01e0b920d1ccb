"""Sentence and sentence-pair classification data: GLUE-style TSV/CSV and JSON lines.

    data = read_classification("train.tsv")              # columns and labels detected
    dev = read_classification("dev.tsv", like=data)       # the same columns and label set
    features = encode_classification(tokenizer, data, max_length=128)

A file has a header row (TSV, CSV) or one object per line (JSON lines). The text column(s) and
the label column are given, or detected from the names GLUE uses (``sentence``; ``sentence1`` /
``sentence2``; ``question`` / ``sentence``; ``premise`` / ``hypothesis``; ``question1`` /
``question2``; ``text``; ``#1 String`` / ``#2 String``; the label in ``label``, ``gold_label``,
``Quality``, ``score``...). Labels that are all numbers with a fraction make a regression task;
otherwise they are classes, sorted (numerically when they are all integers). A development file
read ``like`` the training data must use its columns and may only hold its labels.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertlab.tokenizer import BertTokenizer

PAIRS = [
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("premise", "hypothesis"),
    ("question", "sentence"),
    ("#1 String", "#2 String"),
    ("text_a", "text_b"),
    ("sentence_a", "sentence_b"),
]
SINGLES = ["sentence", "text", "review", "content", "document"]
LABELS = ["label", "labels", "gold_label", "Quality", "score", "target", "class", "sentiment"]


@dataclass
class ClassificationData:
    """texts (and pairs, for two-text tasks) with their labels: class indices into
    ``label_names``, or floats for regression (``label_names`` None)."""

    texts: list[str]
    pairs: list[str] | None
    labels: list[Any]
    label_names: list[str] | None
    columns: tuple[str, str | None, str]
    source: str
    lines: list[int] = field(default_factory=list)  # the file line of each example

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def regression(self) -> bool:
        return self.label_names is None

    def describe(self) -> str:
        text, pair, label = self.columns
        cols = f"text {text!r}" + (f", pair {pair!r}" if pair else "") + f", label {label!r}"
        kind = (
            "regression"
            if self.regression
            else f"{len(self.label_names)} labels: {', '.join(self.label_names)}"
        )
        return f"{self.source}: {len(self):,} examples; {cols}; {kind}"


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(columns, [(line number, row)]) of a TSV, CSV or JSON-lines file."""
    if path.suffix in (".jsonl", ".json"):
        rows, columns = [], []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}, line {n}: not JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise ValueError(
                        f"{path}, line {n}: a JSON object is expected, got {type(obj).__name__}"
                    )
                columns += [k for k in obj if k not in columns]
                rows.append((n, {k: "" if v is None else str(v) for k, v in obj.items()}))
        return columns, rows
    tsv = path.suffix != ".csv"
    with open(path, encoding="utf-8", newline="") as f:
        # GLUE's TSV files are not quoted: a quote mark is text there.
        reader = csv.reader(
            f, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL
        )
        header, rows = None, []
        for record in reader:
            n = reader.line_num
            if header is None:
                header = [c.strip() for c in record]
                continue
            if not any(c.strip() for c in record):
                continue
            if len(record) != len(header):
                raise ValueError(
                    f"{path}, line {n}: {len(record)} columns, but the header has "
                    f"{len(header)} ({', '.join(header)})"
                )
            rows.append((n, dict(zip(header, record, strict=True))))
    return header or [], rows


def _detect(
    columns: list[str], text: str | None, pair: str | None, label: str | None, path: Path
) -> tuple[str, str | None, str]:
    for name in (text, pair, label):
        if name is not None and name not in columns:
            raise ValueError(f"{path} has no column {name!r} (columns: {', '.join(columns)})")
    if text is None:
        found = next(((a, b) for a, b in PAIRS if a in columns and b in columns), None)
        if found:
            text, pair = found if pair is None else (found[0], pair)
        else:
            text = next((c for c in SINGLES if c in columns), None)
    if label is None:
        label = next((c for c in LABELS if c in columns and c not in (text, pair)), None)
    if text is None or label is None:
        missing = "text" if text is None else "label"
        raise ValueError(
            f"{path}: cannot tell the {missing} column among {', '.join(map(repr, columns))}; "
            f"name it (--{missing}-column)"
        )
    return text, pair, label


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def read_classification(
    path: str | os.PathLike,
    *,
    text_column: str | None = None,
    pair_column: str | None = None,
    label_column: str | None = None,
    regression: bool | None = None,
    like: ClassificationData | None = None,
) -> ClassificationData:
    """Read a labelled file; ``like`` (the training data) fixes columns and the label set."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    if like is not None:
        text_column, pair_column, label_column = like.columns
        regression = like.regression
    columns, rows = _rows(path)
    text, pair, label = _detect(columns, text_column, pair_column, label_column, path)
    if not rows:
        raise ValueError(f"{path} holds no examples")
    texts, pairs, raw, lines = [], [] if pair else None, [], []
    for n, row in rows:
        if text not in row or label not in row or (pair and pair not in row):
            need = [c for c in (text, pair, label) if c and c not in row]
            raise ValueError(f"{path}, line {n}: no {', '.join(need)} field")
        texts.append(row[text])
        if pairs is not None:
            pairs.append(row[pair])
        raw.append(row[label].strip())
        lines.append(n)
    numbers = [_number(v) for v in raw]
    if regression is None:
        regression = all(x is not None for x in numbers) and any(
            not float(x).is_integer()
            for x in numbers  # type: ignore[arg-type]
        )
    if regression:
        for v, x, n in zip(raw, numbers, lines, strict=True):
            if x is None:
                raise ValueError(f"{path}, line {n}: label {v!r} is not a number (regression)")
        labels: list[Any] = numbers
        names = None
    else:
        if like is not None:
            names = like.label_names
        elif all(x is not None and float(x).is_integer() for x in numbers):
            names = sorted(set(raw), key=float)
        else:
            names = sorted(set(raw))
        index = {name: i for i, name in enumerate(names)}  # type: ignore[arg-type]
        for v, n in zip(raw, lines, strict=True):
            if v not in index:
                raise ValueError(
                    f"{path}, line {n}: label {v!r} never appears in the training "
                    f"data (labels: {', '.join(names)})"
                )  # type: ignore[arg-type]
        labels = [index[v] for v in raw]
    return ClassificationData(texts, pairs, labels, names, (text, pair, label), str(path), lines)


def encode_classification(
    tokenizer: BertTokenizer, data: ClassificationData, max_length: int = 128
) -> tuple[list[dict[str, Any]], int]:
    """Tokenize (pairs as [CLS] A [SEP] B [SEP], the longer side truncated first): a list of
    {input_ids, token_type_ids, labels} (unpadded), and the number of truncated examples."""
    enc = tokenizer(data.texts, data.pairs, truncation=False, return_attention_mask=False)
    ids, types = enc["input_ids"], enc["token_type_ids"]
    long = [i for i, x in enumerate(ids) if len(x) > max_length]
    if long:  # only those are encoded again, with truncation
        pairs = None if data.pairs is None else [data.pairs[i] for i in long]
        again = tokenizer(
            [data.texts[i] for i in long],
            pairs,
            truncation=True,
            max_length=max_length,
            return_attention_mask=False,
        )
        for i, x, t in zip(long, again["input_ids"], again["token_type_ids"], strict=True):
            ids[i], types[i] = x, t
    features = [
        {"input_ids": x, "token_type_ids": t, "labels": y}
        for x, t, y in zip(ids, types, data.labels, strict=True)
    ]
    return features, len(long)

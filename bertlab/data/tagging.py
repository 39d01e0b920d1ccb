"""Token tagging data (named entities): CoNLL-2003 style files, and word-piece labels.

A file has one token per line, its tag in the last column (``--tag-column`` for another),
blank lines between sentences and ``-DOCSTART-`` lines between documents. Tags are read in
IOB1 (an entity starts with I-, B- only between two adjacent entities of one type) or IOB2 / BIO
(every entity starts with B-), detected per file, and both become IOB2, chunk for chunk by the
conlleval rules (``bertlab.metrics.to_iob2``), so the model always learns one scheme.

A word's label goes on its first word piece; the other pieces, [CLS], [SEP] and padding get
-100, which the loss ignores (BERT paper, section 5.3). Predictions are read back the same way,
one per word, from its first piece.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertlab.metrics import to_iob2
from bertlab.nn.losses import IGNORE_INDEX
from bertlab.tokenizer import BertTokenizer


@dataclass
class TaggingData:
    words: list[list[str]]
    tags: list[list[str]]  # IOB2
    label_names: list[str]
    scheme: str  # what the file used: "IOB1" or "IOB2"
    source: str
    lines: list[int]  # the line of each sentence's first token

    def __len__(self) -> int:
        return len(self.words)

    def describe(self) -> str:
        types = sorted({t[2:] for tags in self.tags for t in tags if t != "O"})
        n = sum(len(w) for w in self.words)
        return (
            f"{self.source}: {len(self):,} sentences, {n:,} tokens; tags in {self.scheme}"
            f"{' (converted to IOB2)' if self.scheme == 'IOB1' else ''}; entity types "
            f"{', '.join(types)}; {len(self.label_names)} labels"
        )


def _is_iob1(tags: list[str]) -> bool:
    """An I- tag that opens an entity (after O or another type) only happens in IOB1."""
    prev = "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            return True
        prev = tag
    return False


def read_conll(
    path: str | os.PathLike,
    *,
    tag_column: int = -1,
    like: TaggingData | None = None,
) -> TaggingData:
    """Read a CoNLL-style file; ``like`` (the training data) fixes the label set."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    sentences: list[tuple[int, list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    width = None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if words:
                    sentences.append((start, words, tags))
                words, tags = [], []
                continue
            if width is None:
                width = len(fields)
                if not -width <= tag_column < width:
                    raise ValueError(
                        f"{path}, line {n}: tag column {tag_column} is outside the {width} columns"
                    )
            if len(fields) != width or width < 2:
                raise ValueError(
                    f"{path}, line {n}: {len(fields)} columns, but the file's "
                    f"first token line has {width} (token ... tag)"
                )
            tag = fields[tag_column]
            if tag != "O" and (tag[:2] not in ("B-", "I-") or len(tag) < 3):
                raise ValueError(f"{path}, line {n}: tag {tag!r} is not O, B-TYPE or I-TYPE")
            if not words:
                start = n
            words.append(fields[0])
            tags.append(tag)
    if words:
        sentences.append((start, words, tags))
    if not sentences:
        raise ValueError(f"{path} holds no sentences")
    iob1 = any(_is_iob1(t) for _, _, t in sentences)
    converted = [to_iob2(t) if iob1 else t for _, _, t in sentences]
    if like is not None:
        names = like.label_names
        known = set(names)
        for (line, _, _), t in zip(sentences, converted, strict=True):
            for i, tag in enumerate(t):
                if tag not in known:
                    raise ValueError(
                        f"{path}, line {line + i}: tag {tag!r} never appears in "
                        f"the training data ({', '.join(names)})"
                    )
    else:
        types = sorted({tag[2:] for t in converted for tag in t if tag != "O"})
        names = ["O"] + [f"{p}-{k}" for k in types for p in ("B", "I")]
    return TaggingData(
        [w for _, w, _ in sentences],
        converted,
        names,
        "IOB1" if iob1 else "IOB2",
        str(path),
        [line for line, _, _ in sentences],
    )


def encode_tagging(
    tokenizer: BertTokenizer, data: TaggingData, max_length: int = 128
) -> tuple[list[dict[str, Any]], int]:
    """Word pieces with a label on each word's first piece (-100 elsewhere): a list of
    {input_ids, token_type_ids, labels, word_ids}, and the number of words cut off by
    ``max_length`` (they get no label here, and "O" when predictions are read back)."""
    index = {name: i for i, name in enumerate(data.label_names)}
    enc = tokenizer(
        data.words,
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        return_attention_mask=False,
    )
    features, cut = [], 0
    for i, tags in enumerate(data.tags):
        word_ids = enc.word_ids(i)
        labels, seen = [], set()
        for w in word_ids:
            first = w is not None and w not in seen
            labels.append(index[tags[w]] if first else IGNORE_INDEX)
            if w is not None:
                seen.add(w)
        cut += len(tags) - len(seen)
        ids, types = enc["input_ids"][i], enc["token_type_ids"][i]
        features.append(
            {"input_ids": ids, "token_type_ids": types, "labels": labels, "word_ids": word_ids}
        )
    return features, cut


def word_predictions(
    word_ids: list[int | None], piece_labels: list[str], n_words: int
) -> list[str]:
    """One tag per word, from its first piece; words with no piece (cut off) get "O". The
    result is made valid IOB2 (an I- that opens an entity becomes B-), as conlleval reads it."""
    out = ["O"] * n_words
    seen = set()
    for w, label in zip(word_ids, piece_labels, strict=True):
        if w is not None and w not in seen:
            out[w] = label
            seen.add(w)
    return to_iob2(out)

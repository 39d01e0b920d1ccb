"""BatchEncoding, what a tokenizer returns, and the padding of encoded rows.

A leaf beside ``tokenizer.py`` (it imports nothing of bertlab): the dict of ``input_ids``,
``token_type_ids``, ``attention_mask``... with the methods transformers users call on it
(``.to(device)``, ``.input_ids``, ``word_ids()``, ``char_to_token()``, ``convert_to_tensors``),
and ``pad_rows``, the Python padding behind ``BertTokenizer.pad`` (what data collators call on
rows that were tokenized earlier, without padding).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tokenizers import Encoding

logger = logging.getLogger(__name__)

TENSOR_TYPES = (None, "pt", "np")
SIDES = ("right", "left")


def check_tensor_type(value: Any) -> str | None:
    """``return_tensors``: None, "pt" or "np" (an enum whose value is one of them is fine)."""
    name = getattr(value, "value", value)
    if name not in TENSOR_TYPES:
        raise ValueError(f"return_tensors {value!r} is not supported: use one of {TENSOR_TYPES}")
    return name


def check_side(value: Any, name: str = "padding_side") -> str:
    if value not in SIDES:
        raise ValueError(f"{name} {value!r} is not one of {list(SIDES)}")
    return value


def to_python(value: Any) -> Any:
    """Tensors and arrays (or lists of them) as nested Python lists."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class BatchEncoding(dict):
    """``input_ids``, ``token_type_ids``, ``attention_mask`` (and what else was asked for), as
    lists, torch tensors or numpy arrays. As in transformers: keys are also attributes
    (``enc.input_ids``); ``enc[i]`` (an int or a slice) is the engine's ``Encoding`` of row
    ``i`` (or a list of them; without encodings, a slice cuts every field); the
    mapping methods below take ``(i, index)`` or, for row 0, just ``(index)``."""

    def __init__(
        self,
        data: Mapping[str, Any] | None = None,
        encodings: list[Encoding] | None = None,
        tensor_type: str | None = None,
        n_sequences: int | None = None,
    ):
        super().__init__(data or {})
        self._encodings = encodings
        if n_sequences is None and encodings:
            n_sequences = encodings[0].n_sequences
        self._n_sequences = n_sequences
        self.convert_to_tensors(tensor_type)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_encodings", "_n_sequences"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, item: str | int | slice) -> Any:
        if isinstance(item, str):
            return super().__getitem__(item)
        if isinstance(item, (int, slice)) and self._encodings is not None:
            return self._encodings[item]
        if isinstance(item, slice):
            return {key: value[item] for key, value in self.items()}
        raise KeyError(
            f"{item!r}: a BatchEncoding takes a str (a field), an int (a row's Encoding, when "
            "the text was tokenized here) or a slice"
        )

    def __reduce__(self):  # pickles (DataLoader workers) with its encodings
        return (BatchEncoding, (dict(self), self._encodings, None, self._n_sequences))

    @property
    def encodings(self) -> list[Encoding] | None:
        """The engine's ``Encoding`` per row (None for a BatchEncoding built by ``pad``)."""
        return self._encodings

    @property
    def is_fast(self) -> bool:
        return self._encodings is not None

    @property
    def n_sequences(self) -> int | None:
        """1 for single texts, 2 for pairs, None when unknown."""
        return self._n_sequences

    # ------------------------------------------------------------------- tensors and devices
    def convert_to_tensors(
        self, tensor_type: str | None = None, prepend_batch_axis: bool = False
    ) -> BatchEncoding:
        """Every field as a torch tensor ("pt") or numpy array ("np"; int64 for ids, an object
        array for rows of different lengths, as transformers); None leaves them as they are."""
        kind = check_tensor_type(tensor_type)
        if kind is None:
            return self
        for key, value in self.items():
            if prepend_batch_axis:
                value = [value]
            if kind == "pt" and not isinstance(value, torch.Tensor):
                self[key] = _as_torch(key, value)
            elif kind == "np" and not isinstance(value, np.ndarray):
                self[key] = _as_numpy(value)
        return self

    def to(self, device: str | torch.device | int, *, non_blocking: bool = False) -> BatchEncoding:
        """Move every tensor to ``device``; returns this BatchEncoding."""
        if not isinstance(device, (str, torch.device, int)):
            logger.warning("a BatchEncoding moves to a device, not to %s: left as it is", device)
            return self
        for key, value in self.items():
            if isinstance(value, torch.Tensor):
                self[key] = value.to(device=device, non_blocking=non_blocking)
        return self

    # ------------------------------------------------------------------- token <-> text maps
    def _row(self, i: int) -> Encoding:
        if not self._encodings:
            raise ValueError("this BatchEncoding has no encodings (it was built by pad())")
        return self._encodings[i]

    def tokens(self, i: int = 0) -> list[str]:
        return self._row(i).tokens

    def word_ids(self, i: int = 0) -> list[int | None]:
        """Index of the word each token comes from (None for special tokens and padding)."""
        return self._row(i).word_ids

    def sequence_ids(self, i: int = 0) -> list[int | None]:
        """0 or 1: the segment each token comes from (None for special tokens and padding)."""
        return self._row(i).sequence_ids

    def token_to_sequence(self, i: int, token: int | None = None) -> int:
        i, token = (0, i) if token is None else (i, token)
        return self._row(i).token_to_sequence(token)

    def token_to_word(self, i: int, token: int | None = None) -> int | None:
        i, token = (0, i) if token is None else (i, token)
        return self._row(i).token_to_word(token)

    def token_to_chars(self, i: int, token: int | None = None) -> tuple[int, int] | None:
        i, token = (0, i) if token is None else (i, token)
        return self._row(i).token_to_chars(token)

    def word_to_tokens(
        self, i: int, word: int | None = None, sequence_index: int = 0
    ) -> tuple[int, int] | None:
        i, word = (0, i) if word is None else (i, word)
        return self._row(i).word_to_tokens(word, sequence_index)

    def word_to_chars(
        self, i: int, word: int | None = None, sequence_index: int = 0
    ) -> tuple[int, int] | None:
        i, word = (0, i) if word is None else (i, word)
        return self._row(i).word_to_chars(word, sequence_index)

    def char_to_token(self, i: int, char: int | None = None, sequence_index: int = 0) -> int | None:
        """The token holding character ``char`` of the text (None for whitespace)."""
        i, char = (0, i) if char is None else (i, char)
        return self._row(i).char_to_token(char, sequence_index)

    def char_to_word(self, i: int, char: int | None = None, sequence_index: int = 0) -> int | None:
        i, char = (0, i) if char is None else (i, char)
        return self._row(i).char_to_word(char, sequence_index)


def _as_torch(key: str, value: Any) -> torch.Tensor:
    try:
        if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            return torch.from_numpy(np.array(value))
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return torch.stack(value)
        tensor = torch.tensor(value)
        return tensor.long() if tensor.numel() == 0 else tensor
    except (ValueError, TypeError, RuntimeError) as e:
        raise ValueError(
            f"{key!r} cannot form one tensor ({e}): rows of different lengths need padding=True "
            "(and truncation=True for rows longer than the model takes)"
        ) from e


def _as_numpy(value: Any) -> np.ndarray:
    if (
        isinstance(value, (list, tuple))
        and value
        and isinstance(value[0], (list, tuple, np.ndarray))
        and len({len(v) for v in value}) > 1
    ):  # rows of different lengths: an object array of rows, as transformers gives
        rows = np.empty(len(value), dtype=object)
        rows[:] = [np.asarray(v) for v in value]
        return rows
    array = np.asarray(value)
    return array.astype(np.int64) if array.size == 0 else array


def pad_rows(
    rows: dict[str, list[Any]],
    length: int | None,
    multiple: int | None,
    side: str,
    pad_id: int,
    attention_mask: bool,
) -> dict[str, list[Any]]:
    """Pad each row of a batch (``rows[key][i]``) to ``length`` (None: leave the lengths),
    rounded up to a multiple of ``multiple``, on ``side``: input_ids with ``pad_id``,
    token_type_ids with 0, attention_mask with 0 (made of ones first when absent and
    ``attention_mask``), special_tokens_mask with 1. Other fields are left as they are; a row
    longer than ``length`` is not cut (truncation happens when text is tokenized)."""
    fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0, "special_tokens_mask": 1}
    out: dict[str, list[Any]] = {}
    for i, ids in enumerate(rows["input_ids"]):
        row = {key: values[i] for key, values in rows.items()}
        if attention_mask and "attention_mask" not in row:
            row["attention_mask"] = [1] * len(ids)
        target = length
        if target is not None and multiple is not None and target % multiple:
            target = (target // multiple + 1) * multiple
        missing = 0 if target is None else target - len(ids)
        if missing > 0:
            for key, value in fill.items():
                if key in row and (key != "attention_mask" or attention_mask):
                    pad = [value] * missing
                    row[key] = list(row[key]) + pad if side == "right" else pad + list(row[key])
        for key, value in row.items():
            out.setdefault(key, []).append(value)
    return out

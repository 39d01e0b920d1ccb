"""The part of BertTokenizer that code written for transformers calls beyond encoding text:
the role tokens as attributes (``cls_token``, ``pad_token_id``...), the special-token lists and
masks, added tokens, ``pad`` for rows tokenized earlier (what data collators call), and the
[CLS]/[SEP] builders.

``TransformersSurface`` is a mixin: ``BertTokenizer`` (tokenizer.py) owns the engine and the
state these methods read and change: ``special_tokens`` (role -> token), ``vocab``, ``_tok``
(the engine), ``_added`` (added tokens, in order), ``_size`` (``len(tokenizer)``),
``_extra_special``, ``_unk_above``, ``_engine()`` (rebuilds the engine), ``_template()`` (the
[CLS] A [SEP] template) and ``_padding_plan()``. It imports only the leaves beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer

from bertlab.encoding import BatchEncoding, check_side, check_tensor_type, pad_rows, to_python
from bertlab.vocab import SPECIAL_TOKENS


def _role_property(role: str, ids: bool) -> property:
    """``tokenizer.cls_token`` / ``cls_token_id`` (read and write), kept in ``special_tokens``."""

    def get(self: Any) -> Any:
        token = self.special_tokens[role]
        return self.convert_tokens_to_ids(token) if ids else token

    def set(self: Any, value: Any) -> None:
        token = self.convert_ids_to_tokens(int(value)) if ids else value
        if not isinstance(token, str):
            raise TypeError(f"{role} must be a str, got {type(value).__name__}: {value!r:.60}")
        self.special_tokens[role] = token
        if role in ("cls_token", "sep_token"):
            self._tok.post_processor = self._template()

    return property(get, set, doc=f"The {role.replace('_', ' ')}{' id' if ids else ''}.")


class TransformersSurface:
    """What transformers' BertTokenizerFast offers beside encoding (see the module docstring)."""

    unk_token = _role_property("unk_token", ids=False)
    sep_token = _role_property("sep_token", ids=False)
    pad_token = _role_property("pad_token", ids=False)
    cls_token = _role_property("cls_token", ids=False)
    mask_token = _role_property("mask_token", ids=False)
    unk_token_id = _role_property("unk_token", ids=True)
    sep_token_id = _role_property("sep_token", ids=True)
    pad_token_id = _role_property("pad_token", ids=True)
    cls_token_id = _role_property("cls_token", ids=True)
    mask_token_id = _role_property("mask_token", ids=True)

    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    pad_token_type_id = 0

    @property
    def is_fast(self) -> bool:
        """True: the Rust engine tokenizes (offsets, word_ids and char_to_token are available)."""
        return True

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The ``tokenizers`` engine (its padding and truncation are set afresh by each call)."""
        return self._tok

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Role -> token, for the five roles (extra special tokens are not listed here)."""
        return dict(self.special_tokens)

    @property
    def extra_special_tokens(self) -> list[str]:
        """Special tokens without a role, added by ``add_special_tokens``."""
        return list(self._extra_special)

    additional_special_tokens = extra_special_tokens  # (its name before transformers 5)

    @property
    def all_special_tokens(self) -> list[str]:
        """The role tokens (unk, sep, pad, cls, mask), then the extra special tokens."""
        return list(dict.fromkeys([*self.special_tokens.values(), *self._extra_special]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return {**self.vocab, **self.get_added_vocab()}

    def get_added_vocab(self) -> dict[str, int]:
        """Tokens held as added tokens (the special ones included) -> id."""
        return {t.content: i for i, t in sorted(self.added_tokens_decoder.items())}

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        kept = set(self.never_split) - {t.content for ts, _ in self._added for t in ts}
        return {
            i: t
            for i, t in self._tok.get_added_tokens_decoder().items()
            if i < self._size and t.content not in kept
        }

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return self.get_added_vocab()

    def add_tokens(
        self,
        new_tokens: str | AddedToken | Sequence[str | AddedToken],
        special_tokens: bool = False,
    ) -> int:
        """Add tokens that are never split: those not in the vocabulary get ids from
        ``len(tokenizer)`` up. Returns how many the engine added. A plain str matches text after
        normalisation (so ``NEW_TOK`` finds ``new_tok`` in an uncased tokenizer), anywhere, even
        inside a word; an ``AddedToken`` says otherwise. ``vocab_size`` stays the base vocabulary;
        ``len(tokenizer)`` grows (resize the model's embeddings to it)."""
        if not new_tokens:
            return 0
        if not isinstance(new_tokens, (list, tuple)):
            new_tokens = [new_tokens]
        for i, t in enumerate(new_tokens):
            if not isinstance(t, (str, AddedToken)):
                raise TypeError(f"new_tokens[{i}] must be a str or an AddedToken, got {t!r:.60}")
        tokens = [
            t
            if isinstance(t, AddedToken)
            else AddedToken(t, special=special_tokens, normalized=not special_tokens)
            for t in new_tokens
        ]
        self._added.append((tokens, special_tokens))
        if self._unk_above is None:
            add = self._tok.add_special_tokens if special_tokens else self._tok.add_tokens
            count = add(tokens)
            self._size = self._tok.get_vocab_size(with_added_tokens=True)
            return count
        self._tok, count = self._engine()  # never_split words stay after the added tokens
        return count

    def add_special_tokens(
        self, special_tokens_dict: Mapping[str, Any], replace_extra_special_tokens: bool = True
    ) -> int:
        """Set role tokens (``{"pad_token": "<pad>"}``) and extra special tokens
        (``{"additional_special_tokens": [...]}`` or ``"extra_special_tokens"``), adding those
        not yet held. Special tokens are matched exactly (not lower-cased), never split, and
        skipped by ``decode(skip_special_tokens=True)``. Returns how many tokens were added.
        A new cls_token or sep_token is used by the [CLS] A [SEP] template at once (transformers
        keeps the old one until the tokenizer is saved and loaded again)."""
        given = dict(special_tokens_dict)
        if "additional_special_tokens" in given and not given.get("extra_special_tokens"):
            given["extra_special_tokens"] = given.pop("additional_special_tokens")
        allowed = [*SPECIAL_TOKENS, "extra_special_tokens", "additional_special_tokens"]
        tokens: list[str | AddedToken] = []
        for key, value in given.items():
            if key not in allowed:
                raise ValueError(
                    f"{key!r} is not a special token role of BERT: use one of {allowed}"
                )
            if key in ("extra_special_tokens", "additional_special_tokens"):
                if not isinstance(value, (list, tuple)) or not all(
                    isinstance(t, (str, AddedToken)) for t in value
                ):
                    raise ValueError(
                        f"{key} must be a list of str or AddedToken, got {value!r:.80}"
                    )
                new = [
                    t
                    for t in value
                    if replace_extra_special_tokens or str(t) not in self._extra_special
                ]
                if replace_extra_special_tokens and new:
                    self._extra_special = [str(t) for t in new]
                else:
                    self._extra_special += [str(t) for t in new]
                tokens += new
            else:
                if not isinstance(value, (str, AddedToken)):
                    raise ValueError(f"{key} must be a str or an AddedToken, got {value!r:.60}")
                self.special_tokens[key] = str(value)
                tokens.append(value)
        tokens = [
            AddedToken(t, normalized=False, special=True) if isinstance(t, str) else t
            for t in tokens
        ]
        count = self.add_tokens(tokens, special_tokens=True)
        if {"cls_token", "sep_token"} & set(given):
            self._tok.post_processor = self._template()
        return count

    def get_special_tokens_mask(
        self,
        token_ids_0: list[int],
        token_ids_1: list[int] | None = None,
        already_has_special_tokens: bool = False,
    ) -> list[int]:
        """1 for a special token, 0 for text. ``already_has_special_tokens``: the ids are a
        whole input (what data collators pass): 1 where an id is a special token's. Otherwise
        they are the text(s) before [CLS]/[SEP] are added: the mask of the result (transformers'
        fast tokenizer has no such form; this is its original BERT tokenizer's)."""
        if already_has_special_tokens:
            if token_ids_1 is not None:
                raise ValueError(
                    "token_ids_1 must be None when the ids already hold their special tokens"
                )
            special = set(self.all_special_ids)
            return [1 if int(i) in special else 0 for i in token_ids_0]
        mask = [1] + [0] * len(token_ids_0) + [1]
        return mask if token_ids_1 is None else mask + [0] * len(token_ids_1) + [1]

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` as ids."""
        cls, sep = [self.cls_token_id], [self.sep_token_id]
        ids = cls + list(token_ids_0) + sep
        return ids if token_ids_1 is None else ids + list(token_ids_1) + sep

    def create_token_type_ids_from_sequences(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """Segment ids of ``build_inputs_with_special_tokens``: 0 for [CLS] A [SEP], then 1."""
        types = [0] * (len(token_ids_0) + 2)
        return types if token_ids_1 is None else types + [1] * (len(token_ids_1) + 1)

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad rows tokenized earlier (what ``DataCollatorWithPadding`` and
        ``DataCollatorForLanguageModeling`` call): a list of dicts (of lists, tensors or arrays)
        or a dict of lists; one row (a dict of flat lists) is padded alone. padding: True /
        "longest" (default) | "max_length" (``max_length``, else model_max_length) | False.
        input_ids are padded with [PAD], token_type_ids with 0, attention_mask with 0 (made
        first, all ones, unless ``return_attention_mask=False``), special_tokens_mask with 1;
        other fields (labels) are left as they are. Tensors in gives tensors out of the same
        kind unless ``return_tensors`` says otherwise."""
        if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs:
            if isinstance(encoded_inputs[0], Mapping):
                keys = list(encoded_inputs[0].keys())
                for i, row in enumerate(encoded_inputs):
                    if not isinstance(row, Mapping) or set(row.keys()) != set(keys):
                        what = list(row) if isinstance(row, Mapping) else type(row).__name__
                        raise ValueError(f"pad: row {i} has fields {what}, row 0 has {keys}")
                encoded_inputs = {k: [row[k] for row in encoded_inputs] for k in keys}
        if not isinstance(encoded_inputs, Mapping):
            raise TypeError(
                f"pad takes a list of dicts or a dict of lists, got {type(encoded_inputs).__name__}"
            )
        inputs = dict(encoded_inputs)
        if "input_ids" not in inputs:
            raise ValueError(f"pad needs input_ids among the fields, got {list(inputs)}")
        side = self.padding_side if padding_side is None else check_side(padding_side)
        return_tensors = check_tensor_type(return_tensors)
        ids = inputs["input_ids"]
        if ids is None or len(ids) == 0:
            if return_attention_mask:
                inputs["attention_mask"] = []
            return BatchEncoding(inputs)
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        first = next((row[0] for row in ids if _is_row(row) and len(row)), ids[0])
        if isinstance(first, torch.Tensor):
            return_tensors = return_tensors or "pt"
        elif isinstance(first, np.ndarray) or (isinstance(first, np.generic)):
            return_tensors = return_tensors or "np"
        inputs = {k: to_python(v) for k, v in inputs.items()}
        kind, length = self._padding_plan(padding, None, max_length, pad_to_multiple_of, verbose)
        ids = inputs["input_ids"]
        single = not _is_row(ids[0])
        rows = {k: [v] for k, v in inputs.items()} if single else inputs
        sizes = {k: len(v) for k, v in rows.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"pad: the fields hold different numbers of rows: {sizes}")
        if kind == "longest":
            length = max(len(row) for row in rows["input_ids"])
        elif kind is None:
            length = None
        out = pad_rows(
            rows, length, pad_to_multiple_of, side, self.pad_token_id, return_attention_mask
        )
        if single:
            out = {k: v[0] for k, v in out.items()}
        return BatchEncoding(out, tensor_type=return_tensors)


def _is_row(value: Any) -> bool:
    return isinstance(value, (list, tuple, torch.Tensor, np.ndarray)) and (
        not isinstance(value, (torch.Tensor, np.ndarray)) or value.ndim > 0
    )

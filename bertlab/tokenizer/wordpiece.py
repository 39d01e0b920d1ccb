"""BertTokenizer: BERT's WordPiece tokenization, run by the Rust ``tokenizers`` engine.

bertlab configures the engine exactly as BERT needs (reference 000, 002, 004): clean the text,
put spaces around CJK characters, lower-case and strip accents for uncased vocabularies, split on
whitespace and punctuation, greedy longest-match WordPiece (``playing`` -> ``play ##ing``; a word
over 100 characters -> ``[UNK]``), then ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with
segment ids 0 for A and 1 for B. The engine does the work; this file holds the configuration,
the checks on what callers pass, and the API that transformers users know (code written for
transformers' ``BertTokenizerFast`` / ``AutoTokenizer`` runs with only its import changed).
Beside it: ``tokenizer_surface.py`` (the rest of transformers' tokenizer API: role tokens,
special-token lists, added tokens, ``pad``), ``encoding.py`` (``BatchEncoding``, what a call
returns) and ``vocab.py`` (vocabulary files, ``train_vocab``).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from bertlab.files import HUB_KEYWORDS, atomic_write, resolve_model_dir
from bertlab.tokenizer.encoding import (
    BatchEncoding,
    check_side,
    check_tensor_type,
    to_python,
)
from bertlab.tokenizer.surface import TokenizerSurface
from bertlab.tokenizer.vocab import (
    MAX_WORD_CHARS,
    SPECIAL_TOKENS,
    added_token,
    read_tokenizer_json,
    read_vocab,
    saved_added_tokens,
    train_vocab,
)

__all__ = ["BatchEncoding", "BertTokenizer", "read_vocab", "train_vocab"]

logger = logging.getLogger(__name__)

NO_LIMIT = int(1e30)  # model_max_length of a folder that names none (transformers' value)
PADDING = {
    False: None,
    "do_not_pad": None,
    True: "longest",
    "longest": "longest",
    "max_length": "max_length",
}
TRUNCATION = {
    False: None,
    "do_not_truncate": None,
    True: "longest_first",
    "longest_first": "longest_first",
    "only_first": "only_first",
    "only_second": "only_second",
}
# The keywords of __call__ (transformers' set). text_target / text_pair_target would encode
# labels for sequence-to-sequence models, which BERT is not: they raise.
CALL_OPTIONS = (
    "add_special_tokens",
    "padding",
    "truncation",
    "max_length",
    "stride",
    "is_split_into_words",
    "pad_to_multiple_of",
    "padding_side",
    "return_tensors",
    "return_token_type_ids",
    "return_attention_mask",
    "return_overflowing_tokens",
    "return_special_tokens_mask",
    "return_offsets_mapping",
    "return_length",
    "verbose",
)
EXTRA_CALL_OPTIONS = ("split_special_tokens", "max_target_length", "tokenizer_kwargs")
UNSUPPORTED_CALL_OPTIONS = ("text_target", "text_pair_target")
# (the transformers warning, word for word, so that filters written for it still match)
MAX_LENGTH_IGNORED = (
    "`max_length` is ignored when `padding`=`True` and there is no truncation strategy. "
    "To pad to max length, use `padding='max_length'`."
)
# Spaces the WordPiece join leaves before punctuation and English contractions.
CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


class BertTokenizer(TokenizerSurface):
    """WordPiece tokenizer for BERT. Build with ``from_pretrained(dir)`` or from a vocab.txt.

    ``added_tokens``: entries of a saved tokenizer.json's ``added_tokens`` list (``id``,
    ``content``, ``special``, ``normalized``, ``single_word``, ``lstrip``, ``rstrip``), applied
    in id order; their ids must follow the vocabulary without gaps."""

    def __init__(
        self,
        vocab: str | os.PathLike | dict[str, int],
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        never_split: Iterable[str] | None = None,
        model_max_length: int = NO_LIMIT,
        padding_side: str = "right",
        truncation_side: str = "right",
        clean_up_tokenization_spaces: bool = False,
        split_special_tokens: bool = False,
        extra_special_tokens: Sequence[str] | None = None,
        added_tokens: Sequence[Mapping[str, Any]] | None = None,
        name_or_path: str = "",
        **special_tokens: str,
    ):
        unknown = set(special_tokens) - set(SPECIAL_TOKENS)
        if unknown:
            raise TypeError(f"unknown arguments {sorted(unknown)}")
        self.special_tokens = {**SPECIAL_TOKENS, **special_tokens}
        if isinstance(vocab, dict):
            self._lines = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        else:
            self._lines = read_vocab(vocab)
        # A token listed twice takes the id of its last line, as in the reference.
        self.vocab = {t: i for i, t in enumerate(self._lines)}
        self.ids_to_tokens = dict(enumerate(self._lines))
        saved = sorted(added_tokens or (), key=lambda entry: int(entry["id"]))
        names = set(self.vocab) | {entry["content"] for entry in saved}
        missing = [t for t in self.special_tokens.values() if t not in names]
        if missing:
            where = "" if isinstance(vocab, dict) else f" {vocab}"
            raise ValueError(f"vocabulary{where} lacks the special tokens {', '.join(missing)}")
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.never_split = sorted(set(never_split or ()))
        self.model_max_length = model_max_length
        self.padding_side = padding_side
        self.truncation_side = truncation_side
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self.split_special_tokens = split_special_tokens
        self.name_or_path = name_or_path
        self._base_unk = self.special_tokens["unk_token"]  # the engine's WordPiece [UNK]
        self._extra_special: list[str] = []
        self._warned_long = False
        # Tokens added after the vocabulary, in the order they were added: (tokens, special).
        self._added: list[tuple[list[AddedToken], bool]] = [
            ([added_token(entry)], bool(entry.get("special", False))) for entry in saved
        ]
        self._tok, _ = self._engine()
        for entry in saved:
            got = self._tok.token_to_id(entry["content"])
            if got != int(entry["id"]):
                raise ValueError(
                    f"added token {entry['content']!r} has id {entry['id']} in the file, but "
                    f"added ids must follow the vocabulary ({len(self.vocab)} tokens) in order "
                    f"without gaps (it would get {got})"
                )
        self.add_special_tokens(
            {"extra_special_tokens": list(extra_special_tokens or ())},
            replace_extra_special_tokens=False,
        )

    def _engine(self, never_split: bool = True) -> tuple[Tokenizer, int]:
        """The engine for this vocabulary and its added tokens (and the number the last batch
        of added tokens added). ``never_split`` words come last: those outside the vocabulary
        get ids from ``len(self)`` up, mapped back to [UNK] after encoding."""
        tok = Tokenizer(
            models.WordPiece(
                self.vocab, unk_token=self._base_unk, max_input_chars_per_word=MAX_WORD_CHARS
            )
        )
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=self.tokenize_chinese_chars,
            strip_accents=self.strip_accents,  # None: strip when lower-casing, as BERT does
            lowercase=self.do_lower_case,
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        # Special tokens are found anywhere in the text and never split or lower-cased.
        roles = [t for t in self.special_tokens.values() if t in self.vocab]
        tok.add_special_tokens([AddedToken(t, normalized=False) for t in roles])
        count = 0
        for tokens, special in self._added:
            count = tok.add_special_tokens(tokens) if special else tok.add_tokens(tokens)
        self._size = tok.get_vocab_size(with_added_tokens=True)
        self._tok = tok  # (the template reads the role ids from it)
        tok.post_processor = self._template()
        self._unk_above = None
        if never_split and self.never_split:
            # never_split words are kept whole where they stand as words, as in the original
            # code: a word W matches text that is W, or (uncased) text that lower-cases to W. The
            # first is an exact match; when W is already in normal form the match on normalised
            # text gives both. A word the vocabulary lacks becomes [UNK].
            norm = tok.normalizer.normalize_str
            words = [
                AddedToken(w, single_word=True, normalized=norm(w) == w) for w in self.never_split
            ]
            tok.add_tokens(words)
            if tok.get_vocab_size(with_added_tokens=True) > self._size:
                self._unk_above = self._size
        return tok, count

    def _template(self) -> processors.TemplateProcessing:
        cls, sep = self.cls_token, self.sep_token
        return processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, self.cls_token_id), (sep, self.sep_token_id)],
        )

    @property
    def padding_side(self) -> str:
        """ "right" or "left": where padding goes when a call does not say."""
        return self._padding_side

    @padding_side.setter
    def padding_side(self, value: str) -> None:
        self._padding_side = check_side(value)

    @property
    def truncation_side(self) -> str:
        """ "right" or "left": which end truncation cuts."""
        return self._truncation_side

    @truncation_side.setter
    def truncation_side(self, value: str) -> None:
        self._truncation_side = check_side(value, "truncation_side")

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
            f"len={len(self)}, model_max_length={self.model_max_length}, "
            f"do_lower_case={self.do_lower_case}, padding_side={self.padding_side!r}, "
            f"truncation_side={self.truncation_side!r}, special_tokens={self.special_tokens_map}, "
            f"extra_special_tokens={self._extra_special})"
        )

    # ----------------------------------------------------------------------------- files
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """From a model folder: ``vocab.txt`` with optional ``tokenizer_config.json`` (its
        do_lower_case, strip_accents, tokenize_chinese_chars, never_split, special tokens,
        model_max_length, padding_side, truncation_side and extra special tokens are honoured),
        or a ``tokenizer.json`` holding a WordPiece model. Added tokens are read from
        tokenizer.json (else tokenizer_config.json's ``added_tokens_decoder``, else
        added_tokens.json). Keywords override the folder's settings (``padding_side="left"``);
        transformers' hub keywords (``cache_dir``, ``revision`` ...) say where a name's local copy
        is, as for the models; an unknown keyword is a TypeError."""
        hub = {k: overrides.pop(k) for k in list(overrides) if k in HUB_KEYWORDS}
        d = resolve_model_dir(path, **hub)
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file():
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        vocab: Path | dict[str, int] = d / "vocab.txt"
        if not vocab.is_file():
            if not (d / "tokenizer.json").is_file():
                raise FileNotFoundError(f"no vocab.txt or tokenizer.json in {d}")
            vocab, cfg = read_tokenizer_json(d / "tokenizer.json", cfg)
        kwargs: dict[str, Any] = {
            "name_or_path": str(path),
            "added_tokens": saved_added_tokens(d, cfg),
        }
        settings = (
            "do_lower_case",
            "strip_accents",
            "tokenize_chinese_chars",
            "never_split",
            "padding_side",
            "truncation_side",
            "clean_up_tokenization_spaces",
            "split_special_tokens",
        )
        for key in settings:
            if cfg.get(key) is not None:
                kwargs[key] = cfg[key]
        max_len = cfg.get("model_max_length")
        if isinstance(max_len, (int, float)) and max_len > 0:
            kwargs["model_max_length"] = int(max_len)
        for role in SPECIAL_TOKENS:
            value = cfg.get(role)
            if isinstance(value, dict):  # transformers' AddedToken spelling
                value = value.get("content")
            if isinstance(value, str):
                kwargs[role] = value
        extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens")
        if extra is None and (d / "special_tokens_map.json").is_file():
            extra = json.loads((d / "special_tokens_map.json").read_text(encoding="utf-8")).get(
                "additional_special_tokens"
            )
        if isinstance(extra, list):
            kwargs["extra_special_tokens"] = [
                t["content"] if isinstance(t, dict) else t for t in extra
            ]
        if overrides.pop("use_fast", True) is not True:
            raise ValueError(
                "use_fast=False asks for transformers' pure-Python tokenizer; bertlab has one "
                "tokenizer, run by the tokenizers engine as transformers' fast one"
            )
        allowed = {*settings, "model_max_length", "extra_special_tokens", *SPECIAL_TOKENS}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise TypeError(
                f"from_pretrained got unknown keywords {unknown}; bertlab's tokenizer takes "
                f"{sorted(allowed)}"
            )
        return cls(vocab, **{**kwargs, **overrides})

    def save_pretrained(
        self, directory: str | os.PathLike, legacy_format: bool | None = None
    ) -> tuple[str, ...]:
        """Write vocab.txt, tokenizer_config.json, special_tokens_map.json, tokenizer.json (with
        the added tokens) and, when tokens were added past the vocabulary, added_tokens.json:
        transformers loads the folder back and tokenizes identically. Returns the paths."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        special = {**self.special_tokens}
        if self._extra_special:
            special["additional_special_tokens"] = list(self._extra_special)
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "never_split": self.never_split or None,
            "model_max_length": self.model_max_length,
            "padding_side": self.padding_side,
            "truncation_side": self.truncation_side,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            **self.special_tokens,
        }
        if self._extra_special:
            config["extra_special_tokens"] = list(self._extra_special)
        engine, _ = self._engine(never_split=False)  # (never_split is a tokenizer_config setting)
        self._tok, _ = self._engine()
        files = {
            "vocab.txt": "".join(t + "\n" for t in self._lines),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
            "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
            "tokenizer.json": engine.to_str(),
        }
        added = {t: i for t, i in self.get_added_vocab().items() if i >= self.vocab_size}
        if added:
            files["added_tokens.json"] = json.dumps(added, indent=2) + "\n"
        for name, text in files.items():
            atomic_write(d / name, lambda p, text=text: Path(p).write_text(text, "utf-8"))
        return tuple(str(d / name) for name in files)

    # ----------------------------------------------------------------------------- basics
    @property
    def vocab_size(self) -> int:
        """The base vocabulary (added tokens not counted: ``len(tokenizer)`` counts them)."""
        return len(self.vocab)

    def __len__(self) -> int:
        return self._size

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False):
        """Word pieces of a text (or pair); without [CLS]/[SEP] unless asked."""
        _check_text(text, "text")
        if pair is not None:
            _check_text(pair, "text_pair")
        self._configure(None, None, 0)
        enc = self._tok.encode(text, pair, add_special_tokens=add_special_tokens)
        if self._unk_above is None:
            return enc.tokens
        return [
            self.unk_token if i >= self._unk_above else t
            for i, t in zip(enc.ids, enc.tokens, strict=True)
        ]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        """Ids of tokens (added ones included); an unknown token is [UNK]'s id."""
        if isinstance(tokens, str):
            return self._token_to_id(tokens)
        return [self._token_to_id(t) for t in tokens]

    def _token_to_id(self, token: str) -> int:
        i = self.vocab.get(token)
        if i is None:
            i = self._tok.token_to_id(token)
        if i is None or i >= self._size:
            return self._token_to_id(self.special_tokens["unk_token"])
        return i

    def convert_ids_to_tokens(
        self, ids: int | list[int], skip_special_tokens: bool = False
    ) -> str | list[str]:
        if isinstance(ids, (int, np.integer)) or (isinstance(ids, torch.Tensor) and ids.dim() == 0):
            return self._id_to_token(int(ids))
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._id_to_token(int(i)) for i in ids if int(i) not in special]

    def _id_to_token(self, i: int) -> str:
        if i in self.ids_to_tokens:
            return self.ids_to_tokens[i]
        if not 0 <= i < self._size:
            raise ValueError(f"token id {i} is outside the vocabulary (size {self._size})")
        return self._tok.id_to_token(i)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Word pieces back to text as ``decode`` writes it: ``##`` continuations joined to the
        previous piece, and the engine's WordPiece decoder's clean-up (no space before
        punctuation)."""
        decoder = self._tok.decoder
        if decoder is None:
            return " ".join(tokens).replace(" ##", "").strip()
        return decoder.decode(list(tokens))

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        **kwargs: Any,
    ) -> list[int] | torch.Tensor | np.ndarray:
        """Token ids of one text (or pair); ``return_tensors="pt"`` gives a (1, T) tensor. Takes
        the keywords of ``__call__``."""
        kwargs = {"return_token_type_ids": False, "return_attention_mask": False, **kwargs}
        return self(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)["input_ids"]

    def decode(
        self,
        token_ids: int | Iterable[int] | Iterable[Iterable[int]] | torch.Tensor | np.ndarray,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str | list[str]:
        """Text from ids: word pieces joined back (``play ##ing`` -> ``playing``). A batch (a
        2-D tensor or array, or a list of lists) gives a list of texts. With
        ``clean_up_tokenization_spaces`` (default: the tokenizer's setting, False) spaces before
        punctuation and contractions are removed."""
        ids = to_python(token_ids)
        if isinstance(ids, dict):
            ids = ids["input_ids"]
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], (list, tuple)):
            return [
                self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in ids
            ]
        ids = [int(i) for i in ids]
        for i in ids:
            self._id_to_token(i)
        text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        if clean_up_tokenization_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text

    def batch_decode(
        self,
        sequences: Iterable[Iterable[int]] | torch.Tensor | np.ndarray,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> list[str]:
        texts = self.decode(sequences, skip_special_tokens, clean_up_tokenization_spaces)
        return [texts] if isinstance(texts, str) else texts

    # ----------------------------------------------------------------------------- __call__
    def __call__(
        self,
        text: str | list[str] | list[list[str]] | None = None,
        text_pair: str | list[str] | list[list[str]] | None = None,
        text_target: Any = None,
        text_pair_target: Any = None,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | None = None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        verbose: bool = True,
        tokenizer_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> BatchEncoding:
        """Encode one text or a batch (and their pairs), as transformers' tokenizers do.

        padding: False | "longest" (True) | "max_length";  truncation: False | "longest_first"
        (True) | "only_first" | "only_second" (None: longest_first when max_length is given
        with padding=False, as transformers does);  max_length defaults to model_max_length.
        padding_side: "right" | "left" (default: the tokenizer's ``padding_side``).
        return_tensors: None (lists) | "pt" | "np" (int64 arrays).
        With ``return_overflowing_tokens``, a text too long for ``max_length`` gives several
        windows that overlap by ``stride`` tokens, and ``overflow_to_sample_mapping`` names the
        example each window came from (what SQuAD's document stride needs).
        ``is_split_into_words``: each text is a list of words (a batch, a list of such lists),
        each word tokenized on its own; ``word_ids()`` then index those words (for tagging).
        ``split_special_tokens=True`` tokenizes "[SEP]" in the text as text.
        ``tokenizer_kwargs``: more of these keywords, as a dict (they win over the others).

        Every keyword of transformers' ``__call__`` is accepted; ``text_target`` and
        ``text_pair_target`` (labels for sequence-to-sequence models) raise a TypeError. Unlike
        transformers, which passes unknown keywords on and ignores them, an unknown keyword (a
        typo) is a TypeError naming it and the supported set.
        """
        if tokenizer_kwargs is not None or kwargs.keys() - {"split_special_tokens"}:
            here = locals()
            options = {name: here[name] for name in CALL_OPTIONS}
            merged = {**options, **(tokenizer_kwargs or {}), **kwargs}
            merged.pop("max_target_length", None)  # (only read with text_target)
            unknown = sorted(merged.keys() - {*CALL_OPTIONS, "split_special_tokens"})
            if unknown:
                raise TypeError(
                    f"unknown keyword {', '.join(unknown)} for the tokenizer; supported: "
                    f"{', '.join((*CALL_OPTIONS, *EXTRA_CALL_OPTIONS))}"
                )
            return self(text, text_pair, text_target, text_pair_target, **merged)
        targets = (text_target, text_pair_target)
        for name, value in zip(UNSUPPORTED_CALL_OPTIONS, targets, strict=True):
            if value is not None:
                raise TypeError(
                    f"{name} is not supported by bertlab's tokenizer (BERT has no "
                    f"sequence-to-sequence labels); supported: {', '.join(CALL_OPTIONS)}"
                )
        split_special = kwargs.get("split_special_tokens", self.split_special_tokens)
        if is_split_into_words:
            single = bool(text) and all(isinstance(w, str) for w in text)
            texts = _as_word_lists(text, "text")
            pairs = None if text_pair is None else _as_word_lists(text_pair, "text_pair")
            if pairs is not None and single != (
                bool(text_pair) and all(isinstance(w, str) for w in text_pair)
            ):
                raise TypeError("text and text_pair must both be word lists or both batches")
            if return_overflowing_tokens or (pairs is not None and truncation not in (None, False)):
                raise ValueError(
                    "is_split_into_words supports truncation of single texts, "
                    "without overflowing windows"
                )
        else:
            single = isinstance(text, str)
            texts = _as_texts(text, "text")
            pairs = None if text_pair is None else _as_texts(text_pair, "text_pair")
        if pairs is not None and not is_split_into_words and single != isinstance(text_pair, str):
            raise TypeError("text and text_pair must both be a str or both be a list of str")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} text pairs")
        if truncation is None:
            truncation = max_length is not None and padding is False
        if truncation not in TRUNCATION:
            raise ValueError(f"truncation {truncation!r} is not one of {list(TRUNCATION)}")
        return_tensors = check_tensor_type(return_tensors)
        side = self.padding_side if padding_side is None else check_side(padding_side)
        trunc = TRUNCATION[truncation]
        pad, pad_length = self._padding_plan(
            padding, TRUNCATION[truncation], max_length, pad_to_multiple_of, verbose
        )
        limit = max_length
        if trunc is not None and limit is None:
            if self.model_max_length >= NO_LIMIT:
                if verbose:
                    warnings.warn(
                        f"truncation={truncation!r} without max_length, and this tokenizer has no "
                        "model_max_length: nothing is truncated (as in transformers); pass "
                        "max_length",
                        stacklevel=2,
                    )
                trunc = None
            else:
                limit = self.model_max_length
        if trunc is not None and not is_split_into_words:
            self._check_window(
                texts, pairs, trunc, limit, stride, add_special_tokens, return_overflowing_tokens
            )

        self._configure(
            trunc and (limit, trunc, stride), pad and (pad, pad_length, side), pad_to_multiple_of
        )
        self._tok.encode_special_tokens = bool(split_special)
        inputs = texts if pairs is None else list(zip(texts, pairs, strict=True))
        if (
            is_split_into_words
            and trunc is not None
            and limit <= self.num_special_tokens_to_add(pairs is not None)
        ):
            raise ValueError(f"max_length {limit} leaves no room for text")
        encodings = self._tok.encode_batch(
            inputs, is_pretokenized=is_split_into_words, add_special_tokens=add_special_tokens
        )
        windows, sample = [], []
        for i, enc in enumerate(encodings):
            parts = [enc, *enc.overflowing] if return_overflowing_tokens else [enc]
            windows += parts
            sample += [i] * len(parts)
        if return_tensors == "pt" and len({len(e.ids) for e in windows}) > 1:
            lengths = sorted({len(e.ids) for e in windows})
            raise ValueError(
                f"sequences of different lengths ({lengths[0]} to {lengths[-1]} tokens) cannot "
                "form one tensor: pass padding=True"
            )

        data: dict[str, Any] = {"input_ids": [e.ids for e in windows]}
        if self._unk_above is not None:
            top, unk = self._unk_above, self.unk_token_id
            data["input_ids"] = [[unk if i >= top else i for i in ids] for ids in data["input_ids"]]
        if return_token_type_ids is not False:  # (None: BERT's inputs hold them)
            data["token_type_ids"] = [e.type_ids for e in windows]
        if return_attention_mask is not False:
            data["attention_mask"] = [e.attention_mask for e in windows]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in windows]
        if return_offsets_mapping:
            data["offset_mapping"] = [[tuple(o) for o in e.offsets] for e in windows]
        if return_length:
            data["length"] = [len(e.ids) for e in windows]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample
        if limit is None and verbose and not self._warned_long:
            longest = max((len(ids) for ids in data["input_ids"]), default=0)
            if longest > self.model_max_length:
                self._warned_long = True
                logger.warning(
                    "Token indices sequence length is longer than the specified maximum sequence "
                    f"length for this model ({longest} > {self.model_max_length}). Running this "
                    "sequence through the model will result in indexing errors"
                )
        if return_tensors is None and single and not return_overflowing_tokens:
            data = {k: (v if k == "length" else v[0]) for k, v in data.items()}  # ("length" as in
            # transformers: a list)
        return BatchEncoding(data, windows, tensor_type=return_tensors)

    # ----------------------------------------------------------------------------- helpers
    def _padding_plan(
        self,
        padding: Any,
        trunc: str | None,
        max_length: int | None,
        multiple: int | None,
        verbose: bool,
    ) -> tuple[str | None, int | None]:
        """(None | "longest" | "max_length", the length for "max_length"), as transformers
        decides them: "max_length" without max_length pads to model_max_length, and not at all
        when there is none."""
        if padding not in PADDING:
            raise ValueError(f"padding {padding!r} is not one of {list(PADDING)}")
        if multiple is not None and (not isinstance(multiple, int) or multiple <= 0):
            raise ValueError(f"pad_to_multiple_of must be a positive integer, got {multiple!r}")
        kind = PADDING[padding]
        if padding is True and max_length is not None and trunc is None and verbose:
            warnings.warn(MAX_LENGTH_IGNORED, stacklevel=3)
        if kind == "max_length" and max_length is None:
            if self.model_max_length >= NO_LIMIT:
                return None, None
            max_length = self.model_max_length
        limit = max_length if max_length is not None else self.model_max_length
        if trunc and kind and multiple and limit < NO_LIMIT and limit % multiple:
            raise ValueError(
                f"truncation to {limit} tokens and padding to a multiple of {multiple} cannot "
                "both hold: make max_length a multiple of pad_to_multiple_of"
            )
        return kind, max_length if kind == "max_length" else None

    def _configure(self, trunc: tuple | None, pad: tuple | None, multiple: int | None) -> None:
        """Set the engine's truncation and padding for one call (both off when None)."""
        self._tok.encode_special_tokens = self.split_special_tokens
        if trunc is None:
            self._tok.no_truncation()
        else:
            limit, strategy, stride = trunc
            self._tok.enable_truncation(
                limit, stride=stride, strategy=strategy, direction=self.truncation_side
            )
        if pad is None:
            self._tok.no_padding()
        else:
            kind, limit, side = pad
            self._tok.enable_padding(
                direction=side,
                pad_id=self.pad_token_id,
                pad_type_id=self.pad_token_type_id,
                pad_token=self.pad_token,
                length=limit if kind == "max_length" else None,
                pad_to_multiple_of=multiple,
            )

    def _check_window(
        self,
        texts: list[str],
        pairs: list[str] | None,
        strategy: str,
        max_length: int,
        stride: int,
        add_special_tokens: bool,
        overflow: bool,
    ) -> None:
        """Refuse, before any work, a window that cannot hold the special tokens, the part that
        is not truncated, or more than ``stride`` new tokens."""
        specials = self.num_special_tokens_to_add(pairs is not None) if add_special_tokens else 0
        if not isinstance(max_length, int) or max_length <= specials:
            raise ValueError(
                f"max_length {max_length} leaves no room for text: it must be greater than the "
                f"{specials} special tokens"
            )
        if not isinstance(stride, int) or stride < 0:
            raise ValueError(f"stride must be a non-negative integer, got {stride!r}")
        if pairs is not None and strategy == "longest_first" and overflow:
            raise ValueError(
                "overflowing windows of text pairs need truncation='only_first' or "
                "'only_second' (which text to slide over), not 'longest_first'"
            )
        if pairs is None or strategy == "longest_first":
            window = max_length - specials
            if overflow and stride >= window:
                raise ValueError(
                    f"stride {stride} must be smaller than the window of {window} tokens "
                    f"(max_length {max_length} less {specials} special tokens)"
                )
            return
        kept = pairs if strategy == "only_first" else texts  # the side that is not truncated
        name = "text_pair" if strategy == "only_first" else "text"
        self._configure(None, None, 0)
        for i, enc in enumerate(self._tok.encode_batch(kept, add_special_tokens=False)):
            window = max_length - specials - len(enc.ids)
            if window <= 0 or (overflow and stride >= window):
                raise ValueError(
                    f"example {i}: its {name} has {len(enc.ids)} tokens, which leaves a window "
                    f"of {window} tokens in max_length {max_length} (with {specials} special "
                    f"tokens){f' for stride {stride}' if overflow else ''}; shorten it or raise "
                    "max_length"
                )


def _check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}: {text!r:.60}")


def _as_texts(value: Any, name: str) -> list[str]:
    """One str, or a list/tuple of str: anything else (None, bytes, numbers, nested lists) is
    a TypeError that says what was expected."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a str or a list of str, got {type(value).__name__}")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(t).__name__}: {t!r:.60}")
    return list(value)


def _as_word_lists(value: Any, name: str) -> list[list[str]]:
    """One list of words, or a list of such lists (is_split_into_words)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(w, str) for w in value):
        return [list(value)]
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of words or a list of such lists, got {type(value).__name__}"
        )
    return [
        _as_texts(list(words), f"{name}[{i}]")
        if isinstance(words, (list, tuple))
        else _as_texts(words, f"{name}[{i}]")
        for i, words in enumerate(value)
    ]

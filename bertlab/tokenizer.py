"""BertTokenizer: BERT's WordPiece tokenization, run by the Rust ``tokenizers`` engine.

bertlab configures the engine exactly as BERT needs (reference 000, 002, 004): clean the text,
put spaces around CJK characters, lower-case and strip accents for uncased vocabularies, split on
whitespace and punctuation, greedy longest-match WordPiece (``playing`` -> ``play ##ing``; a word
over 100 characters -> ``[UNK]``), then ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with
segment ids 0 for A and 1 for B. The engine does the work; this file holds the configuration,
the checks on what callers pass, and the API that transformers users know.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import (
    AddedToken,
    Encoding,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from bertlab.files import atomic_write, resolve_model_dir

# Role -> the token BERT uses for it. Every vocabulary must hold all five.
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
MAX_WORD_CHARS = 100  # longer words become [UNK], as in the original BERT
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


def read_vocab(path: str | os.PathLike) -> list[str]:
    """vocab.txt: one token per line, the line number is its id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no vocabulary file at {path}")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


class BatchEncoding(dict):
    """``input_ids``, ``token_type_ids``, ``attention_mask`` (and what else was asked for), as
    lists or tensors; per sequence, ``tokens(i)``, ``word_ids(i)`` and ``sequence_ids(i)``."""

    def __init__(self, data: dict[str, Any], encodings: list[Encoding]):
        super().__init__(data)
        self.encodings = encodings

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def tokens(self, i: int = 0) -> list[str]:
        return self.encodings[i].tokens

    def word_ids(self, i: int = 0) -> list[int | None]:
        """Index of the word each token comes from (None for special tokens and padding)."""
        return self.encodings[i].word_ids

    def sequence_ids(self, i: int = 0) -> list[int | None]:
        """0 or 1: the segment each token comes from (None for special tokens and padding)."""
        return self.encodings[i].sequence_ids


class BertTokenizer:
    """WordPiece tokenizer for BERT. Build with ``from_pretrained(dir)`` or from a vocab.txt."""

    def __init__(
        self,
        vocab: str | os.PathLike | dict[str, int],
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        never_split: Iterable[str] | None = None,
        model_max_length: int = 512,
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
        missing = [t for t in self.special_tokens.values() if t not in self.vocab]
        if missing:
            where = "" if isinstance(vocab, dict) else f" {vocab}"
            raise ValueError(f"vocabulary{where} lacks the special tokens {', '.join(missing)}")
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.never_split = sorted(set(never_split or ()))
        self.model_max_length = model_max_length
        for role, token in self.special_tokens.items():
            setattr(self, role, token)
            setattr(self, f"{role}_id", self.vocab[token])

        tok = Tokenizer(
            models.WordPiece(
                self.vocab, unk_token=self.unk_token, max_input_chars_per_word=MAX_WORD_CHARS
            )
        )
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,  # None: strip when lower-casing, as BERT does
            lowercase=do_lower_case,
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls, sep = self.cls_token, self.sep_token
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, self.cls_token_id), (sep, self.sep_token_id)],
        )
        tok.decoder = decoders.WordPiece(prefix="##")
        # Special tokens are found anywhere in the text and never split or lower-cased.
        specials = [AddedToken(t, normalized=False) for t in self.special_tokens.values()]
        tok.add_special_tokens(specials)
        # never_split words are kept whole where they stand as words, as in the original code:
        # a word W matches text that is W, or (uncased) text that lower-cases to W. The first is
        # an exact match; when W is already in normal form the match on normalised text gives
        # both. A word the vocabulary lacks becomes [UNK] (the engine gives it an id past the
        # vocabulary, mapped back after encoding).
        norm = tok.normalizer.normalize_str
        words = [AddedToken(w, single_word=True, normalized=norm(w) == w) for w in self.never_split]
        tok.add_tokens(words)
        outside = any(t not in self.vocab for t in self.never_split)
        self._unk_above = len(self._lines) if outside else None
        self._tok = tok

    # ----------------------------------------------------------------------------- files
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **overrides: Any) -> BertTokenizer:
        """From a model folder: ``vocab.txt`` with optional ``tokenizer_config.json`` (its
        do_lower_case, strip_accents, tokenize_chinese_chars, never_split, special tokens and
        model_max_length are honoured), or a ``tokenizer.json`` holding a WordPiece model."""
        d = resolve_model_dir(path)
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file():
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        vocab: Path | dict[str, int] = d / "vocab.txt"
        if not vocab.is_file():
            if not (d / "tokenizer.json").is_file():
                raise FileNotFoundError(f"no vocab.txt or tokenizer.json in {d}")
            vocab, cfg = _read_tokenizer_json(d / "tokenizer.json", cfg)
        kwargs: dict[str, Any] = {}
        for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "never_split"):
            if cfg.get(key) is not None:
                kwargs[key] = cfg[key]
        max_len = cfg.get("model_max_length")
        if isinstance(max_len, int) and 0 < max_len < 10**9:  # transformers writes 1e30 for "none"
            kwargs["model_max_length"] = max_len
        for role in SPECIAL_TOKENS:
            value = cfg.get(role)
            if isinstance(value, dict):  # transformers' AddedToken spelling
                value = value.get("content")
            if isinstance(value, str):
                kwargs[role] = value
        return cls(vocab, **{**kwargs, **overrides})

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write vocab.txt, tokenizer_config.json, special_tokens_map.json and tokenizer.json
        (transformers loads them back and tokenizes identically)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "never_split": self.never_split or None,
            "model_max_length": self.model_max_length,
            **self.special_tokens,
        }
        self._configure(None, None, 0)
        files = {
            "vocab.txt": "".join(t + "\n" for t in self._lines),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
            "special_tokens_map.json": json.dumps(self.special_tokens, indent=2) + "\n",
            "tokenizer.json": self._tok.to_str(),
        }
        for name, text in files.items():
            atomic_write(d / name, lambda p, text=text: Path(p).write_text(text, "utf-8"))

    # ----------------------------------------------------------------------------- basics
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self.vocab[t] for t in self.special_tokens.values())

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
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(
        self, ids: int | list[int], skip_special_tokens: bool = False
    ) -> str | list[str]:
        if isinstance(ids, int):
            return self._id_to_token(ids)
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._id_to_token(int(i)) for i in ids if int(i) not in special]

    def _id_to_token(self, i: int) -> str:
        if i not in self.ids_to_tokens:
            raise ValueError(f"token id {i} is outside the vocabulary (size {len(self.vocab)})")
        return self.ids_to_tokens[i]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Word pieces back to text: ``##`` continuations joined to the previous piece."""
        return " ".join(tokens).replace(" ##", "").strip()

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
    ) -> list[int] | torch.Tensor:
        """Token ids of one text (or pair); ``return_tensors="pt"`` gives a (1, T) tensor."""
        enc = self(
            text,
            text_pair,
            add_special_tokens=add_special_tokens,
            truncation=truncation,
            max_length=max_length,
            return_tensors=return_tensors,
            return_token_type_ids=False,
            return_attention_mask=False,
        )
        return enc["input_ids"]

    def decode(self, ids: Iterable[int] | torch.Tensor, skip_special_tokens: bool = False) -> str:
        """Text from ids: word pieces joined back (``play ##ing`` -> ``playing``)."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2:
                return self.batch_decode(ids, skip_special_tokens=skip_special_tokens)
            ids = ids.reshape(-1).tolist()
        ids = [int(i) for i in ids]
        for i in ids:
            self._id_to_token(i)
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def batch_decode(self, batch: Iterable[Iterable[int]] | torch.Tensor, **kwargs: Any):
        return [self.decode(ids, **kwargs) for ids in batch]

    # ----------------------------------------------------------------------------- __call__
    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        stride: int = 0,
        pad_to_multiple_of: int | None = None,
        return_overflowing_tokens: bool = False,
        return_offsets_mapping: bool = False,
        return_special_tokens_mask: bool = False,
        return_token_type_ids: bool = True,
        return_attention_mask: bool = True,
        return_length: bool = False,
        return_tensors: str | None = None,
        is_split_into_words: bool = False,
    ) -> BatchEncoding:
        """Encode one text or a batch (and their pairs), as transformers' tokenizers do.

        padding: False | "longest" (True) | "max_length";  truncation: False | "longest_first"
        (True) | "only_first" | "only_second" (None: longest_first when max_length is given
        without padding, as transformers does);  max_length defaults to model_max_length.
        With ``return_overflowing_tokens``, a text too long for ``max_length`` gives several
        windows that overlap by ``stride`` tokens, and ``overflow_to_sample_mapping`` names the
        example each window came from (what SQuAD's document stride needs).
        ``is_split_into_words``: each text is a list of words (a batch, a list of such lists),
        each word tokenized on its own; ``word_ids()`` then index those words (for tagging).
        """
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
        if padding not in PADDING:
            raise ValueError(f"padding {padding!r} is not one of {list(PADDING)}")
        if truncation is None:
            truncation = max_length is not None and PADDING.get(padding, 0) is None
        if truncation not in TRUNCATION:
            raise ValueError(f"truncation {truncation!r} is not one of {list(TRUNCATION)}")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors {return_tensors!r}: only 'pt' or None")
        pad, trunc = PADDING[padding], TRUNCATION[truncation]
        if return_overflowing_tokens and trunc is None:
            trunc = "longest_first"
        limit = self.model_max_length if max_length is None else max_length
        if trunc is not None and not is_split_into_words:
            self._check_window(
                texts, pairs, trunc, limit, stride, add_special_tokens, return_overflowing_tokens
            )
        if pad == "max_length" and max_length is None:
            limit = self.model_max_length

        self._configure(trunc and (limit, trunc, stride), pad and (pad, limit), pad_to_multiple_of)
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
        if return_token_type_ids:
            data["token_type_ids"] = [e.type_ids for e in windows]
        if return_attention_mask:
            data["attention_mask"] = [e.attention_mask for e in windows]
        if return_special_tokens_mask:
            data["special_tokens_mask"] = [e.special_tokens_mask for e in windows]
        if return_offsets_mapping:
            data["offset_mapping"] = [[tuple(o) for o in e.offsets] for e in windows]
        if return_length:
            data["length"] = [len(e.ids) for e in windows]
        if return_overflowing_tokens:
            data["overflow_to_sample_mapping"] = sample
        if return_tensors == "pt":
            data = {k: torch.tensor(v) for k, v in data.items()}
        elif single and not return_overflowing_tokens:  # transformers keeps "length" a list
            data = {k: (v if k == "length" else v[0]) for k, v in data.items()}
        return BatchEncoding(data, windows)

    # ----------------------------------------------------------------------------- helpers
    def _configure(self, trunc: tuple | None, pad: tuple | None, multiple: int | None) -> None:
        """Set the engine's truncation and padding for one call (both off when None)."""
        if trunc is None:
            self._tok.no_truncation()
        else:
            limit, strategy, stride = trunc
            self._tok.enable_truncation(limit, stride=stride, strategy=strategy)
        if pad is None:
            self._tok.no_padding()
        else:
            kind, limit = pad
            self._tok.enable_padding(
                pad_id=self.pad_token_id,
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


def _read_tokenizer_json(path: Path, cfg: dict[str, Any]) -> tuple[dict[str, int], dict]:
    """The WordPiece vocabulary of a tokenizer.json, and its normaliser's settings as
    tokenizer_config keys (those already in ``cfg`` win)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    model = data.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ValueError(f"{path} holds a {model.get('type')!r} model, not BERT's WordPiece")
    norm = data.get("normalizer") or {}
    cfg = dict(cfg)
    if norm.get("type") == "BertNormalizer":
        cfg.setdefault("do_lower_case", norm.get("lowercase", True))
        cfg.setdefault("strip_accents", norm.get("strip_accents"))
        cfg.setdefault("tokenize_chinese_chars", norm.get("handle_chinese_chars", True))
    return dict(model["vocab"]), cfg


# ============================================================================ vocabulary training
def _lines(files: list[Path]) -> Iterator[str]:
    """Each line of each file, decoded strictly: invalid UTF-8 names the file and line."""
    for path in files:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(
                        f"{path}, line {number}: invalid UTF-8 at byte {e.start}: {raw[:60]!r}"
                    ) from None


def train_vocab(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    vocab_size: int,
    output_dir: str | os.PathLike,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> Path:
    """Train a WordPiece vocabulary on raw text and write ``vocab.txt`` (special tokens first:
    [PAD]=0, [UNK], [CLS], [SEP], [MASK]) and ``tokenizer_config.json`` into ``output_dir``,
    which ``BertTokenizer.from_pretrained(output_dir)`` then loads. Returns the vocab path."""
    paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else [Path(f) for f in files]
    if not paths:
        raise ValueError("train_vocab needs at least one text file")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no text file at {p}")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if not isinstance(vocab_size, int) or vocab_size <= len(specials):
        raise ValueError(f"vocab_size must be an integer above {len(specials)}, got {vocab_size!r}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=MAX_WORD_CHARS))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        special_tokens=specials,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_lines(paths), trainer=trainer)  # reads every line before writing
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    if len(vocab) <= len(specials):
        raise ValueError(f"no text to learn a vocabulary from in {', '.join(map(str, paths))}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": 512,
    }
    text = "".join(t + "\n" for t, _ in vocab)
    atomic_write(out / "vocab.txt", lambda p: Path(p).write_text(text, "utf-8"))
    atomic_write(
        out / "tokenizer_config.json",
        lambda p: Path(p).write_text(json.dumps(config, indent=2) + "\n", "utf-8"),
    )
    return out / "vocab.txt"

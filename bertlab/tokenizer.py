"""BertTokenizer: BERT's WordPiece tokenization, run by the Rust ``tokenizers`` engine.

bertlab configures the engine exactly as BERT needs (reference 000, 002, 004): clean the text,
split around CJK characters, lower-case and strip accents for uncased vocabularies, split on
whitespace and punctuation, greedy longest-match WordPiece (``playing`` -> ``play ##ing``, words
over 100 characters -> ``[UNK]``), then ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with
segment ids 0 for A and 1 for B.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .checkpoint import resolve_model_dir

SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def read_vocab(path: str | os.PathLike) -> dict[str, int]:
    """vocab.txt: one token per line, the line number is the id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no vocabulary file at {path}")
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            vocab.setdefault(line.rstrip("\n"), i)
    missing = [t for t in SPECIAL_TOKENS.values() if t not in vocab]
    if missing:
        raise ValueError(f"vocabulary {path} lacks the special tokens {missing}")
    return vocab


class BertTokenizer:
    """WordPiece tokenizer for BERT. Build with ``from_pretrained(dir)`` or from a vocab.txt."""

    def __init__(
        self,
        vocab_file: str | os.PathLike,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        model_max_length: int = 512,
    ):
        self.vocab = read_vocab(vocab_file)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.model_max_length = model_max_length
        for attr, token in SPECIAL_TOKENS.items():
            setattr(self, attr, token)
        self.pad_token_id = self.vocab[self.pad_token]
        self.cls_token_id = self.vocab[self.cls_token]
        self.sep_token_id = self.vocab[self.sep_token]
        self.mask_token_id = self.vocab[self.mask_token]
        self.unk_token_id = self.vocab[self.unk_token]

        tok = Tokenizer(
            models.WordPiece(self.vocab, unk_token="[UNK]", max_input_chars_per_word=100)
        )
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,  # None: follow lowercase, as BERT does
            lowercase=do_lower_case,
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", self.cls_token_id), ("[SEP]", self.sep_token_id)],
        )
        tok.decoder = decoders.WordPiece(prefix="##")
        tok.add_special_tokens(list(SPECIAL_TOKENS.values()))  # never split, even inside text
        self._tok = tok

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> BertTokenizer:
        """From a model folder with ``vocab.txt`` (and optional ``tokenizer_config.json``)."""
        d = resolve_model_dir(path)
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file():
            cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        return cls(
            d / "vocab.txt",
            do_lower_case=cfg.get("do_lower_case", True),
            strip_accents=cfg.get("strip_accents"),
            tokenize_chinese_chars=cfg.get("tokenize_chinese_chars", True),
            model_max_length=min(int(cfg.get("model_max_length", 512)), 10**6),
        )

    # ----------------------------------------------------------------------------- basics
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        """Word pieces of one text, without special tokens."""
        _check_text(text)
        return self._tok.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self.ids_to_tokens[ids]
        return [self.ids_to_tokens[int(i)] for i in ids]

    def encode(
        self,
        text: str,
        text_pair: str | None = None,
        add_special_tokens: bool = True,
        return_tensors: str | None = None,
    ) -> list[int] | torch.Tensor:
        """Token ids of one text (or pair); ``return_tensors="pt"`` gives a (1, T) tensor."""
        _check_text(text)
        if text_pair is not None:
            _check_text(text_pair)
        ids = self._tok.encode(text, text_pair, add_special_tokens=add_special_tokens).ids
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def decode(self, ids: list[int] | torch.Tensor, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """input_ids, token_type_ids and attention_mask for one text or a batch (lists of
        lists, or (B, T) tensors with ``return_tensors="pt"``, which pads to the longest)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        pairs = None if text_pair is None else ([text_pair] if single else list(text_pair))
        for t in texts + (pairs or []):
            _check_text(t)
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        tok = self._tok
        limit = max_length or self.model_max_length
        if truncation:
            tok.enable_truncation(limit)
        else:
            tok.no_truncation()
        if padding or return_tensors == "pt":
            length = limit if padding == "max_length" else None
            tok.enable_padding(pad_id=self.pad_token_id, pad_token=self.pad_token, length=length)
        else:
            tok.no_padding()
        encs = tok.encode_batch(texts if pairs is None else list(zip(texts, pairs, strict=True)))
        out = {
            "input_ids": [e.ids for e in encs],
            "token_type_ids": [e.type_ids for e in encs],
            "attention_mask": [e.attention_mask for e in encs],
        }
        if return_tensors == "pt":
            return {k: torch.tensor(v) for k, v in out.items()}
        return {k: v[0] for k, v in out.items()} if single else out


def _check_text(text: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"expected text as str, got {type(text).__name__}: {text!r:.60}")

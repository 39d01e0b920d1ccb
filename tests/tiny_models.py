"""Shared by the server and pipeline tests: tiny scrambled models saved as folders, and the
generated texts the fuzz tests send (unpaired surrogates among NUL and control characters,
combining marks, right-to-left scripts and emoji)."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import scramble

import bertlab
from bertlab.files import resolve_model_dir

DEFAULT = resolve_model_dir("default")
# What the generated texts are made of, beside any valid code point: each is text (text.py)
# except the surrogates, which every pipeline and route must refuse by field and position.
ODD = [
    "\x00",  # NUL
    "\x07",
    "\x1b",
    "\x7f",
    "\x85",  # control characters
    "\t",
    "\n",
    "\u0301",
    "\u0327",
    "\u20dd",  # combining marks
    "\u05e9\u05dc\u05d5\u05dd",
    "\u0645\u0631\u062d\u0628\u0627",
    "\u200f",
    "\u202e",  # right to left
    "\U0001f600",
    "\U0001f44d\U0001f3fd",
    "\U0001f1eb\U0001f1f7",
    "\u200d",  # emoji
    "\ufeff",
    "\uffff",
    "\ue000",
    " ",
    "Paris",
    "river",
    "[UNK]",
]


def tiny(cls: type, folder: Path, seed: int, **config) -> Path:
    """A small scrambled model with the bundled vocabulary and 64 positions (so that long
    texts are cheap), saved to ``folder`` with the bundled tokenizer."""
    cfg = bertlab.BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        **config,
    )
    torch.manual_seed(seed)
    model = scramble(cls(cfg), seed).eval()
    model.save_pretrained(folder)
    bertlab.BertTokenizer.from_pretrained(DEFAULT).save_pretrained(folder)
    return folder


def texts(st, max_size: int = 8):
    """A hypothesis strategy: short texts of ODD pieces and any other code point, one in five of
    them holding an unpaired surrogate too (``st``: hypothesis.strategies)."""
    valid = st.lists(st.one_of(st.sampled_from(ODD), st.characters()), max_size=max_size)
    surrogate = st.integers(0xD800, 0xDFFF).map(chr)  # refused wherever it comes
    invalid = st.tuples(valid, surrogate, valid).map(lambda x: [*x[0], x[1], *x[2]])
    return st.integers(0, 4).flatmap(lambda k: invalid if k == 0 else valid).map("".join)

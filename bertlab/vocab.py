"""Vocabulary files: reading vocab.txt and what a saved tokenizer folder adds to it (added
tokens, the normaliser settings of a tokenizer.json), and training a WordPiece vocabulary.

A leaf beside ``tokenizer.py``: it imports only ``files.py`` and the ``tokenizers`` engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, trainers

from bertlab.files import atomic_write

MAX_WORD_CHARS = 100  # longer words become [UNK], as in the original BERT
# Role -> the token BERT uses for it. Every vocabulary must hold all five.
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


def read_vocab(path: str | os.PathLike) -> list[str]:
    """vocab.txt: one token per line, the line number is its id."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no vocabulary file at {path}")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def added_token(entry: Mapping[str, Any]) -> AddedToken:
    """An AddedToken from a saved entry (tokenizer.json's spelling)."""
    special = bool(entry.get("special", False))
    return AddedToken(
        entry["content"],
        single_word=bool(entry.get("single_word", False)),
        lstrip=bool(entry.get("lstrip", False)),
        rstrip=bool(entry.get("rstrip", False)),
        normalized=bool(entry.get("normalized", not special)),
        special=special,
    )


def saved_added_tokens(d: Path, cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The added tokens a folder holds, as tokenizer.json entries: from tokenizer.json, else
    tokenizer_config.json's ``added_tokens_decoder``, else added_tokens.json (whose tokens are
    special when special_tokens_map.json lists them)."""
    if (d / "tokenizer.json").is_file():
        data = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        return [dict(entry) for entry in data.get("added_tokens") or ()]
    if isinstance(cfg.get("added_tokens_decoder"), dict):
        return [{**v, "id": int(k)} for k, v in cfg["added_tokens_decoder"].items()]
    if (d / "added_tokens.json").is_file():
        added = json.loads((d / "added_tokens.json").read_text(encoding="utf-8"))
        special: set[str] = set()
        if (d / "special_tokens_map.json").is_file():
            listed = json.loads((d / "special_tokens_map.json").read_text(encoding="utf-8"))
            for value in listed.values():
                for t in value if isinstance(value, list) else [value]:
                    special.add(t["content"] if isinstance(t, dict) else t)
        return [{"id": i, "content": t, "special": t in special} for t, i in added.items()]
    return []


def read_tokenizer_json(path: Path, cfg: dict[str, Any]) -> tuple[dict[str, int], dict]:
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

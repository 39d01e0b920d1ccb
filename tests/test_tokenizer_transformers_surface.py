"""Code written for transformers' tokenizer runs on bertlab.BertTokenizer with only the import
changed, and gives the same results.

Each test calls the same code on ``transformers.AutoTokenizer.from_pretrained(folder)`` and on
``bertlab.BertTokenizer.from_pretrained(folder)`` (the bundled all-MiniLM-L6-v2 folder, or a
folder one of them saved) and compares what comes back: ids, masks, strings, shapes, dtypes.
transformers' data collators are run on both tokenizers too. transformers is a test-only
dependency: bertlab never imports it.
"""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bertlab
from bertlab import BertTokenizer
from bertlab.encoding import BatchEncoding

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers / huggingface_hub read it

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
)

FOLDER = Path(bertlab.bundled_model_dir())
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world!",
    "BERT's WordPiece splits unaffable words: un ##aff ##able.",
    "a",
    "Don't stop believing , it 's fine .",
]
PAIRS = ["What jumps?", "Who?", "What splits?", "b", "Really?"]


@pytest.fixture(scope="module")
def both() -> tuple[Any, BertTokenizer]:
    """(transformers' tokenizer, bertlab's) on the same folder."""
    return AutoTokenizer.from_pretrained(str(FOLDER)), BertTokenizer.from_pretrained(FOLDER)


def fresh() -> tuple[Any, BertTokenizer]:
    """A pair that a test may change (add tokens to)."""
    return AutoTokenizer.from_pretrained(str(FOLDER)), BertTokenizer.from_pretrained(FOLDER)


def plain(value: Any) -> Any:
    """Tensors and arrays as lists (with their kind, dtype and shape), for comparing."""
    if isinstance(value, torch.Tensor):
        return ("pt", str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return ("np-object", value.shape, [plain(v) for v in value])
        return ("np", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def assert_same(ours: Any, ref: Any, what: str = "") -> None:
    """Same keys in the same order, the same values (and tensor kinds, dtypes, shapes)."""
    assert list(ours.keys()) == list(ref.keys()), f"{what}: {list(ours)} vs {list(ref)}"
    for key in ref.keys():
        assert plain(ours[key]) == plain(ref[key]), f"{what}: field {key} differs"


# ================================================================================ __call__
CALLS = {
    "one text": (("Hello, world!",), {}),
    "one pair": (("Hello, world!", "and a pair"), {}),
    "batch, longest": ((TEXTS,), dict(padding=True)),
    "batch pairs, longest": ((TEXTS, PAIRS), dict(padding="longest")),
    "max_length padding": ((TEXTS,), dict(padding="max_length", max_length=24)),
    "truncation": ((TEXTS,), dict(truncation=True, max_length=6)),
    "only_second": ((TEXTS, PAIRS), dict(truncation="only_first", max_length=9)),
    "multiple of 8": ((TEXTS,), dict(padding=True, pad_to_multiple_of=8)),
    "left padding": ((TEXTS,), dict(padding=True, padding_side="left")),
    "left, max_length": ((TEXTS,), dict(padding="max_length", max_length=20, padding_side="left")),
    "pt": ((TEXTS,), dict(padding=True, return_tensors="pt")),
    "np": ((TEXTS,), dict(padding=True, return_tensors="np")),
    "np one text": (("Hello, world!",), dict(return_tensors="np")),
    "np ragged": ((TEXTS,), dict(return_tensors="np")),
    "no type ids": ((TEXTS,), dict(return_token_type_ids=False, return_attention_mask=False)),
    "extras": (
        (TEXTS, PAIRS),
        dict(
            padding=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_length=True,
        ),
    ),
    "extras left": (
        (TEXTS,),
        dict(padding=True, padding_side="left", return_special_tokens_mask=True, return_length=1),
    ),
    "overflow": (
        ("the quick brown fox " * 10,),
        dict(max_length=12, stride=3, return_overflowing_tokens=True, truncation=True),
    ),
    "overflow, padded": (
        (["the quick brown fox " * 10, "short"],),
        dict(
            max_length=12, stride=3, return_overflowing_tokens=True, truncation=True, padding=True
        ),
    ),
    "overflow, no truncation": ((TEXTS,), dict(return_overflowing_tokens=True)),
    "words": ((["Hello", "wonderful", "world"],), dict(is_split_into_words=True)),
    "word batches": (
        ([["Hello", "there"], ["unaffable", "words", "here"]],),
        dict(is_split_into_words=True, padding=True, return_tensors="pt"),
    ),
    "no specials": ((TEXTS,), dict(add_special_tokens=False, padding=True)),
    "verbose off": ((TEXTS,), dict(padding=True, verbose=False)),
    "split specials": (("a [SEP] b [MASK]",), dict(split_special_tokens=True)),
    "tokenizer_kwargs": (
        (TEXTS,),
        dict(tokenizer_kwargs={"padding": True, "truncation": True, "max_length": 7}),
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_call_like_transformers(both, name):
    ref_tok, ours_tok = both
    args, kwargs = CALLS[name]
    ref, ours = ref_tok(*args, **kwargs), ours_tok(*args, **kwargs)
    assert isinstance(ours, BatchEncoding)
    assert_same(ours, ref, name)
    rows = len(ref["input_ids"]) if not isinstance(ref["input_ids"][0], int) else 1
    for i in range(rows):
        assert ours.word_ids(i) == ref.word_ids(i)
        assert ours.tokens(i) == ref.tokens(i)
        assert ours.sequence_ids(i) == ref.sequence_ids(i)


def test_left_padding_really_pads_on_the_left(both):
    _, tok = both
    enc = tok(["a", "a much longer text here"], padding=True, padding_side="left")
    assert enc["input_ids"][0][0] == tok.pad_token_id and enc["input_ids"][0][-1] == 102
    assert enc["attention_mask"][0][0] == 0 and enc["attention_mask"][0][-1] == 1
    assert enc.word_ids(0)[0] is None and enc.word_ids(0)[-2] == 0


def test_padding_side_from_pretrained_and_attribute(tmp_path):
    ref = AutoTokenizer.from_pretrained(str(FOLDER), padding_side="left", truncation_side="left")
    ours = BertTokenizer.from_pretrained(FOLDER, padding_side="left", truncation_side="left")
    assert (ours.padding_side, ours.truncation_side) == (ref.padding_side, ref.truncation_side)
    for kwargs in [dict(padding=True), dict(truncation=True, max_length=5)]:
        assert_same(ours(TEXTS, **kwargs), ref(TEXTS, **kwargs), str(kwargs))
    ours.padding_side = "right"  # the attribute is read by every call
    assert ours(TEXTS, padding=True)["input_ids"][1][-1] == ours.pad_token_id
    ours.padding_side = "left"
    ours.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    assert again.padding_side == "left" == BertTokenizer.from_pretrained(tmp_path).padding_side


def test_batch_encoding_surface(both):
    ref_tok, tok = both
    text = "Hello wonderful world"
    ours, ref = tok(text), ref_tok(text)
    assert ours.input_ids == ref.input_ids and ours.attention_mask == ref.attention_mask
    assert list(ours.keys()) == list(ref.keys())
    assert len(ours.encodings) == len(ref.encodings) == 1
    assert ours[0].ids == ref[0].ids  # an int index gives the row's Encoding
    for char in range(len(text)):
        assert ours.char_to_token(char) == ref.char_to_token(char)
        assert ours.char_to_token(0, char) == ref.char_to_token(0, char)
        assert ours.char_to_word(char) == ref.char_to_word(char)
    for token in range(len(ref.input_ids)):
        assert ours.token_to_word(token) == ref.token_to_word(token)
        assert tuple(ours.token_to_chars(token) or ()) == tuple(ref.token_to_chars(token) or ())
    assert tuple(ours.word_to_tokens(1)) == tuple(ref.word_to_tokens(1))
    assert ours.n_sequences == ref.n_sequences == 1
    with pytest.raises(AttributeError):
        ours.not_a_field  # noqa: B018
    batch = tok(TEXTS, padding=True)
    assert [e.ids for e in batch[1:3]] == [e.ids for e in ref_tok(TEXTS, padding=True)[1:3]]
    padded = tok.pad(rows(tok))  # (no encodings: a slice cuts every field)
    assert padded[1:3]["input_ids"] == batch["input_ids"][1:3]
    back = pickle.loads(pickle.dumps(tok(TEXTS, padding=True, return_tensors="pt")))
    assert back.word_ids(2) == batch.word_ids(2) and torch.is_tensor(back.input_ids)


def test_convert_to_tensors_and_to(both):
    ref_tok, tok = both
    ours, ref = tok(TEXTS, padding=True), ref_tok(TEXTS, padding=True)
    assert ours.convert_to_tensors("np") is ours
    assert_same(ours, ref.convert_to_tensors("np"), "np")
    ours = tok("one text").convert_to_tensors("pt", prepend_batch_axis=True)
    assert_same(ours, ref_tok("one text").convert_to_tensors("pt", prepend_batch_axis=True))
    pt = tok(TEXTS, padding=True, return_tensors="pt")
    assert pt.to("cpu") is pt and pt.input_ids.device.type == "cpu"
    device = "cuda" if torch.cuda.is_available() else "meta"
    moved = pt.to(torch.device(device))
    assert all(v.device.type == device for v in moved.values())


# ================================================================================ pad + collators
def rows(tok_or_ref: Any, texts=TEXTS, **kwargs) -> list[dict[str, list[int]]]:
    """Rows tokenized one by one, unpadded (what a mapped dataset holds)."""
    return [dict(tok_or_ref(t, **kwargs)) for t in texts]


PADS = {
    "default": {},
    "longest": dict(padding="longest"),
    "max_length": dict(padding="max_length", max_length=32),
    "model max": dict(padding="max_length"),
    "multiple": dict(pad_to_multiple_of=8),
    "left": dict(padding_side="left"),
    "no pad": dict(padding=False),
    "pt": dict(return_tensors="pt"),
    "np": dict(return_tensors="np", pad_to_multiple_of=4),
    "no mask": dict(return_attention_mask=False, return_tensors="pt"),
}


@pytest.mark.parametrize("name", list(PADS))
@pytest.mark.parametrize("source", ["list of dicts", "dict of lists", "tensors", "one row"])
def test_pad_like_transformers(both, name, source):
    ref_tok, tok = both
    features = rows(ref_tok, return_attention_mask=name != "no mask", return_special_tokens_mask=1)
    if source == "dict of lists":
        features = {k: [f[k] for f in features] for k in features[0]}
    elif source == "tensors":
        features = [{k: torch.tensor(v) for k, v in f.items()} for f in features]
    elif source == "one row":
        features = features[2]
    kwargs = PADS[name]
    if name == "no pad" and source != "one row" or name == "no mask":
        kwargs = {**kwargs, "return_tensors": None}  # (ragged rows make no tensor)
    copy = (
        [dict(f) for f in features] if isinstance(features, list) else dict(features)
    )  # (transformers' pad may change what it is given)
    if name == "no pad" and source == "tensors":  # (tensors in: tensors out, ragged)
        for t, f in ((ref_tok, features), (tok, copy)):
            with pytest.raises(ValueError, match="tensor"):
                t.pad(f, **kwargs)
        return
    ref = ref_tok.pad(features, **kwargs)
    ours = tok.pad(copy, **kwargs)
    assert_same(ours, ref, f"{source} {name}")


def test_pad_keeps_other_fields_and_empty_input(both):
    ref_tok, tok = both
    features = [{**f, "label": i} for i, f in enumerate(rows(ref_tok))]
    assert_same(tok.pad(features, return_tensors="pt"), ref_tok.pad(features, return_tensors="pt"))
    assert dict(tok.pad({"input_ids": []})) == dict(ref_tok.pad({"input_ids": []}))


@pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
def test_data_collator_with_padding(both, pad_to_multiple_of):
    ref_tok, tok = both
    features = [{**f, "label": i % 2} for i, f in enumerate(rows(ref_tok))]
    ours = DataCollatorWithPadding(tok, pad_to_multiple_of=pad_to_multiple_of)(features)
    ref = DataCollatorWithPadding(ref_tok, pad_to_multiple_of=pad_to_multiple_of)(features)
    assert_same(ours, ref)
    assert "labels" in ours and ours["input_ids"].dtype == torch.int64
    ours = DataCollatorWithPadding(tok, padding="max_length", max_length=40)(features)
    ref = DataCollatorWithPadding(ref_tok, padding="max_length", max_length=40)(features)
    assert_same(ours, ref)


@pytest.mark.parametrize("special_mask", [False, True])
def test_data_collator_for_language_modeling(both, special_mask):
    """With the same seed both give the same masks, labels and replaced ids; labels are -100
    exactly where nothing was masked, and [CLS], [SEP], [PAD] are never masked."""
    ref_tok, tok = both
    texts = TEXTS * 8
    features = rows(ref_tok, texts, return_special_tokens_mask=special_mask)
    ours = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=7)(features)
    ref = DataCollatorForLanguageModeling(ref_tok, mlm_probability=0.15, seed=7)(features)
    assert_same(ours, ref)
    plain_ids = tok.pad(rows(ref_tok, texts), return_tensors="pt")["input_ids"]
    labels = ours["labels"]
    masked = labels != -100
    assert masked.any() and labels.shape == plain_ids.shape
    assert torch.equal(labels[masked], plain_ids[masked])  # the original ids where masked
    special = torch.isin(plain_ids, torch.tensor(tok.all_special_ids))
    assert not (masked & special).any()
    changed = ours["input_ids"] != plain_ids
    assert not (changed & ~masked).any()  # only masked positions change
    assert (ours["input_ids"][masked] == tok.mask_token_id).float().mean() > 0.5


# ================================================================================ added tokens
def test_add_tokens_like_transformers(tmp_path):
    ref, ours = fresh()
    for call in [
        lambda t: t.add_tokens(["new_tok", "hello", "new_tok", "newtwo"]),
        lambda t: t.add_tokens("single"),
        lambda t: t.add_tokens([]),
        lambda t: t.add_special_tokens({"additional_special_tokens": ["<ent>", "<ent2>"]}),
        lambda t: t.add_special_tokens({"pad_token": "<pad>"}),
        lambda t: t.add_tokens(["<ent>"], special_tokens=True),
    ]:
        assert call(ours) == call(ref)
        assert len(ours) == len(ref) and ours.vocab_size == ref.vocab_size == 30522
    assert len(ours) == 30522 + 5  # ("hello" and "single" are in the vocabulary)
    text = "a new_tok b NEW_TOK xnew_tokx newtwo <ent> y<ent2>z <ENT> single"
    for kwargs in [{}, dict(return_offsets_mapping=True, return_special_tokens_mask=True)]:
        assert_same(ours(text, **kwargs), ref(text, **kwargs), text)
    assert ours.tokenize(text) == ref.tokenize(text)
    batch = [text, "short"]
    assert_same(ours(batch, padding=True), ref(batch, padding=True))  # pads with <pad>
    assert ours.pad_token == ref.pad_token == "<pad>" and ours.pad_token_id == ref.pad_token_id
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.get_added_vocab() == ref.get_added_vocab()
    assert ours.all_special_tokens == ref.all_special_tokens
    assert ours.all_special_ids == ref.all_special_ids
    assert ours.special_tokens_map == ref.special_tokens_map
    assert ours.extra_special_tokens == ref.extra_special_tokens == ["<ent>", "<ent2>"]
    ids = ref(text)["input_ids"]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
            ids, skip_special_tokens=skip
        )
    assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_ids(["<ent>", "zzzqqq", "new_tok"]) == [30524, 100, 30522]
    mask = ours.get_special_tokens_mask(ids, already_has_special_tokens=True)
    assert mask == ref.get_special_tokens_mask(ids, already_has_special_tokens=True)
    copied = pickle.loads(pickle.dumps(ours))  # (DataLoader workers that spawn pickle it)
    assert copied(text)["input_ids"] == ids and len(copied) == len(ours)


@pytest.mark.parametrize("saver", ["bertlab", "transformers"])
def test_added_tokens_survive_save_and_load(tmp_path, saver):
    """Saved by either library, loaded by both: the same ids, added tokens included."""
    ref, ours = fresh()
    for tok in (ref, ours):
        tok.add_tokens(["new_tok", "newtwo"])
        tok.add_special_tokens({"additional_special_tokens": ["<ent>"], "pad_token": "<pad>"})
    (ours if saver == "bertlab" else ref).save_pretrained(tmp_path)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    again = BertTokenizer.from_pretrained(tmp_path)
    text = ["x new_tok <ent> newtwo hello NEWTWO", "short"]
    want = ref(text, padding=True)
    assert_same(theirs(text, padding=True), want, "transformers loads it")
    assert_same(again(text, padding=True), want, "bertlab loads it")
    for tok in (theirs, again):
        assert len(tok) == len(ref) == 30522 + 4
        assert tok.pad_token == "<pad>" and tok.all_special_tokens == ref.all_special_tokens


def test_added_tokens_from_legacy_files(tmp_path):
    """A folder in the older format: vocab.txt, added_tokens.json, special_tokens_map.json."""
    (tmp_path / "vocab.txt").write_bytes((FOLDER / "vocab.txt").read_bytes())
    (tmp_path / "added_tokens.json").write_text('{"new_tok": 30522, "<ent>": 30523}')
    (tmp_path / "special_tokens_map.json").write_text('{"additional_special_tokens": ["<ent>"]}')
    tok = BertTokenizer.from_pretrained(tmp_path)
    assert tok("a new_tok <ent> <ENT>")["input_ids"][1:4] == [1037, 30522, 30523]
    assert tok.all_special_tokens[-1] == "<ent>" and len(tok) == 30524
    (tmp_path / "added_tokens.json").write_text('{"new_tok": 30530}')
    with pytest.raises(ValueError, match=r"'new_tok' has id 30530 .* without gaps"):
        BertTokenizer.from_pretrained(tmp_path)


def test_new_cls_token_is_used_like_transformers_after_reload(tmp_path):
    """A new cls_token: bertlab uses it at once; transformers does so once the tokenizer is
    saved and loaded again (before that it keeps the old [CLS] in its template)."""
    ref, ours = fresh()
    for tok in (ref, ours):
        tok.add_special_tokens({"cls_token": "[unused1]"})
    assert ours("hi")["input_ids"][0] == ours.cls_token_id == 2
    ref.save_pretrained(tmp_path)
    assert (
        ours("hi, you")["input_ids"]
        == AutoTokenizer.from_pretrained(str(tmp_path))("hi, you")["input_ids"]
    )


def test_add_tokens_with_never_split_words_outside_the_vocabulary():
    """never_split words the vocabulary lacks stay [UNK] and take no id from added tokens."""
    tok = BertTokenizer.from_pretrained(FOLDER, never_split=["xyzzyplugh"])
    assert tok.add_tokens(["new_tok"]) == 1 and len(tok) == 30523
    assert tok("xyzzyplugh new_tok")["input_ids"] == [101, 100, 30522, 102]
    assert "xyzzyplugh" not in tok.get_vocab()


# ================================================================================ attributes
def test_attributes_like_transformers(both):
    ref, ours = both
    for name in [
        "model_input_names",
        "is_fast",
        "padding_side",
        "truncation_side",
        "model_max_length",
        "cls_token",
        "sep_token",
        "pad_token",
        "unk_token",
        "mask_token",
        "cls_token_id",
        "sep_token_id",
        "pad_token_id",
        "unk_token_id",
        "mask_token_id",
        "do_lower_case",
        "all_special_tokens",
        "all_special_ids",
        "special_tokens_map",
        "vocab_size",
        "pad_token_type_id",
        "clean_up_tokenization_spaces",
    ]:
        assert getattr(ours, name) == getattr(ref, name), name
    assert len(ours) == len(ref)
    assert ours.name_or_path == ref.name_or_path == str(FOLDER)
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.num_special_tokens_to_add(True) == ref.num_special_tokens_to_add(True)
    assert BertTokenizer.from_pretrained(FOLDER, use_fast=True).is_fast
    assert "vocab_size=30522" in repr(ours) and "padding_side='right'" in repr(ours)


def test_special_token_helpers_like_the_original_bert_tokenizer(both):
    """transformers' fast tokenizer no longer has these; its original (legacy) one does."""
    legacy = transformers.BertTokenizerLegacy.from_pretrained(str(FOLDER))
    _, ours = both
    a, b = [7592, 1010], [2088]
    for args in [(a,), (a, b)]:
        assert ours.build_inputs_with_special_tokens(*args) == (
            legacy.build_inputs_with_special_tokens(*args)
        )
        assert ours.create_token_type_ids_from_sequences(*args) == (
            legacy.create_token_type_ids_from_sequences(*args)
        )
        assert ours.get_special_tokens_mask(*args) == legacy.get_special_tokens_mask(*args)
    ids = [101, 7592, 102, 0, 100, 103]
    ref = both[0].get_special_tokens_mask(ids, already_has_special_tokens=True)
    assert ours.get_special_tokens_mask(ids, already_has_special_tokens=True) == ref
    with pytest.raises(ValueError, match="token_ids_1 must be None"):
        ours.get_special_tokens_mask(ids, [1], already_has_special_tokens=True)


@pytest.mark.parametrize("clean", [None, True, False])
def test_decode_like_transformers(both, clean):
    ref, ours = both
    enc = ref(TEXTS, padding=True, return_tensors="pt")
    ids = enc["input_ids"]
    kw = dict(clean_up_tokenization_spaces=clean)
    for skip in (False, True):
        assert ours.batch_decode(ids, skip_special_tokens=skip, **kw) == ref.batch_decode(
            ids, skip_special_tokens=skip, **kw
        )
        assert ours.decode(ids[4], skip_special_tokens=skip, **kw) == ref.decode(
            ids[4], skip_special_tokens=skip, **kw
        )
        assert ours.decode(ids.numpy(), **kw) == ref.decode(ids.numpy(), **kw)
        assert ours.decode(ids[0].tolist(), **kw) == ref.decode(ids[0].tolist(), **kw)
    assert ours.decode(7592) == ref.decode(7592)
    assert ours.batch_decode([[7592, 2088]]) == ref.batch_decode([[7592, 2088]])


def test_encode_takes_call_keywords(both):
    ref, ours = both
    for kwargs in [{}, dict(return_tensors="pt"), dict(max_length=5), dict(padding="max_length")]:
        kwargs = {**kwargs, "max_length": kwargs.get("max_length", 12)}
        assert plain(ours.encode(TEXTS[0], **kwargs)) == plain(ref.encode(TEXTS[0], **kwargs))


# ================================================================================ warnings
def test_max_length_ignored_warning_like_transformers(both):
    ref, ours = both
    for tok in (ref, ours):
        with pytest.warns(UserWarning, match="`max_length` is ignored when `padding`=`True`"):
            tok(TEXTS, padding=True, max_length=4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tok(TEXTS, padding=True, max_length=4, verbose=False)


def test_truncation_without_any_limit_warns(tmp_path):
    """A folder that names no model_max_length: transformers' limit is 1e30, so truncation=True
    without max_length truncates nothing. bertlab does the same, and says so."""
    (tmp_path / "vocab.txt").write_bytes((FOLDER / "vocab.txt").read_bytes())
    ref = transformers.BertTokenizer.from_pretrained(str(tmp_path))
    ours = BertTokenizer.from_pretrained(tmp_path)
    assert ours.model_max_length == ref.model_max_length
    text = "word " * 600
    with pytest.warns(UserWarning, match="nothing is truncated"):
        got = ours(text, truncation=True)["input_ids"]
    assert got == ref(text, truncation=True)["input_ids"] and len(got) == 602
    assert ours(text, padding="max_length")["input_ids"] == got  # (no length to pad to)


# ================================================================================ bad input
def test_unsupported_and_unknown_keywords_raise(both):
    _, tok = both
    with pytest.raises(TypeError, match=r"text_target is not supported.*return_tensors"):
        tok("a", text_target="b")
    with pytest.raises(TypeError, match=r"text_pair_target is not supported"):
        tok("a", text_pair_target="b")
    with pytest.raises(TypeError, match=r"unknown keyword paddding .*supported: .*padding"):
        tok("a", paddding=True)
    with pytest.raises(TypeError, match=r"unknown keyword sanitize_control_tokens"):
        tok("a", sanitize_control_tokens=True)
    with pytest.raises(TypeError, match=r"unknown keyword paddding"):
        tok("a", tokenizer_kwargs={"paddding": True})
    with pytest.raises(TypeError, match=r"unknown keywords \['use_fasst'\]"):
        BertTokenizer.from_pretrained(FOLDER, use_fasst=True)


def test_bad_values_name_the_value_and_the_choices(both):
    _, tok = both
    with pytest.raises(
        ValueError, match=r"padding_side 'middle' is not one of \['right', 'left'\]"
    ):
        tok("a", padding=True, padding_side="middle")
    with pytest.raises(ValueError, match=r"padding_side 'up' is not one of"):
        tok.pad([{"input_ids": [1, 2]}], padding_side="up")
    with pytest.raises(ValueError, match=r"padding_side 'top' is not one of"):
        BertTokenizer.from_pretrained(FOLDER, padding_side="top")
    with pytest.raises(ValueError, match=r"truncation_side 'x' is not one of"):
        BertTokenizer.from_pretrained(FOLDER, truncation_side="x")
    fresh_tok = BertTokenizer.from_pretrained(FOLDER)
    with pytest.raises(ValueError, match=r"padding_side 'centre' is not one of"):
        fresh_tok.padding_side = "centre"
    assert fresh_tok.padding_side == "right"
    with pytest.raises(ValueError, match=r"use_fast=False asks for transformers' pure-Python"):
        BertTokenizer.from_pretrained(FOLDER, use_fast=False)
    with pytest.raises(ValueError, match=r"return_tensors 'tf' is not supported.*'pt', 'np'"):
        tok("a", return_tensors="tf")
    with pytest.raises(ValueError, match=r"pad_to_multiple_of must be a positive integer, got 0"):
        tok(["a"], padding=True, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match=r"truncation to 10 tokens and padding to a multiple of 4"):
        tok(["a"], padding=True, truncation=True, max_length=10, pad_to_multiple_of=4)
    with pytest.raises(ValueError, match=r"pad needs input_ids among the fields, got \['ids'\]"):
        tok.pad([{"ids": [1]}])
    with pytest.raises(ValueError, match=r"row 1 has fields \['input_ids'\], row 0 has"):
        tok.pad([{"input_ids": [1], "attention_mask": [1]}, {"input_ids": [2]}])
    with pytest.raises(ValueError, match=r"'input_ids' cannot form one tensor"):
        tok.pad([{"input_ids": [1]}, {"input_ids": [2, 3]}], padding=False, return_tensors="pt")
    with pytest.raises(TypeError, match=r"new_tokens\[1\] must be a str or an AddedToken"):
        tok.add_tokens(["ok", 3])
    with pytest.raises(ValueError, match=r"'bos_token' is not a special token role of BERT"):
        tok.add_special_tokens({"bos_token": "<s>"})
    with pytest.raises(ValueError, match=r"token id 40000 is outside the vocabulary"):
        tok.decode([101, 40000])

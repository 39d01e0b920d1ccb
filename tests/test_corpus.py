"""Corpus preparation (bertlab.data.corpus): readers, sentence splitting, the original BERT pair
recipe, the on-disk format, determinism across runs and worker counts, and reading back."""

from __future__ import annotations

import functools
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import bertlab
from bertlab.data.corpus import (
    PretrainingCorpus,
    collate,
    detect_layout,
    prepare,
    read_documents,
    split_sentences,
)

VOCAB = bertlab.bundled_model_dir()
WIKITEXT = Path(__file__).parent / "fixtures" / "wikitext2_sample.tokens"
CLS, SEP, PAD = 101, 102, 0  # the bundled (bert-base-uncased) vocabulary
DIGITS = "zero one two three four five six seven eight nine".split()


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _examples(out: Path) -> list[list[int]]:
    """Every example's ids, read from the raw shard files (not through PretrainingCorpus)."""
    meta = json.loads((out / "meta.json").read_text())
    result = []
    for shard in meta["shards"]:
        ids = np.load(out / f"{shard['name']}.input_ids.npy")
        offsets = np.load(out / f"{shard['name']}.offsets.npy")
        result += [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return result


def _labels(out: Path) -> list[int]:
    meta = json.loads((out / "meta.json").read_text())
    return [int(x) for s in meta["shards"] for x in np.load(out / f"{s['name']}.nsp.npy")]


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard_*.npy"))}


# ============================================================================ readers
def test_plain_text_documents_are_separated_by_blank_lines(tmp_path):
    path = _write(tmp_path / "a.txt", "One. Two.\nThree.\n\n\n\nFour.\n  \nFive.\n")
    assert detect_layout(path) == "plain"
    assert list(read_documents(path)) == [["One. Two.", "Three."], ["Four."], ["Five."]]


def test_wikitext_titles_start_documents_and_subheadings_are_dropped(tmp_path):
    text = (
        " = First = \n \n Alpha text . \n \n = = Section = = \n \n Beta text . \n"
        " = = = Deeper = = = \n Gamma . \n = Second = \n\n Delta . \n"
        " = Empty = \n"
    )
    for name in ("wiki.tokens", "wiki.txt"):  # by suffix, and by the heading lines
        path = _write(tmp_path / name, text)
        assert detect_layout(path) == "wikitext"
        docs = list(read_documents(path))
        assert docs == [["Alpha text .", "Beta text .", "Gamma ."], ["Delta ."], []]


def test_wikitext_fixture_reads_as_articles():
    docs = list(read_documents(WIKITEXT))
    assert len(docs) >= 1
    assert docs[0][0].startswith("Homarus gammarus , known as the European lobster")
    assert not any(p.startswith("=") for doc in docs for p in doc)


def test_jsonl_one_document_per_line_paragraphs_on_newlines(tmp_path):
    lines = [
        {"text": "Para one. Still one.\nPara two."},
        {"text": "  "},
        {"text": "Solo.", "id": 3},
    ]
    path = _write(tmp_path / "c.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert list(read_documents(path)) == [["Para one. Still one.", "Para two."], [], ["Solo."]]
    bad = _write(tmp_path / "bad.jsonl", '{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: expected an object"):
        list(read_documents(bad))
    broken = _write(tmp_path / "broken.jsonl", '{"text": "ok"}\n\n{"text": \n')
    with pytest.raises(ValueError, match=r"broken\.jsonl, line 3: not JSON"):
        list(read_documents(broken))


@pytest.mark.parametrize("block", [1, 7, 40, 200])
def test_byte_ranges_give_every_document_once(tmp_path, block):
    """Blocks cut at any byte move to document boundaries: together they read the file."""
    files = [
        _write(tmp_path / "p.txt", "".join(f"Doc {i} line a.\nDoc {i} b.\n\n" for i in range(9))),
        _write(tmp_path / "w.tokens", "".join(f" = T{i} = \n\n Body {i} . \n\n" for i in range(9))),
        _write(tmp_path / "j.jsonl", "".join(f'{{"text": "Doc {i}."}}\n' for i in range(9))),
    ]
    for path in files:
        size = path.stat().st_size
        pieces = [
            doc
            for start in range(0, size, block)
            for doc in read_documents(path, start=start, end=start + block)
        ]
        assert pieces == list(read_documents(path)), path.name


def test_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"Good line.\n\nAnother good one.\nBad \xff byte.\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 4: invalid UTF-8"):
        list(read_documents(path))
    # The line is counted from the file's start even when the error is in a later block.
    with pytest.raises(ValueError, match=r"bad\.txt, line 4: invalid UTF-8"):
        prepare(path, VOCAB, tmp_path / "out", block_bytes=8, progress=False)
    assert not (tmp_path / "out").exists()


# ============================================================================ sentences
@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Hello world. This is a test! Is it? Yes.",
            ["Hello world.", "This is a test!", "Is it?", "Yes."],
        ),
        ("Mr. Smith met Dr. Jones. They talked.", ["Mr. Smith met Dr. Jones.", "They talked."]),
        ("The U.S. Army arrived. It was late.", ["The U.S. Army arrived.", "It was late."]),
        (
            "Use tools, e.g. Hammers, i.e. Heavy ones. Or not.",
            ["Use tools, e.g. Hammers, i.e. Heavy ones.", "Or not."],
        ),
        (
            "J. R. R. Tolkien wrote it. He was English.",
            ["J. R. R. Tolkien wrote it.", "He was English."],
        ),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("It cost 5 dollars. 3 people paid.", ["It cost 5 dollars.", "3 people paid."]),
        ("no split. before lower case", ["no split. before lower case"]),
        ("version 2.0 is out. (It works.)", ["version 2.0 is out.", "(It works.)"]),
        (
            "Black Sea . It is related to H. americanus . It may grow",
            ["Black Sea .", "It is related to H. americanus .", "It may grow"],
        ),
        ("  ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# ============================================================================ examples
@pytest.mark.parametrize("nsp", [True, False])
def test_examples_are_well_formed(tmp_path, nsp):
    out = prepare(WIKITEXT, VOCAB, tmp_path / "out", max_seq_length=64, nsp=nsp, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    examples = _examples(out)
    assert len(examples) == meta["num_examples"] > 20
    seps = np.concatenate([np.load(out / f"{s['name']}.sep.npy") for s in meta["shards"]])
    for ids, sep in zip(examples, seps, strict=True):
        assert ids[0] == CLS and ids[-1] == SEP
        assert ids.count(CLS) == 1 and ids.count(SEP) == (2 if nsp else 1)
        assert ids.index(SEP) == sep
        assert len(ids) <= 64
    assert meta["dtype"] == "uint16" and np.load(out / "shard_00000.input_ids.npy").dtype == "<u2"
    assert meta["nsp"] is nsp and meta["vocab_size"] == 30522 and meta["do_lower_case"] is True
    assert meta["inputs"] == [
        {"path": str(WIKITEXT), "bytes": WIKITEXT.stat().st_size, "layout": "wikitext"}
    ]
    if not nsp:
        assert set(_labels(out)) == {0}


def _numbered_corpus(path: Path, n_docs: int, seed: int = 0) -> list[list[int]]:
    """Documents of numbered sentences "Alpha <four digit words>." (6 tokens each, each
    sentence unique), several per line, a blank line between documents. Returns the numbers."""
    rng = np.random.default_rng(seed)
    docs, n, lines = [], 0, []
    for _ in range(n_docs):
        numbers = list(range(n, n + int(rng.integers(2, 9))))
        n += len(numbers)
        docs.append(numbers)
        sentences = ["Alpha " + " ".join(DIGITS[int(c)] for c in f"{k:04d}") + "." for k in numbers]
        lines += [" ".join(sentences[:3]), *([" ".join(sentences[3:])] if numbers[3:] else []), ""]
    _write(path, "\n".join(lines) + "\n")
    return docs


def _sentence_numbers(tok: bertlab.BertTokenizer, ids: list[int]) -> list[int]:
    """The sentence numbers of a run of whole numbered sentences (6 tokens each)."""
    words = tok.convert_ids_to_tokens(ids)
    assert len(words) % 6 == 0, words
    numbers = []
    for k in range(0, len(words), 6):
        assert words[k] == "alpha" and words[k + 5] == ".", words
        numbers.append(int("".join(str(DIGITS.index(w)) for w in words[k + 1 : k + 5])))
    return numbers


def test_pairs_follow_the_source_and_half_are_random(tmp_path):
    """On numbered sentences, with lengths that never need truncation (6 tokens per sentence,
    30 = 5 sentences per pair): A is a run of one document, an actual-next B the sentences right
    after A, a random B a run from another document; every sentence is in exactly one A or
    actual-next B (the original puts the segments a random B did not use back)."""
    docs = _numbered_corpus(tmp_path / "numbers.txt", 1200)
    doc_of = {k: i for i, doc in enumerate(docs) for k in doc}
    last = {doc[-1] for doc in docs}
    out = prepare(
        tmp_path / "numbers.txt",
        VOCAB,
        tmp_path / "out",
        max_seq_length=33,
        short_seq_prob=0.0,
        progress=False,
    )
    tok = bertlab.BertTokenizer.from_pretrained(VOCAB)
    seen, free = [], []
    for ids, label in zip(_examples(out), _labels(out), strict=True):
        sep = ids.index(SEP)
        a, b = _sentence_numbers(tok, ids[1:sep]), _sentence_numbers(tok, ids[sep + 1 : -1])
        for run in (a, b):
            assert run == list(range(run[0], run[0] + len(run)))
            assert doc_of[run[0]] == doc_of[run[-1]]
        seen += a
        if label == 0:
            assert b[0] == a[-1] + 1 and doc_of[b[0]] == doc_of[a[0]]
            seen += b
        else:
            assert doc_of[b[0]] != doc_of[a[0]]
        # A chunk of one sentence (the last of its document) must take a random B; any other
        # chunk tosses a fair coin. Those tosses are the ones to count.
        if not (len(a) == 1 and a[0] in last):
            free.append(label)
    assert sorted(seen) == list(range(sum(map(len, docs))))
    # Hoeffding-Azuma (the tosses are fair given the past): |mean - 1/2| <= t except with
    # probability 2 exp(-2 n t^2) = 1e-6.
    n = len(free)
    t = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    assert n > 1500 and abs(sum(free) / n - 0.5) <= t, (sum(free), n, t)


def test_single_document_falls_back_to_actual_next(tmp_path):
    path = tmp_path / "one.txt"
    _write(path, " ".join(f"Sentence number {k} is here." for k in range(60)) + "\n")
    out = prepare(path, VOCAB, tmp_path / "out", max_seq_length=32, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["single_document_blocks"] == 1 and meta["random_next"] == 0
    assert set(_labels(out)) == {0}
    assert all(ids.count(SEP) == 2 for ids in _examples(out))


@pytest.mark.parametrize("nsp", [True, False])
def test_short_seq_prob_gives_shorter_examples(tmp_path, nsp):
    # With NSP the target length is drawn once per document (as in the original): many documents.
    _numbered_corpus(tmp_path / "numbers.txt", 300)
    mean = {}
    for p in (0.0, 1.0):
        out = prepare(
            tmp_path / "numbers.txt",
            VOCAB,
            tmp_path / f"out{p}",
            max_seq_length=33,
            short_seq_prob=p,
            nsp=nsp,
            progress=False,
        )
        mean[p] = np.mean([len(x) for x in _examples(out)])
    assert mean[1.0] < 0.8 * mean[0.0], mean


def test_dupe_factor_repeats_the_corpus_with_other_choices(tmp_path):
    one = _examples(prepare(WIKITEXT, VOCAB, tmp_path / "one", progress=False))
    three = _examples(prepare(WIKITEXT, VOCAB, tmp_path / "three", dupe_factor=3, progress=False))
    assert three[: len(one)] == one  # the first copy is the dupe_factor=1 corpus
    assert len(three) > 2 * len(one) and three[len(one) :] != one * 2


# ============================================================================ determinism
def _mixed_inputs(tmp_path: Path) -> list[Path]:
    plain = "".join(
        f"Plain doc {i}. It has text. More of it here.\nAnd a second line.\n\n" for i in range(40)
    )
    jsonl = "".join(
        json.dumps({"text": f"Record {i}. Is here.\nNext para {i}."}) + "\n" for i in range(40)
    )
    return [WIKITEXT, _write(tmp_path / "p.txt", plain), _write(tmp_path / "r.jsonl", jsonl)]


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path):
    inputs = _mixed_inputs(tmp_path)
    kw = dict(max_seq_length=48, dupe_factor=2, shard_size=50, block_bytes=4096, progress=False)
    a = prepare(inputs, VOCAB, tmp_path / "a", **kw)
    b = prepare(inputs, VOCAB, tmp_path / "b", **kw)
    c = prepare(inputs, VOCAB, tmp_path / "c", seed=7, **kw)
    assert len(_shard_bytes(a)) > 4  # several shards
    assert _shard_bytes(a) == _shard_bytes(b)
    assert (a / "meta.json").read_text() == (b / "meta.json").read_text()
    assert _examples(a) != _examples(c)


def test_worker_count_does_not_change_the_result(tmp_path):
    inputs = _mixed_inputs(tmp_path)
    kw = dict(max_seq_length=48, shard_size=64, block_bytes=4096, progress=False)
    one = prepare(inputs, VOCAB, tmp_path / "w1", workers=1, **kw)
    two = prepare(inputs, VOCAB, tmp_path / "w2", workers=2, **kw)
    assert _examples(one) == _examples(two) and _labels(one) == _labels(two)
    assert _shard_bytes(one) == _shard_bytes(two)
    assert (one / "meta.json").read_text() == (two / "meta.json").read_text()


# ============================================================================ refusals
def test_empty_corpus_raises_before_writing(tmp_path):
    empty = _write(tmp_path / "empty.txt", "")
    blank = _write(tmp_path / "blank.txt", "\n\n  \n")
    titles = _write(tmp_path / "titles.tokens", " = Only a title = \n\n")
    with pytest.raises(ValueError, match=r"empty\.txt, .*blank\.txt, .*titles\.tokens"):
        prepare([empty, blank, titles], VOCAB, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_existing_corpus_is_refused_unless_overwrite(tmp_path):
    out = prepare(WIKITEXT, VOCAB, tmp_path / "out", progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare(WIKITEXT, VOCAB, out, progress=False)
    prepare(WIKITEXT, VOCAB, out, seed=1, overwrite=True, progress=False)
    assert json.loads((out / "meta.json").read_text())["seed"] == 1
    (out / "meta.json").unlink()  # an unfinished preparation is refused too, and not read
    with pytest.raises(FileExistsError):
        prepare(WIKITEXT, VOCAB, out, progress=False)
    with pytest.raises(FileNotFoundError, match="did not finish"):
        PretrainingCorpus(out)


def test_bad_settings_are_refused(tmp_path):
    for kw in ({"max_seq_length": 4}, {"short_seq_prob": 1.5}, {"workers": 0}, {"dupe_factor": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            prepare(WIKITEXT, VOCAB, tmp_path / "out", progress=False, **kw)
    with pytest.raises(FileNotFoundError, match="nowhere.txt"):
        prepare(tmp_path / "nowhere.txt", VOCAB, tmp_path / "out", progress=False)


# ============================================================================ reading back
def test_pretraining_corpus_round_trip_and_collate(tmp_path):
    out = prepare(
        _mixed_inputs(tmp_path),
        VOCAB,
        tmp_path / "out",
        max_seq_length=48,
        shard_size=40,
        progress=False,
    )
    meta = json.loads((out / "meta.json").read_text())
    raw, labels = _examples(out), _labels(out)
    corpus = PretrainingCorpus(out)
    assert len(corpus) == len(raw) == meta["num_examples"]
    assert corpus.pad_id == PAD and len(meta["shards"]) > 3
    for i in (0, 1, 39, 40, len(raw) - 1, -1):
        item = corpus[i]
        ids, types = item["input_ids"], item["token_type_ids"]
        assert ids.dtype == torch.long and ids.tolist() == raw[i]
        sep = raw[i].index(SEP)
        assert types.tolist() == [0] * (sep + 1) + [1] * (len(raw[i]) - sep - 1)
        assert item["next_sentence_label"].item() == labels[i]
    with pytest.raises(IndexError):
        corpus[len(raw)]

    # A subset of shards: what one rank of two reads.
    parts = [PretrainingCorpus(out, shards=range(r, len(meta["shards"]), 2)) for r in (0, 1)]
    assert len(parts[0]) + len(parts[1]) == len(corpus)
    assert parts[1][0]["input_ids"].tolist() == raw[40]  # shard 1 starts at example 40
    with pytest.raises(IndexError, match="shard 99"):
        PretrainingCorpus(out, shards=[99])

    items = [corpus[i] for i in range(5)]
    batch = collate(items, pad_id=corpus.pad_id)
    T = max(len(x["input_ids"]) for x in items)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (5, T)
    assert batch["next_sentence_label"].shape == (5,)
    for r, x in enumerate(items):
        n = len(x["input_ids"])
        assert batch["input_ids"][r, :n].tolist() == x["input_ids"].tolist()
        assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (T - n)
        assert (
            batch["input_ids"][r, n:].eq(PAD).all() and batch["token_type_ids"][r, n:].eq(0).all()
        )

    # DataLoader workers receive the corpus pickled: the file names, not the mapped data.
    assert len(pickle.dumps(corpus)) < 10_000
    assert pickle.loads(pickle.dumps(corpus))[5]["input_ids"].tolist() == raw[5]
    loader = torch.utils.data.DataLoader(
        corpus, batch_size=8, collate_fn=functools.partial(collate, pad_id=corpus.pad_id)
    )
    assert next(iter(loader))["input_ids"].shape[0] == 8


def test_documents_too_short_for_a_pair_are_named(tmp_path):
    """A corpus whose only document is one token cannot make a sentence pair: the error says
    so before anything is written."""
    src = _write(tmp_path / "short.txt", "Hi\n")
    with pytest.raises(ValueError, match="1 too short to make a sentence pair"):
        prepare(src, VOCAB, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()

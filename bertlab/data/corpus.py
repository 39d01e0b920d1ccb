"""Pre-training corpus preparation: raw text -> sentence pairs -> memory-mapped shards.

The recipe is the original BERT ``create_pretraining_data.py`` (``create_instances_from_document``,
``truncate_seq_pair``) without its masking, which is dynamic here (``bertlab.data.masking``): the
``dupe_factor`` copies of the corpus differ in their pairs and split points only.

Each input file is read in *blocks* of ``block_bytes`` (1 MiB), each moved to the next document
boundary, so the cut depends on the file alone. A block's documents are split into sentences,
tokenized in one batch call and paired. Every document draws its random choices from its own
generator, seeded with (seed, dupe index, file index, block index, document index), and the random
B of NSP comes from another document of the same block (the original draws from the whole corpus,
which a streaming reader cannot hold; a block with one document makes actual-next pairs only,
counted as ``single_document_blocks``). No choice depends on the process that reads a block, and
the parent writes the blocks' examples in input order: the shards are byte-identical for any
``workers`` value and for every run with the same inputs, seed and block size.

On disk, for each shard ``k`` of ``shard_size`` examples (the last one fewer):
``shard_{k:05d}.input_ids.npy`` the examples' ids concatenated (uint16 when the vocabulary
fits, else int32); ``.offsets.npy`` int64 (n+1,): example i is
``input_ids[offsets[i]:offsets[i+1]]``; ``.sep.npy`` int32 (n,): the position of each example's
first [SEP], after which token_type_ids are 1; ``.nsp.npy`` int8 (n,): 0 = B follows A, 1 = B is
random (transformers' ``next_sentence_label``; all 0 without NSP). ``meta.json`` holds the
settings and the shard list. Every file is written under a temporary name and renamed, meta.json
last: a folder without it is an unfinished preparation, which ``PretrainingCorpus`` refuses.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import re
import time
from collections import deque, namedtuple
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from bertlab.data.batch import pad
from bertlab.data.readers import (
    BLOCK_BYTES,
    BOUNDARY,
    Block,
    Source,
    _split_suffix,
    blocks,
    detect_layout,
    documents,
    find_sources,
    open_binary,
    parse_lines,
)
from bertlab.files import atomic_write
from bertlab.progress import Progress
from bertlab.tokenizer import BertTokenizer

FORMAT, VERSION = "bertlab-pretraining-corpus", 1
PROGRESS = "progress.json"  # an unfinished preparation's resume point, removed at the end
STATS = (
    "documents",
    "documents_skipped",
    "single_document_blocks",
    "random_next",
    "chunks_dropped",
)


# ============================================================================ reading
def _lines(path: Path, layout: str, start: int, end: int | None) -> Iterator[tuple[int, bytes]]:
    """(byte position, raw line) of the lines from the first boundary line at or after
    ``start`` (the file's start for 0) to the first one at or after ``end``, exclusive:
    consecutive ranges read each line once."""
    boundary = BOUNDARY[layout]
    with open(path, "rb") as f:
        pos = 0
        if start > 0:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())  # the first line that starts at or after start
        raw = f.readline()
        while start > 0 and raw and not boundary(raw):
            pos, raw = pos + len(raw), f.readline()
        while raw and not (end is not None and pos >= end and boundary(raw)):
            yield pos, raw
            pos, raw = pos + len(raw), f.readline()


def _line_number(path: Path, pos: int) -> int:
    """The number (from 1) of the line that starts at byte ``pos``; counted for errors only."""
    with open(path, "rb") as f:
        return 1 + sum(f.read(min(1 << 20, pos - i)).count(b"\n") for i in range(0, pos, 1 << 20))


def read_documents(
    path: str | os.PathLike,
    layout: str | None = None,
    start: int = 0,
    end: int | None = None,
    field: str = "text",
) -> Iterator[list[str]]:
    """Stream the documents of a text file (layouts: ``detect_layout``; gzip or zstd
    compressed too), each as its paragraphs: stripped, non-empty lines; ``[]`` for a document
    without text. ``start``/``end`` (bytes, of an uncompressed file) keep the documents that
    begin in that range, moved to boundaries; default: the whole file. ``field``: the text's
    field in JSON lines."""
    path = Path(path)
    layout = layout or detect_layout(path)
    if layout not in BOUNDARY:
        raise ValueError(f"layout {layout!r} is not one of {list(BOUNDARY)}")
    source = Source(str(path), "text", layout, _split_suffix(path)[1], field)
    if source.compression is None:
        lines = _lines(path, layout, start, end)
        yield from parse_lines(lines, layout, str(path), lambda p: _line_number(path, p), field)
        return
    if (start, end) != (0, None):
        raise ValueError(f"{path} is compressed: it is read from its start to its end only")
    at = {"line": 0}

    def numbered(f) -> Iterator[tuple[int, bytes]]:
        pos = 0
        for at["line"], raw in enumerate(f, 1):
            yield pos, raw
            pos += len(raw)

    with open_binary(path, source.compression) as f:
        yield from parse_lines(numbered(f), layout, str(path), lambda _: at["line"], field)


# ============================================================================ sentences
# Words after which a period does not end a sentence (compared lower-cased, without the period).
# Dotted initialisms ("U.S.", "e.g.", "i.e.") and single capitals (the "H." of "H. gammarus",
# initials) are recognised by their shape instead.
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs mt ft gen col lt sgt capt adm rev hon gov sen rep pres inc "
    "ltd co corp bros dept univ fig figs vol approx cf al jan feb mar apr jun jul aug sep sept "
    "oct nov dec".split()
)
_END = re.compile(r"([.!?]+)[\"'\u201d\u2019)\]]*\s+")  # end marks, closing quotes, whitespace
_OPENERS = "\"'\u201c\u2018(["
_INITIALS = re.compile(r"(?:[^\W\d_]\.){2,}|[A-Z]\.")


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences by rule (no model, no language data). A sentence ends at
    ``.``, ``!`` or ``?`` (with any closing quotes or brackets) followed by whitespace and an
    upper-case letter, a digit or an opening quote or bracket. A single period does not end one
    after a word in ``ABBREVIATIONS`` ("Dr."), a dotted initialism ("U.S.", "e.g.") or a single
    capital ("J."). Rules miss rare cases ("... in the U.S. The ..." stays one sentence); they
    only decide where the pairs of pre-training may be cut."""
    sentences, begin = [], 0
    for m in _END.finditer(text):
        after = text[m.end() : m.end() + 1]
        if not after or not (after.isupper() or after.isdigit() or after in _OPENERS):
            continue
        if m.group(1) == ".":
            i = m.start()
            while i > 0 and not text[i - 1].isspace():
                i -= 1
            word = text[i : m.start() + 1].lstrip(_OPENERS)
            if _INITIALS.fullmatch(word) or word[:-1].lower() in ABBREVIATIONS:
                continue
        sentences.append(text[begin : m.end()].strip())
        begin = m.end()
    sentences.append(text[begin:].strip())
    return [s for s in sentences if s]


# ============================================================================ examples
def _truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random):
    """The original ``truncate_seq_pair``: drop a token from the longer side (B on a tie), at its
    front or back with equal chance, until both fit. Done on [start, stop) spans, so that a long
    sentence costs O(n) rather than O(n^2) list deletions; the random draws are the original's."""
    span = [[0, len(a)], [0, len(b)]]
    while span[0][1] - span[0][0] + span[1][1] - span[1][0] > max_num_tokens:
        side = span[0] if span[0][1] - span[0][0] > span[1][1] - span[1][0] else span[1]
        if rng.random() < 0.5:
            side[0] += 1
        else:
            side[1] -= 1
    return a[span[0][0] : span[0][1]], b[span[1][0] : span[1][1]]


def _pairs(
    docs: list,
    d: int,
    rng: random.Random,
    max_num_tokens: int,
    short_seq_prob: float,
    stats: dict[str, int],
) -> Iterator[tuple[list[int], list[int], bool]]:
    """The original ``create_instances_from_document`` for document ``d`` of a block (``docs``:
    documents as lists of sentences, sentences as lists of ids): (A, B, B is random) triples."""
    doc, target = docs[d], max_num_tokens
    if rng.random() < short_seq_prob:  # drawn once per document, as the original does
        target = rng.randint(2, max_num_tokens)
    chunk: list[list[int]] = []
    length = i = 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for seg in chunk[:a_end] for t in seg]
            if len(docs) > 1 and (len(chunk) == 1 or rng.random() < 0.5):
                # B from another document. The original retries 10 draws to avoid the same one;
                # drawing among the others directly is that without the rare failure.
                r = rng.randint(0, len(docs) - 2)
                other, b = docs[r + (r >= d)], []
                for seg in other[rng.randint(0, len(other) - 1) :]:
                    b.extend(seg)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the sentences left out of A start the next chunk
                is_random = True
            elif len(chunk) >= 2:
                b, is_random = [t for seg in chunk[a_end:] for t in seg], False
            elif len(a) >= 2:  # one sentence, no other document: B is the rest of the sentence
                k = rng.randint(1, len(a) - 1)
                a, b, is_random = a[:k], a[k:], False
            else:  # a one-token sentence alone in its block makes no pair
                stats["chunks_dropped"] += 1
                chunk, length, i = [], 0, i + 1
                continue
            yield *_truncate_pair(a, b, max_num_tokens, rng), is_random
            chunk, length = [], 0
        i += 1


def _singles(doc: list, rng: random.Random, limit: int, short_seq_prob: float):
    """Without NSP: contiguous sentences packed into segments of at most ``limit`` ids; one ends
    before the sentence that would take it past its target (``limit``, or with probability
    ``short_seq_prob`` a random length in [2, limit]). A sentence longer than ``limit`` is cut
    into pieces rather than truncated: no text is lost."""

    def draw() -> int:
        return rng.randint(2, limit) if rng.random() < short_seq_prob else limit

    target, chunk = draw(), []
    for seg in doc:
        if chunk and len(chunk) + len(seg) > target:
            yield chunk
            chunk, target = [], draw()
        chunk = chunk + seg
        while len(chunk) > limit:
            yield chunk[:target]
            chunk, target = chunk[target:], draw()
    if chunk:
        yield chunk


# ============================================================================ one block
# One block of one source, and the settings: all that a worker process receives.
_Job = namedtuple(
    "_Job", "block vocab_dir max_seq_length short_seq_prob dupe_factor nsp seed dtype"
)
_TOKENIZERS: dict[str, BertTokenizer] = {}  # one per process, loaded for its first block


def _run_block(job: _Job) -> tuple:
    """Split, tokenize and pair the documents of one block. Returns the ids of all its
    examples concatenated (N,), lengths (n,) int64, sep (n,) int32, nsp (n,) int8, stats."""
    if job.vocab_dir not in _TOKENIZERS:
        _TOKENIZERS[job.vocab_dir] = BertTokenizer.from_pretrained(job.vocab_dir)
    tok = _TOKENIZERS[job.vocab_dir]
    block = job.block
    sentences, counts = [], []
    for paragraphs in documents(block):
        before = len(sentences)
        for paragraph in paragraphs:
            sentences += split_sentences(paragraph)
        counts.append(len(sentences) - before)
    # One batch call for the whole block: the engine spreads it over all cores.
    ids = (
        tok(
            sentences,
            add_special_tokens=False,
            return_token_type_ids=False,
            return_attention_mask=False,
        )["input_ids"]
        if sentences
        else []
    )
    ends = np.cumsum(counts, dtype=np.int64)
    docs = [[x for x in ids[e - n : e] if x] for n, e in zip(counts, ends, strict=True)]
    docs = [doc for doc in docs if doc]  # (a sentence of control characters has no ids)
    stats = dict.fromkeys(STATS, 0)
    stats.update(
        documents=len(docs),
        documents_skipped=len(counts) - len(docs),
        single_document_blocks=int(job.nsp and len(docs) == 1),
    )
    flat, lengths, seps, labels = [], [], [], []
    cls, sep = tok.cls_token_id, tok.sep_token_id
    for dupe in range(job.dupe_factor):
        for d in range(len(docs)):
            # Seeded by what names the document, never by the process that happens to read it.
            rng = random.Random(f"{job.seed}/{dupe}/{block.file_index}/{block.block_index}/{d}")
            if job.nsp:
                pairs = _pairs(docs, d, rng, job.max_seq_length - 3, job.short_seq_prob, stats)
            else:
                singles = _singles(docs[d], rng, job.max_seq_length - 2, job.short_seq_prob)
                pairs = ((a, None, False) for a in singles)
            for a, b, is_random in pairs:
                flat += [cls, *a, sep, *b, sep] if b is not None else [cls, *a, sep]
                lengths.append(len(a) + (len(b) + 3 if b is not None else 2))
                seps.append(len(a) + 1)
                labels.append(int(is_random))
    stats["random_next"] = sum(labels)
    return (
        np.array(flat, dtype=job.dtype),
        np.array(lengths, dtype=np.int64),
        np.array(seps, dtype=np.int32),
        np.array(labels, dtype=np.int8),
        stats,
    )


# ============================================================================ writing
def _write_shard(out: Path, k: int, examples: list[tuple[np.ndarray, int, int]]) -> dict:
    """Write shard ``k`` of (ids, sep, nsp) examples as four .npy files, each by rename."""
    offsets = np.zeros(len(examples) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids, _, _ in examples], out=offsets[1:])
    name = f"shard_{k:05d}"
    arrays = {
        "input_ids": np.concatenate([ids for ids, _, _ in examples]),
        "offsets": offsets,
        "sep": np.array([s for _, s, _ in examples], dtype=np.int32),
        "nsp": np.array([x for _, _, x in examples], dtype=np.int8),
    }
    for key, array in arrays.items():

        def save(tmp: str, array: np.ndarray = array) -> None:
            with open(tmp, "wb") as f:  # a file object: np.save adds ".npy" to a bare name
                np.save(f, array)

        atomic_write(out / f"{name}.{key}.npy", save)
    return {"name": name, "examples": len(examples), "tokens": int(offsets[-1])}


# ============================================================================ prepare
def _in_order(jobs: Iterator[_Job], workers: int) -> Iterator[tuple[_Job, tuple]]:
    """Each job with its result, in the jobs' order. ``workers`` > 1: spread over spawned
    processes, at most two jobs per process given out ahead (blocks are read as they are
    needed: the memory of a preparation does not grow with the corpus); one job alone, or
    ``workers`` 1: computed here."""
    first = list(itertools.islice(jobs, 2))
    if workers == 1 or len(first) < 2:
        for job in itertools.chain(first, jobs):
            yield job, _run_block(job)
        return
    # Spawned, not forked, processes: a fork would not carry the tokenizer engine's threads over.
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        window: deque = deque()
        for job in itertools.chain(first, jobs):
            window.append((job, pool.apply_async(_run_block, (job,))))
            if len(window) > 2 * workers:
                job, result = window.popleft()
                yield job, result.get()
        while window:
            job, result = window.popleft()
            yield job, result.get()
    finally:
        pool.terminate()  # all results are in, or a block failed


def _resume_point(out: Path, manifest: dict) -> dict:
    """progress.json of an interrupted preparation in ``out``, checked against ``manifest``."""
    path = out / PROGRESS
    if not path.is_file():
        raise FileNotFoundError(
            f"cannot resume: {out} holds no {PROGRESS} (a preparation that stopped before its "
            "first shard, or one by an older version); pass overwrite=True to start over"
        )
    progress = json.loads(path.read_text("utf-8"))
    have = progress.get("manifest", {})
    changed = [
        f"{key} {have.get(key)!r} then, {value!r} now"
        for key, value in manifest.items()
        if have.get(key) != value
    ]
    if changed:
        raise ValueError(
            f"cannot resume: {out} was prepared from other inputs or settings ("
            + "; ".join(changed)
            + "); run as before, or pass overwrite=True to start over"
        )
    return progress


def prepare(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    vocab_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    max_seq_length: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 1,
    nsp: bool = True,
    seed: int = 12345,
    shard_size: int = 100_000,
    workers: int = 1,
    progress: bool = True,
    overwrite: bool = False,
    resume: bool = False,
    block_bytes: int = BLOCK_BYTES,
    text_column: str = "text",
    text_field: str = "text",
) -> Path:
    """Turn a corpus into a pre-training corpus in ``output_dir`` (returned; format and recipe
    in the module docstring), reading it ``dupe_factor`` times. ``inputs``: files, folders or
    globs of text (plain, WikiText, JSON lines; gzip or zstd compressed too), Parquet files or
    Arrow datasets (bertlab.data.readers); ``text_column`` names a table's text column,
    ``text_field`` the text's field in JSON lines. ``workers`` > 1 spreads the blocks over
    spawned processes (call it under ``if __name__ == "__main__":``) with the same result;
    ``block_bytes`` sets the blocks and so the random choices. A folder holding a prepared
    corpus, or part of one, is refused unless ``overwrite``; ``resume`` continues an
    interrupted preparation from its last shard, with the same result as one uninterrupted run
    (the inputs and settings must be those it started with)."""
    entries = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    if not entries:
        raise ValueError("prepare needs at least one input file")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob!r}")
    # max_seq_length: a token each in A and B, and the three special tokens
    for name, value, least in (
        ("max_seq_length", max_seq_length, 5),
        ("shard_size", shard_size, 1),
        ("dupe_factor", dupe_factor, 1),
        ("workers", workers, 1),
        ("block_bytes", block_bytes, 1),
    ):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: give one")
    sources = find_sources(entries, text_column=text_column, text_field=text_field)
    out = Path(output_dir)
    started_before = (out / PROGRESS).exists() or any(out.glob("shard_*.npy"))
    if (out / "meta.json").exists() and not overwrite:
        raise FileExistsError(
            f"{out} already holds a prepared corpus (or part of one); pass "
            "overwrite=True to replace it"
        )
    if started_before and not (overwrite or resume):
        raise FileExistsError(
            f"{out} already holds a prepared corpus (or part of one); pass "
            "overwrite=True to replace it, or resume=True to continue it"
        )

    tok = BertTokenizer.from_pretrained(vocab_dir)
    vocab_size = max(tok.vocab.values()) + 1
    settings = dict(
        vocab_dir=str(vocab_dir),
        max_seq_length=max_seq_length,
        nsp=nsp,
        seed=seed,
        short_seq_prob=short_seq_prob,
        dupe_factor=dupe_factor,
        dtype="uint16" if vocab_size < 65536 else "int32",
    )
    manifest = {
        **settings,
        "block_bytes": block_bytes,
        "shard_size": shard_size,
        "inputs": [s.stamp() for s in sources],
    }
    # Where the work starts: block `begin` (counted over all sources), its first `skip`
    # examples already in the shards, whose blocks' stats are `totals`.
    totals, shards, begin, skip = dict.fromkeys(STATS, 0), [], 0, 0
    if resume and started_before:
        point = _resume_point(out, manifest)
        shards, totals, begin, skip = (point[k] for k in ("shards", "totals", "block", "skip"))
        for name in {p.name.split(".")[0] for p in out.glob("shard_*.npy")}:
            if int(name.removeprefix("shard_")) >= len(shards):  # written after the record
                for stale in out.glob(f"{name}.*.npy"):
                    stale.unlink()

    def all_blocks() -> Iterator[Block]:
        for i, source in enumerate(sources):
            yield from blocks(source, i, block_bytes)

    numbered = itertools.islice(enumerate(all_blocks()), begin, None)
    jobs = (_Job(block, **settings) for _, block in numbered)
    # The examples not yet in a shard, and per block (from the first with examples left, in
    # order): [its number, examples left, its stats]; a block's stats join the totals when
    # its last example is in a shard, so that a resumed run counts every block once.
    pending: list = []
    waiting: deque = deque()
    status = Progress() if progress else None  # rewritten in place on a terminal only
    started = shown = time.perf_counter()

    def say(file: int) -> None:
        seconds = max(time.perf_counter() - started, 1e-9)
        status.update(
            f"prepare: file {file}/{len(sources)}, {seq:,} block{'s' if seq != 1 else ''}, "
            f"{tokens / seconds:,.0f} tokens/s"
        )

    tokens, seq = 0, begin  # seq: the number of the next block

    def write(examples: list) -> None:
        if not shards:  # the output starts with the first shard, never before
            out.mkdir(parents=True, exist_ok=True)
            for old in (out / "meta.json", out / PROGRESS, *out.glob("shard_*.npy")):
                old.unlink(missing_ok=True)  # meta.json first: now "unfinished"
        shards.append(_write_shard(out, len(shards), examples))
        n = len(examples)
        for entry in waiting:  # the blocks whose examples these are, first first
            took = min(n, entry[1])
            entry[1], n = entry[1] - took, n - took
        while waiting and waiting[0][1] == 0:
            for key, value in waiting.popleft()[2].items():
                totals[key] += value

    def record() -> None:
        """progress.json after each shard: where a resumed run starts."""
        point = {
            "manifest": manifest,
            "shards": shards,
            "totals": totals,
            "block": waiting[0][0] if waiting else seq,
            "skip": waiting[0][3] - waiting[0][1] if waiting else 0,
        }
        text = json.dumps(point, indent=1) + "\n"
        atomic_write(out / PROGRESS, lambda p: Path(p).write_text(text, "utf-8"))

    try:
        for job, result in _in_order(jobs, workers):
            ids, lengths, sep, nsp_, stats = result
            examples = list(zip(np.split(ids, np.cumsum(lengths))[:-1], sep, nsp_, strict=True))
            first = skip if seq == begin else 0  # examples of a resumed block already written
            pending += examples[first:]
            # [its number, examples not yet in a shard, its stats, its examples]
            waiting.append([seq, len(examples) - first, stats, len(examples)])
            seq, tokens = seq + 1, tokens + int(lengths.sum())
            while len(pending) >= shard_size:
                write(pending[:shard_size])
                del pending[:shard_size]
                record()
            if status is not None and time.perf_counter() - shown > 0.2:
                shown = time.perf_counter()
                say(job.block.file_index + 1)
        if status is not None:  # the final figures, written to a log too however short the run
            say(len(sources))
        if pending:
            write(pending)
        for _, _, stats, _ in waiting:  # blocks without examples at the end
            for key, value in stats.items():
                totals[key] += value
    finally:
        if status is not None:
            status.close()
    if not shards:
        raise ValueError(
            f"no examples could be made from {', '.join(s.path for s in sources)}: "
            f"{totals['documents']} documents with text, {totals['documents_skipped']} empty "
            f"ones skipped, {totals['chunks_dropped']} too short to make a sentence pair (one "
            "token, and no other document to pair it with); is the corpus empty?"
        )
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "vocab_size": vocab_size,
        "do_lower_case": tok.do_lower_case,
        "cls_token_id": tok.cls_token_id,
        "sep_token_id": tok.sep_token_id,
        "pad_token_id": tok.pad_token_id,
        **settings,
        "block_bytes": block_bytes,
        "num_examples": sum(s["examples"] for s in shards),
        "num_tokens": sum(s["tokens"] for s in shards),
        **totals,
        "shards": shards,
        "inputs": [s.describe() for s in sources],
    }
    text = json.dumps(meta, indent=2) + "\n"
    atomic_write(out / "meta.json", lambda p: Path(p).write_text(text, "utf-8"))
    (out / PROGRESS).unlink(missing_ok=True)
    return out


# ============================================================================ reading back
def read_meta(directory: str | os.PathLike) -> dict:
    """A prepared corpus's meta.json (settings and shard list), checked for its format."""
    path = Path(directory) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no meta.json in {directory}: not a prepared corpus (run `bertlab prepare`), or "
            "its preparation did not finish"
        )
    meta = json.loads(path.read_text("utf-8"))
    if (meta.get("format"), meta.get("version")) != (FORMAT, VERSION):
        raise ValueError(f"{directory} does not hold a {FORMAT} of version {VERSION}")
    return meta


class PretrainingCorpus(torch.utils.data.Dataset):
    """A prepared corpus, memory-mapped (``np.load(mmap_mode="r")``). ``shards`` (indices into
    meta.json's list) opens only those: ``shards=range(rank, n_shards, world_size)`` gives one
    rank of a distributed job its own part."""

    def __init__(self, directory: str | os.PathLike, shards: Iterable[int] | None = None):
        self.directory = d = Path(directory)
        self.meta = read_meta(d)
        entries = self.meta["shards"]
        chosen = list(range(len(entries)) if shards is None else shards)
        for k in chosen:
            if not 0 <= k < len(entries):
                raise IndexError(f"shard {k} is outside the {len(entries)} shards of {d}")
        self.pad_id = int(self.meta["pad_token_id"])
        self._names = [entries[k]["name"] for k in chosen]
        self._starts = np.cumsum([0] + [entries[k]["examples"] for k in chosen])
        self._open()

    def _open(self) -> None:
        self._shards = [
            {
                key: np.load(self.directory / f"{name}.{key}.npy", mmap_mode="r")
                for key in ("input_ids", "offsets", "sep", "nsp")
            }
            for name in self._names
        ]
        for name, shard, n in zip(self._names, self._shards, np.diff(self._starts), strict=True):
            if len(shard["offsets"]) != n + 1:
                raise ValueError(f"{name} in {self.directory} does not match meta.json")

    def __getstate__(self) -> dict:  # DataLoader workers map the files again, not copy them
        return {**self.__dict__, "_shards": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Example i: input_ids (n,) int64; token_type_ids (n,) int64, 1 after the first [SEP];
        next_sentence_label () int64: 0 when B follows A, 1 when B is random."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"example {i} is outside the {len(self)} examples")
        i %= len(self)
        s = int(np.searchsorted(self._starts, i, side="right")) - 1
        shard, j = self._shards[s], i - int(self._starts[s])
        ids = shard["input_ids"][int(shard["offsets"][j]) : int(shard["offsets"][j + 1])]
        ids = torch.from_numpy(ids.astype(np.int64))
        types = torch.zeros_like(ids)
        types[int(shard["sep"][j]) + 1 :] = 1
        label = torch.tensor(int(shard["nsp"][j]))
        return {"input_ids": ids, "token_type_ids": types, "next_sentence_label": label}

    @staticmethod
    def collate(examples: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict:
        """Pad to the longest example: input_ids (B, T) with ``pad_id``, token_type_ids and
        attention_mask (B, T) with 0 at padding, next_sentence_label (B,); all int64."""
        batch = pad(examples, pad_id)
        batch["next_sentence_label"] = torch.stack([e["next_sentence_label"] for e in examples])
        return batch


collate = PretrainingCorpus.collate

"""Corpus-scale inference, ``bertlab predict embed|classify|tag --file BIG --out OUT``: files of
millions of lines, streamed, resumable, spread over the processes of ``torchrun``.

What lives here: the input read as a stream (JSON lines with "text", and "pair" for classify; or
plain text lines as ``--file`` reads them), checked in full before any work; the input cut into
chunks of ``chunk_lines`` lines; each chunk's results written atomically to a part file in
``OUT.parts/`` beside a manifest (the input's size, mtime and edge hashes, the task, the model
folder and the options), so that ``--resume`` redoes nothing finished and refuses other inputs
or settings; the parts joined in order into OUT (JSON lines as ``--json`` prints them, or for
embed an (N, H) float32 ``.npy`` or a Parquet file) under a temporary name, then renamed. Under
torchrun rank r takes the chunks r, r+W, ... of those left and rank 0 waits for the others'
parts, then assembles: a chunk's results never depend on the process that computed them.

Every text and pair passes the pipelines' text rules (text.py) when the input is checked, so a
bad line is named before any work. Imports the pipelines, bertlab.files, bertlab.distributed
and bertlab.progress; the command line (``bertlab.cli.tasks``) imports this.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from bertlab.distributed import world
from bertlab.files import atomic_write, resolve_model_dir
from bertlab.pipelines import pipeline
from bertlab.pipelines.text import check_text
from bertlab.progress import Progress

CHUNK_LINES = 10_000  # input lines per part file: the most a resumed run computes again
TASKS = ("embed", "classify", "tag")
FORMATS = ("jsonl", "npy", "parquet")
SUFFIXES = {".npy": "npy", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}
EDGE = 1 << 16  # bytes hashed at each end of the input for the manifest
POLL_SECONDS = 0.5  # rank 0, waiting for the other ranks' parts
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class CorpusJob:
    """One ``bertlab predict --out`` run. ``format`` None: from OUT's suffix (else jsonl)."""

    task: str
    file: str | os.PathLike
    out: str | os.PathLike
    model: str | os.PathLike = "default"
    format: str | None = None
    batch_size: int = 32
    device: str = "cpu"
    top_k: int | None = None  # classify
    pair: str | None = None  # classify: the second text of lines without their own "pair"
    pooling: str = "mean"  # embed
    normalize: bool = True  # embed
    resume: bool = False
    overwrite: bool = False
    chunk_lines: int = CHUNK_LINES


@dataclass(frozen=True)
class Scan:
    """The input, read once and checked: JSON lines or text, and per chunk its first byte and
    how many inputs it holds (blank lines are skipped)."""

    json: bool
    offsets: list[int]
    counts: list[int]


@dataclass(frozen=True)
class CorpusResult:
    out: Path | None  # None on the ranks other than 0, which assemble nothing
    rows: int
    chunks: int
    reused: int  # chunks found finished by --resume
    format: str
    processes: int


def output_format(job: CorpusJob) -> str:
    """The format of OUT, checked against the task; Parquet only when pyarrow imports."""
    if job.task not in TASKS:
        raise ValueError(f"--out takes the tasks {', '.join(TASKS)}, not {job.task!r}")
    fmt = job.format or SUFFIXES.get(Path(job.out).suffix.lower(), "jsonl")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt != "jsonl" and job.task != "embed":
        raise ValueError(f"--format {fmt} holds vectors, which embed gives and {job.task} does not")
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ValueError("--format parquet needs pyarrow: pip install pyarrow") from None
    if type(job.chunk_lines) is not int or job.chunk_lines < 1:
        raise ValueError(f"--chunk-lines must be 1 or more, got {job.chunk_lines!r}")
    return fmt


def _items(raw: bytes, n: int, path: Path, as_json: bool) -> list[tuple[str, str | None]]:
    """Line ``n`` (from 1) of ``path`` -> its inputs, (text, pair or None): none when blank."""
    try:
        line = raw.decode("utf-8").removeprefix("\ufeff" if n == 1 and as_json else "")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} line {n} is not UTF-8 ({e.reason} at byte {e.start})") from None
    if not as_json:  # as --file reads text: every line break splitlines knows, no blank lines
        return [(check_text(x, f"{path} line {n}"), None) for x in line.splitlines() if x.strip()]
    if not line.strip():
        return []
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path} line {n} is not valid JSON ({e.msg}, column {e.colno}); JSON lines input "
            "(a .jsonl file, or a first line that is an object) needs an object on every line"
        ) from None
    if not isinstance(obj, dict) or "text" not in obj:
        has = f"keys {', '.join(obj)}" if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(f'{path} line {n} has no "text" field (it has {has or "nothing"})')
    for key in ("text", "pair"):
        if key in obj and not isinstance(obj[key], str):
            kind = type(obj[key]).__name__
            raise ValueError(f'{path} line {n}: "{key}" is a {kind}, not a string')
        if key in obj:
            check_text(obj[key], f'{path} line {n} "{key}"')
    return [(obj["text"], obj.get("pair"))]


def scan_input(path: Path, chunk_lines: int) -> Scan:
    """Every line of ``path`` parsed and checked, one at a time (the file is never held)."""
    if not path.is_file():
        kind = "a folder, not a file of lines" if path.is_dir() else "missing"
        raise FileNotFoundError(f"the input file {path} is {kind}")
    as_json = True if path.suffix.lower() in (".jsonl", ".ndjson") else None
    offsets, counts, at = [], [], 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if (n - 1) % chunk_lines == 0:
                offsets.append(at)
                counts.append(0)
            at += len(raw)
            if as_json is None and raw.removeprefix(BOM).strip():
                as_json = raw.removeprefix(BOM).lstrip().startswith(b"{")
            counts[-1] += len(_items(raw, n, path, bool(as_json)))
    if not sum(counts):
        raise ValueError(f"the input {path} has no input line (it is empty or blank)")
    return Scan(bool(as_json), offsets, counts)


def read_chunk(path: Path, scan: Scan, k: int, chunk_lines: int) -> list[tuple[str, str | None]]:
    """The inputs of chunk ``k``: lines k*chunk_lines + 1 ... (k+1)*chunk_lines."""
    items = []
    with open(path, "rb") as f:
        f.seek(scan.offsets[k])
        for n, raw in enumerate(f, k * chunk_lines + 1):
            items += _items(raw, n, path, scan.json)
            if n == (k + 1) * chunk_lines:
                break
    return items


def manifest(job: CorpusJob, fmt: str, model_dir: Path) -> dict[str, Any]:
    """What the parts were computed from: compared key by key by --resume."""
    path = Path(job.file).resolve()
    stat = path.stat()
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(EDGE)).hexdigest()
        f.seek(max(0, stat.st_size - EDGE))
        tail = hashlib.sha256(f.read(EDGE)).hexdigest()
    used = {"embed": ("pooling", "normalize"), "classify": ("top_k", "pair"), "tag": ()}
    return {
        "input": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "first_bytes_sha256": head,
        "last_bytes_sha256": tail,
        "task": job.task,
        "model": str(model_dir.resolve()),
        "format": fmt,
        "chunk_lines": job.chunk_lines,
        **{name: getattr(job, name) for name in used[job.task]},
    }


def check_folders(out: Path, parts: Path, job: CorpusJob, want: dict[str, Any]) -> None:
    """Refuse to replace or mix earlier work unless told: --resume, --overwrite."""
    if job.resume and job.overwrite:
        raise ValueError("--resume and --overwrite contradict each other: give one")
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder; give a file name")
    if out.exists() and not job.overwrite:
        raise FileExistsError(f"{out} exists; --overwrite replaces it")
    if parts.exists() and not (job.resume or job.overwrite):
        raise FileExistsError(
            f"{parts} holds an unfinished run: --resume continues it, --overwrite starts over"
        )
    if job.resume and parts.exists():
        found = parts / "manifest.json"
        if not found.exists():
            raise FileNotFoundError(f"{found} is missing: {parts} cannot resume; --overwrite")
        have = json.loads(found.read_text("utf-8"))
        changed = [
            f"{k} {have.get(k)!r} then, {v!r} now" for k, v in want.items() if have.get(k) != v
        ]
        if changed:
            raise ValueError(
                f"cannot resume: {parts} was computed from another input or settings ("
                + "; ".join(changed)
                + "); run as before, or --overwrite to start over"
            )


def _part(parts: Path, k: int, fmt: str) -> Path:
    return parts / f"part-{k:06d}.{'f32' if fmt == 'npy' else fmt}"


def _compute(pipe: Any, job: CorpusJob, items: list[tuple[str, str | None]]) -> Any:
    """One batch's results: embed (B, H) float32, classify and tag a list, as ``run`` gives."""
    texts = [t for t, _ in items]
    if job.task == "embed":
        return pipe(texts, pooling=job.pooling, normalize=job.normalize)
    if job.task == "tag":
        return pipe(texts)
    pairs = [job.pair if p is None else p for _, p in items]
    results: list = [None] * len(items)
    for paired in (True, False):  # a batch is pairs or single texts: one call for each
        idx = [i for i, p in enumerate(pairs) if (p is not None) == paired]
        if idx:
            got = pipe(
                [texts[i] for i in idx],
                [pairs[i] for i in idx] if paired else None,
                top_k=job.top_k or 1,
            )
            for i, r in zip(idx, got, strict=True):
                results[i] = r
    return results


def _write_part(target: Path, fmt: str, pipe: Any, texts: list[str], rows: Any) -> None:
    """``rows``: embed's (n, H) float32 vectors, else a list of results."""
    if fmt == "jsonl":
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
        lines = "".join(pipe.json_line(t, r) + "\n" for t, r in zip(texts, rows, strict=True))
        atomic_write(target, lambda tmp: Path(tmp).write_text(lines, "utf-8"))
    elif fmt == "npy":  # the rows alone: assemble writes the one header
        vectors = rows.numpy().astype("<f4").tobytes()
        atomic_write(target, lambda tmp: Path(tmp).write_bytes(vectors))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(rows.numpy().reshape(-1), pa.float32())
        vectors = pa.FixedSizeListArray.from_arrays(flat, rows.shape[1])
        table = pa.table({"text": texts, "embedding": vectors})
        atomic_write(target, lambda tmp: pq.write_table(table, tmp))


def assemble(parts: list[Path], counts: list[int], out: Path, fmt: str) -> None:
    """The parts, in order, into OUT: written under a temporary name, then renamed, so that
    OUT is whole or absent (an .npy header that promises N rows has them all)."""

    def write(tmp: str) -> None:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            with pq.ParquetWriter(tmp, pq.read_schema(parts[0])) as writer:
                for p in parts:
                    writer.write_table(pq.read_table(p))
            return
        with open(tmp, "wb") as dst:
            if fmt == "npy":  # the parts are float32 rows without a header
                width = parts[0].stat().st_size // (4 * counts[0])
                header = {"descr": "<f4", "fortran_order": False, "shape": (sum(counts), width)}
                np.lib.format.write_array_header_1_0(dst, header)
            for p, n in zip(parts, counts, strict=True):
                if fmt == "npy" and p.stat().st_size != 4 * width * n:
                    raise ValueError(f"{p} does not hold {n} rows of {width}: --overwrite")
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, dst)

    atomic_write(out, write)


def predict_corpus(job: CorpusJob, stream: TextIO | None = None) -> CorpusResult:
    """Run ``job``: everything checked and the model loaded first, then the chunks left to
    this rank, then (rank 0) OUT assembled and the parts removed. A status line goes to
    ``stream`` (standard error) on rank 0 when it is a terminal, and nothing otherwise."""
    rank, size = world()
    path, out = Path(job.file), Path(job.out)
    parts = out.with_name(out.name + ".parts")
    fmt = output_format(job)
    scan = scan_input(path, job.chunk_lines)
    model_dir = resolve_model_dir(job.model)
    want = manifest(job, fmt, model_dir)
    check_folders(out, parts, job, want)
    chunks = [k for k, n in enumerate(scan.counts) if n]
    resumed = job.resume and parts.exists()
    done = [k for k in chunks if resumed and _part(parts, k, fmt).exists()]
    mine = [k for k in chunks if k not in done][rank::size]  # the same list on every rank
    device = job.device
    if device == "cuda" and size > 1:
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    pipe = pipeline(job.task, model_dir, device, job.batch_size) if mine else None
    _barrier()  # every rank has looked at the folders before rank 0 writes there
    if rank == 0:
        if job.overwrite:
            shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True, exist_ok=True)
        for stale in parts.glob(".*.tmp"):  # left by a run killed while writing a part
            stale.unlink()
        atomic_write(parts / "manifest.json", lambda t: Path(t).write_text(json.dumps(want)))
    _barrier()
    stream = sys.stderr if stream is None else stream
    bar = Progress(stream) if rank == 0 and stream.isatty() else None
    total, reused, start = sum(scan.counts), sum(scan.counts[k] for k in done), time.monotonic()
    finished = reused

    def written() -> int:  # the inputs of the parts written so far, by every rank
        return sum(scan.counts[c] for c in chunks if _part(parts, c, fmt).exists())

    def show(current: int = 0) -> None:
        if bar is not None:
            now = finished + current
            rate = (now - reused) / max(time.monotonic() - start, 1e-3)
            bar.update(
                f"{job.task}: {now:,} of {total:,} inputs ({now / total:.0%}), {rate:,.0f}/s"
            )

    try:
        for k in mine:
            items, results, got = read_chunk(path, scan, k, job.chunk_lines), [], 0
            if len(items) != scan.counts[k]:  # the file changed since it was read
                raise ValueError(f"{path} changed while it was read: start again")
            for i in range(0, len(items), job.batch_size):
                results.append(_compute(pipe, job, items[i : i + job.batch_size]))
                got += len(results[-1])
                show(got)
            rows = torch.cat(results) if job.task == "embed" else sum(results, [])
            _write_part(_part(parts, k, fmt), fmt, pipe, [t for t, _ in items], rows)
            finished = written()
        while rank == 0 and finished < total:  # the other ranks' parts, as they come
            time.sleep(POLL_SECONDS)
            finished = written()
            show()
    finally:
        if bar is not None:
            bar.close()
    if rank != 0:
        return CorpusResult(None, total, len(chunks), len(done), fmt, size)
    assemble([_part(parts, k, fmt) for k in chunks], [scan.counts[k] for k in chunks], out, fmt)
    shutil.rmtree(parts)
    return CorpusResult(out, total, len(chunks), len(done), fmt, size)


def _barrier() -> None:
    if world()[1] > 1:
        torch.distributed.barrier()


@contextmanager
def torchrun_group() -> Iterator[None]:
    """A gloo process group for the setup's barriers when torchrun launched this process
    (WORLD_SIZE > 1): CPU or GPU work alike. Nothing otherwise."""
    dist = torch.distributed
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()

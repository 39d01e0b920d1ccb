"""The corpora ``bertlab prepare`` reads, as people have them, each as a stream of documents.

    sources = find_sources(["wiki/*.jsonl.zst", "books.parquet", "saved_dataset/"])
    for block in blocks(sources[0], 0, BLOCK_BYTES): documents(block) ...

What a source may be (``find_sources``): a text file, plain (a paragraph per line, blank lines
between documents), WikiText (``.tokens``, or `` = Title = `` lines) or JSON lines (``.jsonl``:
a document per line in its ``text_field``), each raw or compressed with gzip (``.gz``) or
zstd (``.zst``, ``.zstd``); a Parquet file (``.parquet``: a document per row, in its
``text_column``); an Arrow dataset saved by ``datasets``' ``save_to_disk`` (a folder with
state.json) or one ``.arrow`` file; a folder of Parquet files; or a glob of any of these
(``"shards/*.parquet"``). A document's paragraphs are its non-blank lines.

Every source is read once, in order, by one process, and cut into *blocks* of about
``block_bytes`` of text, each at a document boundary: a text file at the first boundary line at
or after each multiple of ``block_bytes`` (block ``k`` holds the documents that start in bytes
[k * block_bytes, (k+1) * block_bytes) of the decompressed text, so blocks with no document
start are absent), a table after the row that brings its block to ``block_bytes`` of UTF-8. The
cut depends on the source alone. A block carries its text (the lines' bytes, or the rows'
strings), so the processes that split and tokenize it need not read the source; the reader
holds one block and what its decoder buffers (a compressed frame, a Parquet page, an Arrow
record batch), whatever the size of the source.

Optional packages are imported where a source needs them: pyarrow (Parquet, Arrow), zstandard
(``.zst``); a missing one is refused in one line naming the extra that installs it
(bertlab.extras). Imports bertlab.extras only.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from bertlab.extras import require

BLOCK_BYTES = 1 << 20
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
ROWS_PER_READ = 1024  # rows a table reader decodes at a time

_TITLE = re.compile(r"= (?!=)(?:.*[^=])? =")  # " = Title = " once stripped, not " = = Sub = = "
_SUBTITLE = re.compile(r"=(?: =)+ .* =(?: =)+")
_TITLE_BYTES = re.compile(_TITLE.pattern.encode())
# Lines where a block may begin: where a document can start. Tested on bytes with ASCII rules,
# so every line accepted here is a document boundary for the parser too.
BOUNDARY: dict[str, Callable[[bytes], bool]] = {
    "plain": lambda raw: not raw.strip(),
    "wikitext": lambda raw: _TITLE_BYTES.fullmatch(raw.strip()) is not None,
    "jsonl": lambda raw: True,
}


@dataclass(frozen=True)
class Source:
    """One input: a text file (``kind`` "text", with its ``layout`` and ``compression``), a
    Parquet file ("parquet") or an Arrow dataset or file ("arrow", ``files`` its .arrow files
    in order). ``field``: the JSON field (jsonl) or column (tables) that holds the text."""

    path: str
    kind: str
    layout: str | None = None
    compression: str | None = None
    field: str = "text"
    files: tuple[str, ...] = ()

    def size(self) -> int:
        """Bytes on disk: the file's, or the dataset's .arrow files'."""
        return sum(os.stat(p).st_size for p in (self.files or (self.path,)))

    def describe(self) -> dict[str, Any]:
        """The source in meta.json: path, bytes, and how it is read."""
        about: dict[str, Any] = {"path": self.path, "bytes": self.size()}
        if self.kind == "text":
            about["layout"] = self.layout
            if self.compression:
                about["compression"] = self.compression
            if self.layout == "jsonl" and self.field != "text":
                about["field"] = self.field
        else:
            about.update(format=self.kind, column=self.field)
        return about

    def stamp(self) -> dict[str, Any]:
        """What a resumed run compares: the description and every file's modification time."""
        mtimes = [os.stat(p).st_mtime_ns for p in (self.files or (self.path,))]
        return {**self.describe(), "mtime_ns": mtimes}


@dataclass(frozen=True)
class Block:
    """A piece of one source, cut at a document boundary. ``lines``: the raw lines' bytes
    (text sources), starting at byte ``pos`` and line ``line`` (from 1) of the decompressed
    text; ``texts``: one document per row (tables: an Arrow string array, null for a null),
    from row ``line`` (from 0)."""

    file_index: int
    block_index: int
    name: str
    layout: str
    field: str
    line: int
    pos: int = 0
    lines: bytes | None = None
    texts: Any = None  # a pyarrow string array


# ============================================================================ finding sources
def _split_suffix(path: Path) -> tuple[str, str | None]:
    """(the suffix that says the format, the compression or None): a.jsonl.gz -> .jsonl, gzip."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    return (suffixes[-1] if suffixes else ""), compression


def open_binary(path: str | os.PathLike, compression: str | None = None) -> BinaryIO:
    """A text file opened for reading bytes, decompressed on the fly (gzip, zstd)."""
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "zstd":
        require(["zstandard"], "zstd", f"reading {path}")
        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 (closed with the reader)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, 1 << 20)  # closes the reader, which closes the file
    return open(path, "rb")


def detect_layout(path: str | os.PathLike) -> str:
    """The layout of a text file (compressed or not): ``jsonl`` (``.jsonl``: one document per
    line, in its "text" field, paragraphs on newlines), ``wikitext`` (``.tokens``, or a
    `` = Title = `` line among the first 20 non-blank ones: a title starts a document,
    `` = = Sub = = `` headings and blank lines are dropped) or ``plain`` (a sentence or
    paragraph per line, blank lines between documents)."""
    suffix, compression = _split_suffix(Path(path))
    if suffix in (".jsonl", ".ndjson", ".tokens"):
        return "wikitext" if suffix == ".tokens" else "jsonl"
    with open_binary(path, compression) as f:  # 64 KiB are enough to see a heading
        head = [line for line in (x.strip() for x in f.read(1 << 16).split(b"\n")) if line]
    return "wikitext" if any(_TITLE_BYTES.fullmatch(x) for x in head[:20]) else "plain"


def _arrow_files(folder: Path) -> list[Path]:
    """The .arrow files of a dataset saved by ``datasets``' save_to_disk, in its order."""
    state = folder / "state.json"
    if state.is_file():
        names = [f["filename"] for f in json.loads(state.read_text("utf-8"))["_data_files"]]
        return [folder / n for n in names]
    return sorted(folder.glob("*.arrow"))


def _expand(entry: str | os.PathLike) -> list[Path]:
    """A path as given, or the paths a glob matches (sorted); refused when nothing is there."""
    path = Path(entry)
    if path.exists():
        return [path]
    if glob.has_magic(str(entry)):
        found = sorted(Path(p) for p in glob.glob(str(entry), recursive=True))
        if not found:
            raise FileNotFoundError(f"no input file matches {entry}")
        return found
    raise FileNotFoundError(f"no input file at {path}")


def find_sources(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    text_column: str = "text",
    text_field: str = "text",
) -> list[Source]:
    """Every source the inputs name (module docstring), in order, each checked: a table's
    ``text_column`` exists and holds strings (refused naming the columns it has), a needed
    package is installed. Nothing is read past the schemas and 64 KiB of each text file."""
    entries = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    sources = []
    for entry in entries:
        for path in _expand(entry):
            sources += _sources_at(path, text_column, text_field)
    return sources


def _sources_at(path: Path, text_column: str, text_field: str) -> list[Source]:
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise ValueError(
                f"{path} holds a DatasetDict of the splits {', '.join(splits)}; give one split's "
                f"folder (e.g. {path / splits[0]})"
                if splits
                else f"{path} holds an empty DatasetDict"
            )
        arrow = _arrow_files(path)
        if arrow:
            source = Source(str(path), "arrow", field=text_column, files=tuple(map(str, arrow)))
            _check_table(source)
            return [source]
        parquet = sorted(path.glob("*.parquet"))
        if parquet:
            return [_sources_at(p, text_column, text_field)[0] for p in parquet]
        raise ValueError(
            f"{path} is a folder with neither an Arrow dataset (datasets' save_to_disk) nor "
            "Parquet files; give its files, or a glob"
        )
    suffix, compression = _split_suffix(path)
    if suffix in (".parquet", ".arrow"):
        if compression:
            raise ValueError(f"{path}: a {suffix} file is compressed inside; do not compress it")
        kind = suffix[1:]
        source = Source(str(path), kind, field=text_column, files=(str(path),))
        _check_table(source)
        return [source]
    layout = detect_layout(path)
    return [Source(str(path), "text", layout, compression, text_field if layout == "jsonl" else "")]


# ============================================================================ tables
def _open_arrow(path: str):
    """An Arrow IPC reader of ``path``, stream or file format, and the file to close."""
    import pyarrow as pa

    f = pa.OSFile(path)
    try:
        if f.read(6) == b"ARROW1":
            f.seek(0)
            return pa.ipc.open_file(f), f
        f.seek(0)
        return pa.ipc.open_stream(f), f
    except Exception:
        f.close()
        raise


def _schema(source: Source, path: str):
    import pyarrow.parquet as pq

    if source.kind == "parquet":
        return pq.read_schema(path)
    reader, f = _open_arrow(path)
    with f:
        return reader.schema


def _check_table(source: Source) -> None:
    """The text column is there, in every file, and holds strings."""
    require(["pyarrow"], "parquet", f"reading {source.path}")
    import pyarrow as pa

    for path in source.files:
        schema = _schema(source, path)
        if source.field not in schema.names:
            raise ValueError(
                f"{path} has no column {source.field!r} (its columns: "
                f"{', '.join(schema.names) or 'none'}); name the text with --text-column"
            )
        kind = schema.field(source.field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and str(kind) != (
            "string_view"
        ):
            raise ValueError(
                f"{path}: column {source.field!r} holds {kind}, not strings; name the text "
                "with --text-column"
            )


def _table_columns(source: Source) -> Iterator[Any]:
    """The text column as Arrow arrays, reading one Parquet page or Arrow record batch at a
    time."""
    import pyarrow.parquet as pq

    for path in source.files:
        if source.kind == "parquet":
            # buffer_size: the column read a buffer at a time, not a whole row group at once
            with pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False) as pf:
                for batch in pf.iter_batches(
                    ROWS_PER_READ, columns=[source.field], use_threads=False
                ):
                    yield batch.column(0)
            continue
        reader, f = _open_arrow(path)
        with f:
            if hasattr(reader, "num_record_batches"):  # the IPC file format
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = iter(reader)
            for batch in batches:
                yield batch.column(batch.schema.get_field_index(source.field))


def _table_blocks(source: Source, file_index: int, block_bytes: int) -> Iterator[Block]:
    """Rows into blocks: a block ends with the row that brings it to ``block_bytes`` of UTF-8.
    The rows stay Arrow arrays here (no Python string per row is made until a worker reads
    the block)."""
    import pyarrow as pa

    pool = pa.system_memory_pool()  # returns what a block took (mimalloc keeps it: RSS grows)
    parts: list = []
    size = first = row = k = 0
    for column in _table_columns(source):
        if not len(column):
            continue
        if not pa.types.is_large_string(column.type):
            column = column.cast(pa.string(), memory_pool=pool)  # (a no-op for strings)
        # the bytes of the rows up to each one, read off the array's offsets, allocating nothing
        width = np.int64 if pa.types.is_large_string(column.type) else np.int32
        offsets = np.frombuffer(column.buffers()[1], width)[column.offset :][: len(column) + 1]
        ends = offsets[1:] - offsets[0]
        start = 0
        while start < len(column):
            before = int(ends[start - 1]) if start else 0
            # the first row from `start` whose bytes bring the block to block_bytes
            j = int(np.searchsorted(ends[start:], before + block_bytes - size))
            if j >= len(column) - start:  # the block goes on into the next array
                parts.append(column.slice(start))
                size, row = size + int(ends[-1]) - before, row + len(column) - start
                break
            parts.append(column.slice(start, j + 1))
            row, start = row + j + 1, start + j + 1
            texts = pa.concat_arrays(parts, memory_pool=pool)
            yield Block(file_index, k, source.path, "table", source.field, first, texts=texts)
            parts, size, first, k = [], 0, row, k + 1
    if parts and sum(len(p) for p in parts):
        texts = pa.concat_arrays(parts, memory_pool=pool)
        yield Block(file_index, k, source.path, "table", source.field, first, texts=texts)


# ============================================================================ text files
def _text_blocks(source: Source, file_index: int, block_bytes: int) -> Iterator[Block]:
    """The lines of a text file into blocks: a boundary line at byte p starts block
    p // block_bytes when the block before it is another; lines before the first boundary
    belong to block 0."""
    boundary = BOUNDARY[source.layout]
    parts: list[bytes] = []
    pos = start = current = 0
    line = first = 1

    def block() -> Block:
        data = b"".join(parts)
        return Block(file_index, current, source.path, source.layout, source.field, first, start,
                     lines=data)  # fmt: skip

    with open_binary(source.path, source.compression) as f:
        for raw in f:
            if pos and pos // block_bytes != current and boundary(raw):
                if parts:
                    yield block()
                parts, start, first, current = [], pos, line, pos // block_bytes
            parts.append(raw)
            pos, line = pos + len(raw), line + 1
    if parts:
        yield block()


def blocks(source: Source, file_index: int, block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """The blocks of one source, in order (module docstring)."""
    if source.kind == "text":
        return _text_blocks(source, file_index, block_bytes)
    return _table_blocks(source, file_index, block_bytes)


# ============================================================================ documents
def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n") if p.strip()]


def parse_lines(
    lines: Iterable[tuple[int, bytes]],
    layout: str,
    name: str,
    line_of: Callable[[int], int],
    field: str = "text",
) -> Iterator[list[str]]:
    """(byte position, raw line) pairs of a text in ``layout`` -> its documents, each as its
    paragraphs ([] for a document without text). Strict UTF-8; a line that is not, or (jsonl)
    is not an object with a string ``field``, is refused naming ``name`` and its line number
    (``line_of(pos)``, counted when an error is raised only)."""
    doc = None
    for pos, raw in lines:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{name}, line {line_of(pos)}: invalid UTF-8 at byte {pos + e.start} of the "
                f"{'decompressed text' if name.endswith(tuple(COMPRESSIONS)) else 'file'}: "
                f"{raw[:60]!r}"
            ) from None
        text = (line.removeprefix("\ufeff") if pos == 0 else line).strip()
        if layout == "jsonl" and text:
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{name}, line {line_of(pos)}: not JSON: {e}") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise ValueError(
                    f"{name}, line {line_of(pos)}: expected an object "
                    f"with a string {field!r} field, got {text[:60]!r}"
                )
            yield _paragraphs(record[field])
        elif layout == "plain" and not text and doc is not None:  # a blank line ends a document
            yield doc
            doc = None
        elif layout == "wikitext" and _TITLE.fullmatch(text):  # its title is not running text
            if doc is not None:
                yield doc
            doc = []
        elif layout == "wikitext" and _SUBTITLE.fullmatch(text):
            continue  # section headings are not running text either
        elif text and layout != "jsonl":
            doc = [] if doc is None else doc  # (text before WikiText's first title: a document)
            doc.append(text)
    if doc is not None:
        yield doc


def documents(block: Block) -> Iterator[list[str]]:
    """A block's documents, each as its paragraphs ([] for one without text)."""
    if block.texts is not None:
        for text in block.texts.to_pylist():
            yield [] if text is None else _paragraphs(text)
        return
    data = block.lines

    def line_of(pos: int) -> int:
        return block.line + data.count(b"\n", 0, pos - block.pos)

    def lines() -> Iterator[tuple[int, bytes]]:
        at = block.pos
        for raw in io.BytesIO(data):  # split at b"\n" alone, as the file was read
            yield at, raw
            at += len(raw)

    yield from parse_lines(lines(), block.layout, block.name, line_of, block.field)

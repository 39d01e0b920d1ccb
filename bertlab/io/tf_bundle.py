"""TensorFlow's checkpoint format (the "V2" tensor bundle), read with numpy: no TensorFlow, no
protobuf library. ``tf_checkpoint.py`` builds on it for BERT's variables.

A checkpoint is ``<prefix>.index``, which names every variable and says where its bytes are, and
``<prefix>.data-0000K-of-0000N``, the shards that hold the raw little-endian tensor bytes
(``<prefix>.meta``, the graph, is not needed).

The ``.index`` file is a sorted string table in the LevelDB layout:

* a 48-byte footer at the end: the metaindex block's handle and the index block's handle (each
  ``offset, size`` as varints), zero padding to 40 bytes, then the magic number
  ``0xdb4775248b80fb57`` (8 bytes, little-endian);
* blocks, each followed by a 1-byte compression type (0, none: the only one TensorFlow writes
  here) and a 4-byte masked CRC32C of the block and that byte;
* a block is entries ``shared, non_shared, value_length`` (varints), the key's new bytes (the key
  shares its first ``shared`` bytes with the previous key) and the value; then the restart
  offsets (uint32 each) and their count (uint32);
* the index block maps the last key of each data block to that block's handle.

In the data blocks, the empty key holds a ``BundleHeaderProto`` (``num_shards`` = 1,
``endianness`` = 2, ``version`` = 3) and every other key is a variable's name with a
``BundleEntryProto``: ``dtype`` = 1, ``shape`` = 2 (a ``TensorShapeProto``: ``dim`` = 2, each
with ``size`` = 1), ``shard_id`` = 3, ``offset`` = 4, ``size`` = 5, ``crc32c`` = 6 (masked, of the
tensor's bytes), ``slices`` = 7 (set for partitioned variables). These protobuf messages are read
with the small wire-format parser below.

Every block's checksum and the checksum of every tensor read is verified. CRC32C is computed
with numpy (``crc32c``): the bytes are cut into many equal runs whose checksums are computed side
by side, eight bytes per step, then combined, which works because a CRC is linear over GF(2).

A leaf of ``io/``: imports numpy and torch only.
"""

from __future__ import annotations

import functools
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

TABLE_MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5  # compression type (1 byte) + masked CRC32C (4 bytes)


# ============================================================================ CRC32C
def _byte_tables() -> np.ndarray:
    """(8, 256) uint32: the slicing-by-8 tables of CRC32C (reflected polynomial 0x82F63B78)."""
    table = np.zeros((8, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table[0, i] = c
    for k in range(1, 8):
        table[k] = (table[k - 1] >> 8) ^ table[0][table[k - 1] & 0xFF]
    return table


_T = _byte_tables()
_T0 = [int(x) for x in _T[0]]
_SCALAR_BELOW = 4096  # bytes; shorter runs are processed one byte at a time in Python
_MAX_LANES = 1 << 14  # runs processed side by side
_COLUMNS = 256  # words transposed at a time (keeps the working set in cache)


def _mat_vec(mat: list[int], v: int) -> int:
    out, i = 0, 0
    while v:
        if v & 1:
            out ^= mat[i]
        v >>= 1
        i += 1
    return out


@functools.lru_cache(maxsize=64)
def _zeros_power(j: int) -> tuple[int, ...]:
    """The register after 2**j zero bytes, as a 32x32 GF(2) matrix (the image of each bit)."""
    if j == 0:
        return tuple(_T0[(1 << i) & 0xFF] ^ ((1 << i) >> 8) for i in range(32))
    half = list(_zeros_power(j - 1))
    return tuple(_mat_vec(half, half[i]) for i in range(32))


@functools.lru_cache(maxsize=256)
def _shift_tables(n: int) -> np.ndarray:
    """(4, 256) uint32 tables of the linear map "feed n zero bytes", one per register byte."""
    mat = [1 << i for i in range(32)]
    j = 0
    while n >> j:
        if (n >> j) & 1:
            step = _zeros_power(j)
            mat = [_mat_vec(list(step), m) for m in mat]
        j += 1
    cols = np.array(mat, dtype=np.uint32).reshape(4, 8)
    b = np.arange(256, dtype=np.uint32)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for k in range(4):
        for i in range(8):
            tables[k] ^= np.where((b >> i) & 1 == 1, cols[k, i], np.uint32(0))
    return tables


def _shift(reg: np.ndarray | int, n: int) -> np.ndarray:
    t = _shift_tables(n)
    r = np.asarray(reg, dtype=np.uint32)
    return t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ t[2][(r >> 16) & 0xFF] ^ t[3][r >> 24]


def _lanes(words: np.ndarray) -> np.ndarray:
    """Registers (K,) after each row of ``words`` (K, W) uint32, every register starting at 0."""
    K, W = words.shape
    reg = np.zeros(K, dtype=np.uint32)
    t = _T
    for start in range(0, W, _COLUMNS):
        cols = np.ascontiguousarray(words[:, start : start + _COLUMNS].T)  # (C, K)
        for lo, hi in zip(cols[0::2], cols[1::2], strict=True):
            x = reg ^ lo
            reg = (
                t[7][x & 0xFF]
                ^ t[6][(x >> 8) & 0xFF]
                ^ t[5][(x >> 16) & 0xFF]
                ^ t[4][x >> 24]
                ^ t[3][hi & 0xFF]
                ^ t[2][(hi >> 8) & 0xFF]
                ^ t[1][(hi >> 16) & 0xFF]
                ^ t[0][hi >> 24]
            )
    return reg


def _update(reg: int, data: np.ndarray) -> int:
    """The CRC register after ``data`` (uint8), starting from ``reg`` (no pre/post inversion)."""
    n = data.size
    if n < _SCALAR_BELOW:
        for b in data.tobytes():
            reg = _T0[(reg ^ b) & 0xFF] ^ (reg >> 8)
        return reg
    lanes = 1 << int(math.log2(min(_MAX_LANES, n // 512)))
    length = n // lanes // 8 * 8  # bytes per run: whole 8-byte steps
    main = lanes * length
    regs = _lanes(data[:main].view("<u4").reshape(lanes, length // 4))
    while regs.size > 1:  # combine neighbours: crc(A || B) = shift(crc(A), |B|) ^ crc(B)
        regs = _shift(regs[0::2], length) ^ regs[1::2]
        length *= 2
    reg = int(_shift(reg, main)) ^ int(regs[0])
    return _update(reg, data[main:])


def crc32c(data: bytes | bytearray | memoryview | np.ndarray) -> int:
    """The CRC32C (Castagnoli) of ``data``, as ``crc32c(b"123456789") == 0xE3069283``."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    arr = np.ascontiguousarray(arr.reshape(-1).view(np.uint8))
    return _update(0xFFFFFFFF, arr) ^ 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    """LevelDB and TensorFlow store ``rot15(crc) + 0xa282ead8``; this undoes it."""
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# ============================================================================ protobuf wire format
def _varint(buf: bytes, pos: int, what: str) -> tuple[int, int]:
    """A base-128 varint at ``pos``: (value, next position)."""
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError(f"{what}: truncated or malformed varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, what: str) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message; length-delimited values as bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, what)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, what)
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos, what)
            value, pos = bytes(buf[pos : pos + size]), pos + size
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"{what}: unsupported protobuf wire type {wire} (field {number})")
        if pos > len(buf):
            raise ValueError(f"{what}: truncated protobuf message (field {number})")
        out.append((number, value))
    return out


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# TensorFlow's DataType enum: the ones bertlab reads, as (numpy dtype, torch dtype), and names
# for the error message of the others.
DTYPES: dict[int, tuple[str, torch.dtype]] = {
    1: ("<f4", torch.float32),
    2: ("<f8", torch.float64),
    3: ("<i4", torch.int32),
    9: ("<i8", torch.int64),
    14: ("<u2", torch.bfloat16),  # read as 16-bit words, then reinterpreted
    19: ("<f2", torch.float16),
}
_DTYPE_NAMES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    19: "float16",
    20: "resource",
    21: "variant",
}


@dataclass(frozen=True)
class TFEntry:
    """Where one variable's bytes are: a ``BundleEntryProto``."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0  # masked, as stored
    num_slices: int = 0

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES.get(self.dtype, f"DataType {self.dtype}")


def _entry(value: bytes, what: str) -> TFEntry:
    kw: dict[str, Any] = {"dtype": 0, "shape": ()}
    slices = 0
    for number, v in _fields(value, what):
        if number == 1:
            kw["dtype"] = v
        elif number == 2:
            dims = []
            for n, dim in _fields(v, what):
                if n == 2:
                    size = dict(_fields(dim, what)).get(1, 0)
                    dims.append(_int64(size))
                elif n == 3 and v:
                    raise ValueError(f"{what}: the shape has unknown rank")
            kw["shape"] = tuple(dims)
        elif number in (3, 4, 5, 6):
            kw[("shard_id", "offset", "size", "crc32c")[number - 3]] = v
        elif number == 7:
            slices += 1
    return TFEntry(**kw, num_slices=slices)


# ============================================================================ the .index table
def _block(data: bytes, handle: tuple[int, int], path: Path) -> bytes:
    """One block's contents, its trailer checked (compression none, masked CRC32C)."""
    offset, size = handle
    end = offset + size + BLOCK_TRAILER_SIZE
    if end > len(data) - FOOTER_SIZE:
        raise ValueError(
            f"{path} is truncated or damaged: a block at bytes {offset}..{end} runs past the "
            f"table's end ({len(data) - FOOTER_SIZE})"
        )
    contents = data[offset : offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if unmask_crc(stored) != crc32c(contents + bytes([kind])):
        raise ValueError(f"{path} is damaged: the checksum of the block at byte {offset} fails")
    if kind != 0:
        raise ValueError(
            f"{path}: the block at byte {offset} is compressed (type {kind}); TensorFlow writes "
            "checkpoint indexes uncompressed and bertlab reads only those"
        )
    return contents


def _block_entries(block: bytes, path: Path) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of a block, keys rebuilt from their shared prefixes."""
    what = f"{path} (a block entry)"
    if len(block) < 4:
        raise ValueError(f"{path} is damaged: a block of {len(block)} bytes has no restart count")
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError(f"{path} is damaged: a block claims {restarts} restart points")
    out: list[tuple[bytes, bytes]] = []
    key, pos = b"", 0
    while pos < end:
        shared, pos = _varint(block, pos, what)
        fresh, pos = _varint(block, pos, what)
        size, pos = _varint(block, pos, what)
        if shared > len(key) or pos + fresh + size > end:
            raise ValueError(f"{path} is damaged: a block entry runs past its block")
        key = key[:shared] + block[pos : pos + fresh]
        out.append((key, block[pos + fresh : pos + fresh + size]))
        pos += fresh + size
    return out


def read_index(path: str | os.PathLike) -> tuple[dict[str, int], dict[str, TFEntry]]:
    """Parse a checkpoint's ``.index`` file: (header, entries by variable name).

    The header holds ``num_shards`` and ``endianness`` (0 little, 1 big); every block's checksum
    is verified. Raises ValueError naming the file when it is not a valid tensor-bundle index.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < FOOTER_SIZE:
        raise ValueError(f"{path} is truncated: {len(data)} bytes, shorter than the table footer")
    footer = data[-FOOTER_SIZE:]
    magic = int.from_bytes(footer[-8:], "little")
    if magic != TABLE_MAGIC:
        raise ValueError(
            f"{path} is not a TensorFlow checkpoint index or is truncated: its last 8 bytes "
            f"are {magic:#018x}, not the table magic number {TABLE_MAGIC:#018x}"
        )
    what = f"{path} (footer)"
    _, pos = _varint(footer, 0, what)  # the metaindex block: empty in a tensor bundle
    _, pos = _varint(footer, pos, what)
    index_offset, pos = _varint(footer, pos, what)
    index_size, pos = _varint(footer, pos, what)
    header: dict[str, int] = {}
    entries: dict[str, TFEntry] = {}
    for _, handle in _block_entries(_block(data, (index_offset, index_size), path), path):
        offset, p = _varint(handle, 0, what)
        size, _ = _varint(handle, p, what)
        for key, value in _block_entries(_block(data, (offset, size), path), path):
            if key == b"":
                fields = dict(_fields(value, f"{path} (header)"))
                header = {"num_shards": fields.get(1, 0), "endianness": fields.get(2, 0)}
            else:
                name = key.decode("utf-8", errors="replace")
                entries[name] = _entry(value, f"{path} (variable {name})")
    if not header:
        raise ValueError(f"{path} has no bundle header (the entry of the empty key)")
    return header, entries


# ============================================================================ the tensors
def shard_path(prefix: Path, shard_id: int, num_shards: int) -> Path:
    return prefix.parent / f"{prefix.name}.data-{shard_id:05d}-of-{num_shards:05d}"


def read_tensor(
    prefix: Path, name: str, entry: TFEntry, num_shards: int, shards: dict[int, Any]
) -> torch.Tensor:
    """One variable's tensor, its checksum verified."""
    if entry.dtype not in DTYPES:
        raise ValueError(
            f"variable {name} in {prefix}.index has dtype {entry.dtype_name}; bertlab reads "
            "float32, float16, bfloat16, float64, int32 and int64"
        )
    np_dtype, torch_dtype = DTYPES[entry.dtype]
    count = math.prod(entry.shape)
    if entry.size != count * np.dtype(np_dtype).itemsize:
        raise ValueError(
            f"variable {name} in {prefix}.index: {entry.size} bytes for shape "
            f"{list(entry.shape)} of {entry.dtype_name}"
        )
    path = shard_path(prefix, entry.shard_id, num_shards)
    if entry.shard_id not in shards:
        shards[entry.shard_id] = open(path, "rb")  # closed by the caller
    f = shards[entry.shard_id]
    f.seek(entry.offset)
    buf = bytearray(entry.size)
    got = f.readinto(buf)
    if got != entry.size:
        raise ValueError(
            f"{path} is truncated: variable {name} needs bytes {entry.offset}.."
            f"{entry.offset + entry.size}, the file has {os.path.getsize(path)}"
        )
    if crc32c(buf) != unmask_crc(entry.crc32c):
        raise ValueError(f"{path} is damaged: the checksum of variable {name} fails")
    array = np.frombuffer(buf, dtype=np_dtype).reshape(entry.shape)
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if torch_dtype is torch.bfloat16 else tensor


def find_prefix(path: str | os.PathLike) -> Path:
    """The checkpoint prefix (``.../bert_model.ckpt``) of a folder, an ``.index`` file or a
    prefix. Raises FileNotFoundError when there is none, ValueError when a folder holds several."""
    p = Path(path)
    if p.is_dir():
        indexes = sorted(p.glob("*.index"))
        if not indexes:
            raise FileNotFoundError(f"no TensorFlow checkpoint (*.index) in {p}")
        if len(indexes) > 1:
            names = ", ".join(i.name for i in indexes)
            raise ValueError(
                f"{p} holds {len(indexes)} checkpoints ({names}); pass the one to read as a "
                "prefix, e.g. " + str(indexes[-1].with_suffix(""))
            )
        return indexes[0].with_suffix("")
    if p.suffix == ".index" and p.is_file():
        return p.with_suffix("")
    if Path(f"{p}.index").is_file():
        return p
    raise FileNotFoundError(f"no TensorFlow checkpoint at {p} (expected a folder or {p}.index)")


def is_tf_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding ``*.index`` (one checkpoint or more), an ``.index``
    file, or a checkpoint prefix such as ``.../bert_model.ckpt``."""
    p = Path(path)
    if p.is_dir():
        return any(p.glob("*.index"))
    return (p.suffix == ".index" and p.is_file()) or Path(f"{p}.index").is_file()


def read_tf_variables(
    path: str | os.PathLike, names: list[str] | None = None
) -> dict[str, torch.Tensor]:
    """Variables of a checkpoint by their TensorFlow names, as stored (nothing transposed or
    renamed): all of them, or ``names``. Every checksum is verified."""
    prefix = find_prefix(path)
    header, entries = read_index(Path(f"{prefix}.index"))
    num_shards = check_shards(prefix, header)
    wanted = list(entries) if names is None else names
    unknown = [n for n in wanted if n not in entries]
    if unknown:
        raise KeyError(f"no variables {unknown} in {prefix}.index")
    for n in wanted:
        check_whole(prefix, n, entries[n])
    shards: dict[int, Any] = {}
    try:
        return {n: read_tensor(prefix, n, entries[n], num_shards, shards) for n in wanted}
    finally:
        for f in shards.values():
            f.close()


def check_shards(prefix: Path, header: dict[str, int]) -> int:
    if header["endianness"] != 0:
        raise ValueError(
            f"{prefix}.index was written on a big-endian machine; bertlab reads little-endian "
            "checkpoints only"
        )
    num_shards = header["num_shards"]
    if num_shards < 1:
        raise ValueError(f"{prefix}.index: the header gives {num_shards} data shards")
    missing = [
        shard_path(prefix, i, num_shards).name
        for i in range(num_shards)
        if not shard_path(prefix, i, num_shards).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"checkpoint {prefix} has {num_shards} data shard(s); missing: {', '.join(missing)}"
        )
    return num_shards


_PART = re.compile(r"/part_\d+$")


def check_whole(prefix: Path, name: str, entry: TFEntry) -> None:
    if entry.num_slices or _PART.search(name) or name.startswith("\x00"):
        raise ValueError(
            f"variable {name} in {prefix}.index is partitioned (saved in slices); bertlab reads "
            "whole variables only: re-save the checkpoint without partitioning"
        )

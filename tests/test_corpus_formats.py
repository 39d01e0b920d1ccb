"""`bertlab prepare` on corpora as people have them (bertlab.data.readers): gzip and zstd text,
JSON lines with another text field, Parquet files, Arrow datasets saved by `datasets`, folders
and globs; the same shards for any worker count and for a run resumed after an interruption;
bad input refused by name; and memory that does not grow with the corpus."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bertlab
import bertlab.data.corpus as corpus
from bertlab.cli.main import main
from bertlab.data.corpus import PretrainingCorpus, prepare, read_documents
from bertlab.data.readers import blocks, documents, find_sources

pa = pytest.importorskip("pyarrow", reason="Parquet and Arrow need pyarrow: bertlab[parquet]")
pq = pytest.importorskip("pyarrow.parquet", reason="Parquet needs pyarrow: bertlab[parquet]")
zstandard = pytest.importorskip("zstandard", reason=".zst needs zstandard: bertlab[zstd]")

VOCAB = bertlab.bundled_model_dir()
ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the river city north people film music war king army first time year later many known "
    "early house game team world water school church league island station series"
).split()
KW = dict(max_seq_length=40, shard_size=40, block_bytes=2048, progress=False)


def _docs(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of 2 to 6 sentences, paragraphs on newlines."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        paragraphs = []
        for _ in range(rng.randint(1, 3)):
            sentences = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))).capitalize() + "."
                for _ in range(rng.randint(1, 3))
            ]
            paragraphs.append(" ".join(sentences))
        docs.append("\n".join(paragraphs))
    return docs


def _plain(docs: list[str]) -> bytes:
    return "".join(d + "\n\n" for d in docs).encode()


def _zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard_*.npy"))}


def _meta(out: Path) -> dict:
    meta = json.loads((out / "meta.json").read_text())
    meta.pop("inputs")
    return meta


def _parquet(path: Path, texts: list, column: str = "text", row_group_size: int = 50) -> Path:
    table = pa.table({"id": list(range(len(texts))), column: texts})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


# ============================================================================ compressed text
def test_gzip_and_zstd_give_the_shards_of_the_raw_text(tmp_path):
    data = _plain(_docs(120))
    (tmp_path / "c.txt").write_bytes(data)
    (tmp_path / "c.txt.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.txt.zst").write_bytes(_zst(data))
    outs = [prepare(tmp_path / n, VOCAB, tmp_path / n.replace(".", "_"), **KW) for n in
            ("c.txt", "c.txt.gz", "c.txt.zst")]  # fmt: skip
    assert len(_shards(outs[0])) > 8
    assert _shards(outs[0]) == _shards(outs[1]) == _shards(outs[2])
    assert _meta(outs[0]) == _meta(outs[1]) == _meta(outs[2])
    inputs = json.loads((outs[2] / "meta.json").read_text())["inputs"]
    assert inputs[0]["compression"] == "zstd" and inputs[0]["layout"] == "plain"


def test_json_lines_with_another_text_field_compressed(tmp_path):
    docs = _docs(30)
    lines = "".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(docs))
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(_zst(lines.encode()))
    want = [[p for p in d.split("\n")] for d in docs]
    assert list(read_documents(path, field="body")) == want
    got = [doc for b in blocks(find_sources(path, text_field="body")[0], 0, 500)
           for doc in documents(b)]  # fmt: skip
    assert got == want
    with pytest.raises(ValueError, match=r"c\.jsonl\.zst, line 1: expected an object with a "
                                         r"string 'text' field"):  # fmt: skip
        prepare(path, VOCAB, tmp_path / "out", **KW)
    out = prepare(path, VOCAB, tmp_path / "out", text_field="body", **KW)
    assert json.loads((out / "meta.json").read_text())["inputs"][0]["field"] == "body"


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_invalid_utf8_in_a_compressed_file_names_the_file_and_the_line(tmp_path, suffix):
    data = b"Good line.\n\n" * 300 + b"Another good one.\nBad \xff byte.\n"
    path = tmp_path / f"bad.txt{suffix}"
    path.write_bytes(gzip.compress(data) if suffix == ".gz" else _zst(data))
    message = rf"bad\.txt\{suffix}, line 602: invalid UTF-8 at byte 3622 of the decompressed text"
    with pytest.raises(ValueError, match=message):
        list(read_documents(path))
    with pytest.raises(ValueError, match=message):  # in a later block, and in a worker
        prepare(path, VOCAB, tmp_path / "out", **{**KW, "block_bytes": 256})
    assert not (tmp_path / "out" / "meta.json").exists()  # shards before the line, unfinished


# ============================================================================ tables
def test_parquet_an_arrow_dataset_and_its_file_give_the_same_shards(tmp_path):
    datasets = pytest.importorskip("datasets", reason="save_to_disk needs datasets")
    texts = _docs(150, seed=1)
    texts[7], texts[20] = None, ""  # a null and an empty text: documents without text
    _parquet(tmp_path / "c.parquet", texts, "body")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"id": list(range(len(texts))), "body": texts}).save_to_disk(
        saved, max_shard_size="20KB"
    )
    assert len(list(saved.glob("*.arrow"))) > 1  # a dataset of several files
    outs = {
        "parquet": prepare(tmp_path / "c.parquet", VOCAB, tmp_path / "p", text_column="body", **KW),
        "arrow": prepare(saved, VOCAB, tmp_path / "a", text_column="body", **KW),
    }
    assert len(_shards(outs["parquet"])) > 8
    assert _shards(outs["parquet"]) == _shards(outs["arrow"])
    meta = _meta(outs["parquet"])
    assert meta == _meta(outs["arrow"]) and meta["documents_skipped"] == 2
    assert meta["documents"] == 148
    source = json.loads((outs["arrow"] / "meta.json").read_text())["inputs"][0]
    assert source["format"] == "arrow" and source["column"] == "body"
    # every document is read once, in order: the blocks put together are the column
    got = [d for b in blocks(find_sources(saved, "body")[0], 0, 700) for d in documents(b)]
    assert got == [[] if t is None else [p for p in t.split("\n") if p] for t in texts]


def test_globs_and_folders_of_parquet_files(tmp_path):
    texts = _docs(60, seed=2)
    (tmp_path / "parts").mkdir()
    for k in range(3):
        _parquet(tmp_path / "parts" / f"part-{k}.parquet", texts[k * 20 : (k + 1) * 20])
    by_glob = find_sources(str(tmp_path / "parts" / "*.parquet"))
    by_folder = find_sources(tmp_path / "parts")
    assert [s.path for s in by_glob] == [s.path for s in by_folder]
    assert [Path(s.path).name for s in by_glob] == [f"part-{k}.parquet" for k in range(3)]
    with pytest.raises(FileNotFoundError, match=r"no input file matches .*\*\.jsonl"):
        find_sources(str(tmp_path / "parts" / "*.jsonl"))
    with pytest.raises(FileNotFoundError, match="no input file at"):
        prepare(tmp_path / "nowhere.parquet", VOCAB, tmp_path / "out", **KW)


def test_a_table_without_the_text_column_is_refused_naming_its_columns(tmp_path):
    path = _parquet(tmp_path / "c.parquet", _docs(5), "body")
    with pytest.raises(ValueError, match=r"c\.parquet has no column 'text' \(its columns: id, "
                                         r"body\); name the text with --text-column"):  # fmt: skip
        prepare(path, VOCAB, tmp_path / "out", **KW)
    with pytest.raises(ValueError, match=r"column 'id' holds int64, not strings"):
        prepare(path, VOCAB, tmp_path / "out", text_column="id", **KW)
    assert not (tmp_path / "out").exists()
    code = main(["prepare", str(path), "-o", str(tmp_path / "out")])
    assert code == 2 and not (tmp_path / "out").exists()


def test_missing_optional_packages_are_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.txt.zst").write_bytes(_zst(_plain(_docs(3))))
    _parquet(tmp_path / "c.parquet", _docs(3))
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    for name, extra in (("c.txt.zst", "zstd"), ("c.parquet", "parquet")):
        assert main(["prepare", str(tmp_path / name), "-o", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        module = "zstandard" if extra == "zstd" else "pyarrow"
        assert err == (
            f"bertlab prepare: error: {module} is not installed, needed for reading "
            f"{tmp_path / name}: pip install 'bertlab[{extra}]'\n"
        )


# ============================================================================ determinism
def _mixed(tmp_path: Path) -> list:
    datasets = pytest.importorskip("datasets", reason="save_to_disk needs datasets")
    (tmp_path / "a.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in _docs(40, 3)).encode())
    )
    _parquet(tmp_path / "b.parquet", _docs(50, 4))
    datasets.Dataset.from_dict({"text": _docs(40, 5)}).save_to_disk(tmp_path / "c")
    (tmp_path / "d.tokens.zst").write_bytes(
        _zst(b"".join(f" = T{i} = \n\n {d} \n\n".encode() for i, d in enumerate(_docs(30, 6))))
    )
    return [tmp_path / "a.jsonl.gz", tmp_path / "b.parquet", tmp_path / "c", tmp_path / "d*"]


def test_worker_count_does_not_change_the_shards_of_the_new_formats(tmp_path):
    inputs = _mixed(tmp_path)
    one = prepare(inputs, VOCAB, tmp_path / "w1", workers=1, **KW)
    two = prepare(inputs, VOCAB, tmp_path / "w2", workers=2, **KW)
    assert len(_shards(one)) > 12
    assert _shards(one) == _shards(two)
    assert (one / "meta.json").read_text() == (two / "meta.json").read_text()
    layouts = [s.get("layout", s.get("format")) for s in _meta_inputs(one)]
    assert layouts == ["jsonl", "parquet", "arrow", "wikitext"]


def _meta_inputs(out: Path) -> list[dict]:
    return json.loads((out / "meta.json").read_text())["inputs"]


# ============================================================================ resume
def test_an_interrupted_preparation_resumes_to_the_same_bytes(tmp_path, monkeypatch, capsys):
    inputs = _mixed(tmp_path)
    whole = prepare(inputs, "default", tmp_path / "whole", **{**KW, "dupe_factor": 2})
    written = []
    original = corpus._write_shard

    def stopping(out, k, examples):
        if len(written) == 5:
            raise KeyboardInterrupt
        written.append(k)
        return original(out, k, examples)

    monkeypatch.setattr(corpus, "_write_shard", stopping)
    out = tmp_path / "out"
    argv = ["prepare", *map(str, inputs), "-o", str(out), "--max-seq-length", "40"]
    argv += ["--shard-size", "40", "--dupe-factor", "2"]
    monkeypatch.setitem(corpus.prepare.__kwdefaults__, "block_bytes", 2048)  # as KW's
    assert main(argv) == 130
    assert "continue with the same command and --resume" in capsys.readouterr().err
    assert len(_shards(out)) == 5 * 4 and not (out / "meta.json").exists()
    with pytest.raises(FileNotFoundError, match="did not finish"):
        PretrainingCorpus(out)
    # another setting, or no --resume, is refused; the same command with --resume goes on
    assert main([*argv, "--resume", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume: " in err and "seed 12345 then, 1 now" in err
    assert main(argv) == 2
    assert "resume=True to continue it" in capsys.readouterr().err
    monkeypatch.setattr(corpus, "_write_shard", original)
    computed = []
    run_block = corpus._run_block
    monkeypatch.setattr(corpus, "_run_block", lambda job: computed.append(job) or run_block(job))
    assert main([*argv, "--resume"]) == 0
    assert _shards(out) == _shards(whole)
    assert (out / "meta.json").read_text().replace(str(out), "") == (
        whole / "meta.json"
    ).read_text().replace(str(whole), "")
    assert not (out / "progress.json").exists()
    total = sum(1 for s in find_sources(inputs) for _ in blocks(s, 0, 2048))
    assert 0 < len(computed) < total  # the blocks of the first five shards were not redone


# ============================================================================ memory
MEASURE = """
import sys
import numpy as np
import bertlab.data.corpus as corpus

def small(job):  # every block read and handed on; the splitting and tokenizing left out
    n = sum(1 for _ in corpus.documents(job.block))
    ids, lengths = np.full(n * 4, 7, dtype=np.uint16), np.full(n, 4, dtype=np.int64)
    return ids, lengths, np.ones(n, np.int32), np.zeros(n, np.int8), dict.fromkeys(corpus.STATS, 0)

corpus._run_block = small
for k, path in enumerate(sys.argv[2:]):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from the memory in use now
    corpus.prepare(path, sys.argv[1], f"{path}.{k}", shard_size=5000, progress=False)
    print(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
"""


@pytest.mark.parametrize("kind", ["parquet", "jsonl.zst"])
def test_memory_does_not_grow_with_the_corpus(tmp_path, kind):
    """The whole of prepare but the tokenizer, over 5 MB then 60 MB of text in one process
    (after a first 5 MB, which imports and warms the allocators up): the peak resident memory
    grows by far less than the 55 MB more it reads (a reader that held its input, or a queue
    of blocks that grew, would add them). Seen here: 14 MB more for Parquet (pyarrow's
    allocator keeps some of what its decoder took, and levels off: 20 MB more at 200 MB),
    2 MB for zstd JSON lines."""
    rng = np.random.default_rng(0)
    words = np.array(WORDS)
    docs = [" ".join(words[rng.integers(0, len(words), 170)]) + "." for _ in range(1000)]
    paths = []
    for mb in (5, 60):  # documents of about 1 KB
        if kind == "parquet":
            paths.append(_parquet(tmp_path / f"{mb}.parquet", docs * mb, row_group_size=2000))
            continue
        paths.append(tmp_path / f"{mb}.jsonl.zst")
        lines = "".join(json.dumps({"text": t}) + "\n" for t in docs).encode()
        with open(paths[-1], "wb") as f, zstandard.ZstdCompressor().stream_writer(f) as z:
            for _ in range(mb):
                z.write(lines)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(VOCAB), str(paths[0]), *map(str, paths)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, small, large = (int(x) / 1024 for x in done.stdout.split())
    assert large - small < 25, (small, large)

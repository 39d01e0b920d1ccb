"""The memory of ``bertlab prepare`` against the size of its corpus: a generated Parquet corpus of
SIZES megabytes each (default 100 and 1000), prepared by ``bertlab prepare --workers W``, the
resident memory of its processes sampled every 0.2 s (psutil): the peak of the main process, of
the largest worker, and of all of them together. A reader that held its input, or a queue of
blocks that grew, would show in the larger corpus's peak; a flat memory shows the same peaks.

    python benchmarks/harness/prepare_memory.py --out benchmarks/prepare-memory-xeon-amx.json

The corpus: 1,000 documents per megabyte of SIZES, each 170 words drawn from 5,000 whole words
of the bundled vocabulary (about a token a word), in sentences of 17 words and three paragraphs:
1.3 KB of text a document, so SIZE 1000 is 1.3 GB of text (0.9 GB of Parquet). Written with
pyarrow in row groups of 20,000 rows. Needs pyarrow and psutil.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from bertlab.bench.speed import machine
from bertlab.nn import cpu


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> dict:
    """``megabytes`` of documents in a Parquet file, row groups of 20,000 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import bertlab

    rng = np.random.default_rng(seed)
    words = (bertlab.bundled_model_dir() / "vocab.txt").read_text("utf-8").split()
    vocab = np.array([w for w in words if w.isalpha() and w.isascii() and len(w) > 2][:5000])
    rows = megabytes * 1000
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    written = 0
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, 20_000):
            n = min(20_000, rows - start)
            words = vocab[rng.integers(0, len(vocab), (n, 170))]
            texts = []
            for w in words:
                sentences = [" ".join(w[i : i + 17]).capitalize() + "." for i in range(0, 170, 17)]
                texts.append(
                    "\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 10, 4))
                )  # three paragraphs of sentences
            written += sum(len(t) for t in texts)
            writer.write_table(pa.table({"id": np.arange(start, start + n), "text": texts}))
    return {"rows": rows, "text_bytes": written, "file_bytes": path.stat().st_size}


def run_prepare(corpus: Path, out: Path, workers: int) -> dict:
    """``bertlab prepare`` on ``corpus``, its processes' memory sampled until it ends."""
    command = [sys.executable, "-m", "bertlab.cli.main", "prepare", str(corpus), "-o", str(out)]
    command += ["--workers", str(workers), "--text-column", "text", "--overwrite"]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    main = psutil.Process(proc.pid)
    peak_main = peak_worker = peak_total = 0
    while proc.poll() is None:
        try:
            rss_main = main.memory_info().rss
            children = [c.memory_info().rss for c in main.children(recursive=True)]
        except psutil.Error:
            break
        peak_main = max(peak_main, rss_main)
        peak_worker = max([peak_worker, *children])
        peak_total = max(peak_total, rss_main + sum(children))
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"bertlab prepare failed ({proc.returncode}): {stderr[-2000:]}")
    meta = json.loads((out / "meta.json").read_text())
    mib = 1 << 20
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "examples": meta["num_examples"],
        "tokens": meta["num_tokens"],
        "shards": len(meta["shards"]),
        "peak_rss_main_mb": round(peak_main / mib, 1),
        "peak_rss_worker_mb": round(peak_worker / mib, 1),
        "peak_rss_total_mb": round(peak_total / mib, 1),
        "printed": stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="megabytes")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dir", help="where the corpora and shards go (default: a temporary one)")
    parser.add_argument("--out", help="the JSON report (default: standard output)")
    args = parser.parse_args()
    folder = None if args.dir else tempfile.TemporaryDirectory(prefix="prepare-memory-")
    root = Path(args.dir or folder.name)  # a temporary one is removed when main returns
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    for mb in args.sizes:
        corpus = root / f"corpus-{mb}mb.parquet"
        made = make_corpus(corpus, mb)
        result = run_prepare(corpus, root / f"shards-{mb}mb", args.workers)
        runs.append({"corpus_mb": mb, **made, **result})
        print(json.dumps(runs[-1]), file=sys.stderr)
    report = {
        "benchmark": "prepare-memory",
        "machine": machine()
        | {"cpu_flags": sorted(cpu.features().flags), "load_average_at_end": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", "benchmarks/harness/prepare_memory.py", *sys.argv[1:]]),
        "format": "Parquet, one document of about 1 KB a row, row groups of 20,000 rows",
        "workers": args.workers,
        "runs": runs,
    }
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

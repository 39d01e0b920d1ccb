"""One sentence at a time, by its length: bertlab against ONNX Runtime, and how much of bertlab's
time is spent around its kernels. For each length, in alternating rounds in one process
(bertlab.bench.speed.alternate), the bundled model on a sentence of that many tokens through
bench runtimes' runners:

* ``bertlab``: the model (float32, or int8 as bench runtimes quantizes and calibrates it);
* ``onnxruntime``: ONNX Runtime on the file bench runtimes gives it (float32 through its BERT
  optimizer, int8 quantized dynamically);
* ``around``: the same bertlab model with the calls into its AVX2 kernels returning at once
  (their outputs left unwritten): what the forward costs in Python and PyTorch's operators.

Prints the medians in milliseconds and bertlab's throughput relative to ONNX Runtime's. The
tokens are ids drawn from the vocabulary with [CLS] and [SEP] around them (the same ones for
every system). Where bertlab's AVX2 kernels do not run here, ``around`` is left out, saying so.

    python benchmarks/harness/batch1_lengths.py [--precision int8] [--threads 2]
        [--lengths 8,12,16,24,32,48,64] [--rounds 9] [--calls 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from bertlab.bench.runtimes import bertlab_runner, onnxruntime_runner
from bertlab.bench.speed import alternate, machine
from bertlab.files import resolve_model_dir
from bertlab.nn import avx2

KERNELS = ("sgemm", "qgemm", "attention", "embed")  # the C functions avx2.py calls


def sentence(length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One sentence of ``length`` tokens: [CLS], ids from the vocabulary's words, [SEP]."""
    ids = np.random.default_rng(seed).integers(1000, 20000, (1, length))
    ids[0, 0], ids[0, -1] = 101, 102
    return {
        "input_ids": ids.astype(np.int64),
        "attention_mask": np.ones((1, length), np.int64),
        "token_type_ids": np.zeros((1, length), np.int64),
    }


def around(run, batch: dict[str, np.ndarray], calls: int):
    """``run`` on ``batch`` ``calls`` times with the kernels' calls returning at once."""
    lib = avx2._kernels()
    real = {name: getattr(lib, name) for name in KERNELS}

    def go() -> None:
        try:
            for name in KERNELS:
                setattr(lib, name, lambda *args: 0)
            for _ in range(calls):
                run(batch)
        finally:
            for name, fn in real.items():
                setattr(lib, name, fn)

    return go


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="int8", choices=["fp32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", default="8,12,16,24,32,48,64")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=20, help="sentences a timed run (20)")
    args = p.parse_args(argv)
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if any(not 2 <= n <= 512 for n in lengths):
        p.error(f"--lengths must each be 2 to 512 tokens, got {args.lengths!r}")
    if args.threads < 1 or args.rounds < 1 or args.calls < 1:
        p.error(
            "--threads, --rounds and --calls must be at least 1, got "
            f"{args.threads}, {args.rounds}, {args.calls}"
        )
    torch.set_num_threads(args.threads)
    model_dir = resolve_model_dir("default")
    folder = tempfile.TemporaryDirectory(prefix="batch1-lengths-")  # removed when main returns
    runners = {
        "bertlab": bertlab_runner(model_dir, args.precision),
        "onnxruntime": onnxruntime_runner(
            model_dir, Path(folder.name), args.precision, args.threads
        ),
    }
    why = avx2.load()
    m = machine()
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}, {args.precision}")
    if why is not None:
        print(f"bertlab's AVX2 kernels do not run here ({why}): no 'around' column")
    print("tokens  bertlab ms  onnxruntime ms  around ms  bertlab / onnxruntime throughput")
    for n in lengths:
        batch = sentence(n)
        runs = {
            name: (lambda run=run, batch=batch: [run(batch) for _ in range(args.calls)])
            for name, run in runners.items()
        }
        if why is None:
            runs["around"] = around(runners["bertlab"], batch, args.calls)
        times = alternate(runs, args.rounds)
        ms = {name: statistics.median(t) / args.calls * 1e3 for name, t in times.items()}
        idle = f"{ms['around']:9.2f}" if "around" in ms else "        -"
        ratio = ms["onnxruntime"] / ms["bertlab"]
        print(f"{n:6d}  {ms['bertlab']:10.2f}  {ms['onnxruntime']:14.2f}  {idle}  {ratio:.2f}x")


if __name__ == "__main__":
    main()

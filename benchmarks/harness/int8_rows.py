"""bertlab int8 on the onednn-s8 kernel with its choice by row count (``precision.S8_FEW_ROWS``:
torch._int_mm on the plain int8 weight for products of at most that many rows, oneDNN's int8
linear kernel on the prepacked weight above it) against each kernel taking every product, and
ONNX Runtime int8 beside them: the whole model, on the workloads and runners of ``bertlab
bench runtimes`` (real tokens per second, bundled model calibrated as there, sentence
embeddings), alternating in one process (``bertlab.bench.speed.alternate``).

    bertlab-rows      the policy: _int_mm up to S8_FEW_ROWS rows, the prepacked kernel above
    bertlab-packed    every product on the prepacked kernel
    bertlab-int-mm    every product on torch._int_mm (bertlab before the prepacked kernel)
    onnxruntime       ONNX Runtime int8 (dynamic quantization), as in bench runtimes

The three bertlab rows compute the same sums (tests/test_precision.py checks the two kernels
bit for bit). Prints the memory the prepacked copies take beside the int8 weights, then each
system's median tokens/s and its median ratio to ONNX Runtime over
the rounds, per workload, and the two other bertlab rows' times over bertlab-int-mm's, round
by round. The record of a run is kept in benchmarks/int8-rows-<cpu class>.txt.

    python benchmarks/harness/int8_rows.py [--data ../shared/data] [--workloads batch-1,sorted]
        [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import paired
import torch

from bertlab.bench import runtimes
from bertlab.nn import cpu, precision

ALL = 1 << 62  # a row count no product reaches


def with_rows(rows: int, run):
    """``run`` with ``precision.S8_FEW_ROWS`` set to ``rows`` while it runs."""

    def timed() -> None:
        chosen = precision.S8_FEW_ROWS
        precision.S8_FEW_ROWS = rows
        try:
            run()
        finally:
            precision.S8_FEW_ROWS = chosen

    return timed


def main(argv: list[str] | None = None) -> None:
    p, args, workloads = paired.arguments(__doc__, argv)
    policy = cpu.current()
    kernel = policy.int8_kernel
    if not policy.int8_prepacked:
        p.error(f"onednn-s8's prepacked kernel runs only where the CPU has AMX; this one is of "
                f"class {policy.cpu_class}, int8 kernel {kernel}")  # fmt: skip
    model, tokenizer, texts, source = paired.setup(args)
    with tempfile.TemporaryDirectory(prefix="int8-rows-") as folder:
        work = Path(folder)
        bertlab = runtimes.make_runner("bertlab-int8", model, work, args.threads)
        with torch.inference_mode():  # a batch past few rows: every weight is prepacked
            bertlab(runtimes.batches(tokenizer, texts[:64], "sorted")[0])
        made = [entry[4] for entry in precision._PACKED.values() if entry[4].packed is not None]
        prepacked = sum(w.packed[0].numel() * w.packed[0].element_size() for w in made) / 2**20
        int8 = sum(w.int8.numel() for w in made) / 2**20
        ort = runtimes.make_runner("onnxruntime-int8", model, work, args.threads)
        paired.header(args, f"int8 kernel {kernel}, S8_FEW_ROWS {precision.S8_FEW_ROWS}", source)
        print(f"prepacked copies held beside the int8 weights: {prepacked:.1f} MiB, for "
              f"{int8:.1f} MiB of int8 weights in {len(made)} products")  # fmt: skip

        def runs(batches: list[dict]) -> dict:
            return {
                "bertlab-rows": paired.each(bertlab, batches),
                "bertlab-packed": with_rows(0, paired.each(bertlab, batches)),
                "bertlab-int-mm": with_rows(ALL, paired.each(bertlab, batches)),
                "onnxruntime": paired.each(ort, batches),
            }

        against = [(name, "bertlab-int-mm") for name in ("bertlab-rows", "bertlab-packed")]
        paired.compare(tokenizer, texts, workloads, args.rounds, runs, "onnxruntime", against)


if __name__ == "__main__":
    main()

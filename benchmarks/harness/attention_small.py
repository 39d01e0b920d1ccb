"""The attention of packed batches alone, float32: bertlab's AVX2 kernel (attention_avx2.c, where
the CPU policy runs sgemm-avx2) against PyTorch's kernel, both called through the packed kernel
(``bertlab.nn.attention.packed_attention``) as the model calls it, on the bundled model's shape
(12 heads of 32) and random queries, keys and values: views of one (N, 3 x 384) product output.
Each batch is timed in alternating rounds in one process (``bertlab.bench.speed.alternate``), so
the machine's drift falls on both alike:

    pytorch   the policy with float32_kernel "onednn": PyTorch's scaled_dot_product_attention,
              one call for a batch without padding, else per window of 16 rows (Packing.windows)
    avx2      the policy with float32_kernel "sgemm-avx2" and every length allowed
              (avx2.ATTENTION_TOKENS lifted for the run): one call of bertlab's kernel

Prints, per batch (sequences x tokens), each way's median microseconds a call and the median
ratio of avx2's time to pytorch's over the rounds. Where it was run, avx2.ATTENTION_TOKENS says
up to which length the kernel wins. The record of a run is kept in
benchmarks/attention-<cpu class>.txt.

    python benchmarks/harness/attention_small.py [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import paired
import torch

from bertlab.bench.speed import alternate, machine
from bertlab.nn import attention, avx2, cpu
from bertlab.nn.packing import Packing

HEADS, HEAD = 12, 32  # the bundled model's attention
BATCHES = [  # (label, lengths), fixed before any result
    ("1 x 9", [9]),
    ("1 x 21", [21]),
    ("1 x 48", [48]),
    ("1 x 64", [64]),
    ("1 x 80", [80]),
    ("1 x 96", [96]),
    ("1 x 128", [128]),
    ("1 x 256", [256]),
    ("32 x 21", [21] * 32),
    ("32 x 40-45", [40, 41, 41, 42, 43, 44, 45, 45] * 4),
    ("32 x 60-64", [60] * 16 + [64] * 16),
    ("32 x 90", [90] * 32),
    ("32 x 128", [128] * 32),
]


def inputs(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Packing]:
    n, width, longest = sum(lengths), HEADS * HEAD, max(lengths)
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(n, 3 * width, generator=g)
    q, k, v = (t.view(n, HEADS, HEAD) for t in qkv.split(width, -1))
    mask = torch.arange(longest)[None] < torch.tensor(lengths)[:, None]
    return q, k, v, Packing.from_mask(mask, len(lengths), longest, torch.device("cpu"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    if args.threads < 1 or args.rounds < 1:
        p.error(f"--threads {args.threads} and --rounds {args.rounds} must be at least 1")
    if (why := avx2.load()) is not None:
        sys.exit(f"bertlab's AVX2 attention cannot run here: {why}")
    torch.set_num_threads(args.threads)
    here = cpu.current()
    ways = {
        "pytorch": dataclasses.replace(here, float32_kernel="onednn"),
        "avx2": dataclasses.replace(here, float32_kernel="sgemm-avx2"),
    }
    m = machine()
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}, class {here.cpu_class}; "
          f"{args.rounds} alternating rounds; {HEADS} heads of {HEAD}")  # fmt: skip
    limit, avx2.ATTENTION_TOKENS = avx2.ATTENTION_TOKENS, max(max(n) for _, n in BATCHES)
    try:
        for label, lengths in BATCHES:
            q, k, v, packing = inputs(lengths)
            calls = max(3, 20_000 // sum(lengths))

            def run(q=q, k=k, v=v, packing=packing, calls=calls) -> None:
                for _ in range(calls):
                    attention.packed_attention(q, k, v, packing, 0.0)

            times = alternate({name: paired.under(way, run) for name, way in ways.items()},
                              args.rounds)  # fmt: skip
            us = {name: statistics.median(t) / calls * 1e6 for name, t in times.items()}
            ratio = statistics.median(
                a / b for a, b in zip(times["avx2"], times["pytorch"], strict=True)
            )
            print(f"  {label:>11}: pytorch {us['pytorch']:8.0f} us   avx2 {us['avx2']:8.0f} us   "
                  f"avx2/pytorch {ratio:.2f}")  # fmt: skip
    finally:
        avx2.ATTENTION_TOKENS = limit


if __name__ == "__main__":
    main()

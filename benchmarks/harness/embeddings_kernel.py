"""The embeddings on bertlab's AVX2 kernel (products.embeddings, embeddings_avx2.c) against their
own modules (three lookups, two sums, the layer norm): the bundled model, float32 and int8, on
bench runtimes' batch-1 workload (its 64 sentences one at a time), the two routes swapped in
alternating rounds in one process (bertlab.bench.speed.alternate). Prints tokens a second for
each route and the median and quartiles of the per-round ratio of their times.

    python benchmarks/harness/embeddings_kernel.py [--threads 2] [--rounds 120]

Where the policy does not run bertlab's AVX2 kernels (products.embeddings says None), it says so
and stops: both routes would be the modules.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import batches, calibration_batches, runtime_texts
from bertlab.bench.speed import alternate, machine
from bertlab.nn import products
from bertlab.nn.precision import quantize_int8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=120)
    args = p.parse_args()
    if args.threads < 1 or args.rounds < 1:
        p.error(f"--threads and --rounds must be at least 1, got {args.threads}, {args.rounds}")
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained("default")
    model = BertModel.from_pretrained("default", add_pooling_layer=False).eval()
    texts, origin = runtime_texts()
    inputs = [
        {k: torch.from_numpy(v) for k, v in b.items()} for b in batches(tok, texts, "batch-1")
    ]
    tokens = sum(int(b["attention_mask"].sum()) for b in inputs)
    kernel = products.embeddings
    with torch.inference_mode():
        if kernel(model.embeddings, torch.tensor([[101, 102]]), None, torch.arange(2)) is None:
            raise SystemExit("the embeddings do not run on bertlab's AVX2 kernel here")
    print(f"{machine()['cpu']}, {args.threads} threads, torch {torch.__version__}; {origin}, "
          f"64 sentences one at a time ({tokens} tokens), {args.rounds} rounds")  # fmt: skip
    int8 = quantize_int8(model, calibrate=calibration_batches(tok))
    for name, net in (("float32", model), ("int8", int8)):

        def run(on: bool, net=net) -> None:
            products.embeddings = kernel if on else (lambda *_: None)
            for batch in inputs:
                net(**batch)

        try:
            with torch.inference_mode():
                runs = {"modules": lambda: run(False), "kernel": lambda: run(True)}
                spent = alternate(runs, repeats=args.rounds, warmup=2)
        finally:
            products.embeddings = kernel
        ratio = np.array(spent["kernel"]) / np.array(spent["modules"])
        q1, median, q3 = np.percentile(ratio, [25, 50, 75])
        rate = {side: tokens / float(np.median(t)) for side, t in spent.items()}
        print(f"{name:7s} modules {rate['modules']:,.0f} tokens/s, kernel {rate['kernel']:,.0f}; "
              f"time kernel/modules median {median:.3f} (quartiles {q1:.3f}-{q3:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()

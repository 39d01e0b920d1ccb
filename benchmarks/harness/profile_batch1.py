"""Where the time goes in one short sentence (batch 1) through the bundled model: the median
latency over 200 calls and torch.profiler's operator table over 50. Prints both; the before and
after of the batch-1 work are kept in benchmarks/ (profile-batch1-*.txt).

    python benchmarks/harness/profile_batch1.py [--threads 2] [--dtype float32|bfloat16|int8]
        [--compiled] [--batch 1]

int8 is the model quantize_int8 makes, calibrated as ``bertlab bench runtimes`` calibrates it.
``--compiled`` times bertlab.nn.compiled.Compiled(model) instead. Its program's kernels are
called from C++, out of the profiler's sight, so the operator table is taken on the same graph
built by torch.compile without the C++ wrapper (the same kernels, called from Python, each
generated one named in the table; its per-call overhead is not Compiled's).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile

from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import calibration_batches
from bertlab.bench.speed import machine
from bertlab.nn.compiled import Compiled
from bertlab.nn.packing import aligned_export
from bertlab.nn.precision import quantize_int8

SENTENCE = (
    "The European Commission said on Thursday it disagreed with German advice to consumers "
    "to shun British lamb."
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--compiled", action="store_true", help="time Compiled(model)")
    p.add_argument("--batch", type=int, default=1, help="the sentence this many times (1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained("default")
    dtype = "float32" if args.dtype == "int8" else args.dtype
    model = BertModel.from_pretrained("default", dtype=dtype, add_pooling_layer=False)
    if args.dtype == "int8":
        model = quantize_int8(model, calibrate=calibration_batches(tok))
    if args.batch < 1:
        p.error(f"--batch must be at least 1, got {args.batch}")
    batch = tok([SENTENCE] * args.batch, return_tensors="pt")
    run = Compiled(model) if args.compiled else model
    with torch.inference_mode():
        for _ in range(20):
            run(**batch)
        times = []
        for _ in range(200):
            start = time.perf_counter()
            run(**batch)
            times.append(time.perf_counter() - start)
        if args.compiled:  # the same kernels called from Python through torch.compile, to see them
            options = {**run._options, "cpp_wrapper": False, "cpp.enable_kernel_profile": True}
            with inductor_config.patch(options), aligned_export():
                run = torch.compile(model, dynamic=True)
                for _ in range(20):
                    run(**batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                run(**batch)
    m = machine()
    how = ", compiled" if args.compiled else ""
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}, {args.dtype}{how}")
    median = statistics.median(times) * 1e3
    print(f"{args.batch} x {batch['input_ids'].shape[1]} tokens: median {median:.2f} ms")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()

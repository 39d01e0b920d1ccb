"""Where the compiled program beats the model, by batch size: the bundled model (float32, or int8
as ``bertlab bench runtimes`` quantizes it: ``--dtype``) and its
``Compiled`` program (made to run every size, whatever the CPU's policy), on batches of random
in-vocabulary ids without padding, rows x length from one short sentence to a few long ones,
timed in alternating rounds in one process (``bertlab.bench.speed.alternate``). The policy's
``cpu.COMPILED_TOKENS`` (the most positions a class's program takes, where it wins only on
short inputs) is set from this table: the largest size whose ratio stays clearly below 1.

The model's products run on the policy's kernels (``BERTLAB_FLOAT32_KERNEL`` and
``BERTLAB_INT8_KERNEL`` choose others). The program calls the same ones where they are
bertlab's AVX2 kernels (as operators: bertlab.nn.avx2.ops), else inductor's choice (oneDNN's).

Prints, for each size, both medians and the median over the rounds of the program's time over
the model's. The record of a run is kept in benchmarks/compiled-sizes-<cpu class>.txt.

    python benchmarks/harness/compiled_sizes.py [--sizes 1x8,1x16,...] [--threads 2]
        [--rounds 7] [--dtype float32|int8]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import calibration_batches
from bertlab.bench.speed import alternate, machine
from bertlab.nn import cpu
from bertlab.nn.compiled import Compiled
from bertlab.nn.precision import quantize_int8

SIZES = "1x8,1x16,1x21,1x32,1x48,1x64,2x32,1x96,3x32,1x128,4x32,8x32,32x24"
CALL_SECONDS = 0.4  # each round of a size runs about this long: more calls for smaller sizes


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        rows, _, length = part.strip().partition("x")
        if not (rows.isdigit() and length.isdigit()) or int(rows) < 1 or int(length) < 2:
            raise ValueError(f"a size is ROWSxLENGTH, at least 1x2, got {part!r}")
        sizes.append((int(rows), int(length)))
    return sizes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=SIZES, help=f"ROWSxLENGTH, comma-separated ({SIZES})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", default="float32", choices=["float32", "int8"])
    args = p.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        p.error(str(e))
    if args.threads < 1 or args.rounds < 1:
        p.error(f"--threads and --rounds must be at least 1, got {args.threads}, {args.rounds}")
    if (why := Compiled.available()) is not None:
        p.error(why)
    torch.set_num_threads(args.threads)
    model = BertModel.from_pretrained("default", add_pooling_layer=False).eval()
    if args.dtype == "int8":  # calibrated as ``bertlab bench runtimes`` calibrates it
        model = quantize_int8(
            model, calibrate=calibration_batches(BertTokenizer.from_pretrained("default"))
        )
    limit = model.config.max_position_embeddings
    if too_long := [f"{r}x{n}" for r, n in sizes if n > limit]:
        p.error(f"--sizes {', '.join(too_long)}: longer than the model's {limit} positions")
    policy = cpu.current()
    # the program at every size, whatever this class's policy says (its cap is printed below)
    everywhere = {"compiled": frozenset({args.dtype}), "not_compiled": {}, "compiled_tokens": {}}
    cpu._CURRENT[:] = [replace(policy, **everywhere)]
    try:
        fast = Compiled(model)
    finally:
        cpu._CURRENT[:] = [policy]
    m = machine()
    kernel = policy.float32_kernel if args.dtype == "float32" else policy.int8_kernel
    print(f"{m['cpu']}, class {policy.cpu_class}, {args.threads} threads, torch {m['torch']}: "
          f"the bundled model, {args.dtype} (its products on {kernel}), "
          f"{args.rounds} alternating rounds a size; the policy's cap here: "
          f"{policy.compiled_tokens.get(args.dtype, 'none')}")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows, length in sizes:
            ids = torch.randint(1000, 20000, (rows, length), generator=g)
            ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            fast(**inputs)  # (the program is built on the first call, and specialises nothing)
            once = alternate({"model": lambda: model(**inputs)}, 3)["model"]  # noqa: B023
            calls = max(3, int(CALL_SECONDS / statistics.median(once)))

            def timed(run, inputs=inputs, calls=calls):
                return lambda: [run(**inputs) for _ in range(calls)]

            times = alternate({"model": timed(model), "compiled": timed(fast)}, args.rounds)
            pairs = zip(times["compiled"], times["model"], strict=True)
            ratio = statistics.median(c / e for c, e in pairs)
            eager, program = (statistics.median(times[k]) / calls * 1e3 for k in times)
            print(f"  {rows:>2} x {length:<3} ({rows * length:>4} positions)  model {eager:7.2f} "
                  f"ms  compiled {program:7.2f} ms  {ratio:.3f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

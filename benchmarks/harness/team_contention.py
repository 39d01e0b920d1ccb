"""What bertlab keeps of its quiet throughput beside busy processes, with and without the two
ways it keeps its threads from waiting for one that is off its core (bertlab/nn/team.c):

* ``team``: a call of bertlab's kernels takes fewer of PyTorch's threads for a while after one
  of them kept the others waiting at a barrier (``avx2.adaptive_team``);
* ``mkl``: PyTorch's activation after a kernel (the pooler's tanh) runs with MKL's own threads
  at 1 (``avx2.vector_math_alone``), so MKL opens no parallel region for 384 values.

Each setting runs in the same process, in alternating rounds, on the bundled model in float32
and in int8 (calibrated as ``bertlab bench runtimes`` calibrates it): the batch-1 workload of
``bertlab bench runtimes`` (its first 64 sentences, one at a time; CoNLL-2003 news with
``--data``) and its sorted batches of 32, quiet, then beside ``--busy`` processes spinning in pure
Python. Prints real tokens/s (medians of the rounds) and the share kept, with the CPU.

    python benchmarks/harness/team_contention.py [--data ../shared/data] [--rounds 5]
        [--threads 2] [--busy 2] [--workloads batch-1,sorted] [--torch-first]

``--torch-first`` runs it with libgomp's own wait (its threads spin about 20 times longer after
each parallel region), as a program that imports torch before bertlab has it (bertlab.openmp).

Only where bertlab's own kernels run (the avx2, avx512-bf16 classes of AMD CPUs): elsewhere it
says so and stops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

# isort: off
import bertlab  # noqa: F401  (before torch: bertlab.openmp sets the OpenMP wait)
import torch

# isort: on
from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import batches, calibration_batches, neighbours, runtime_texts
from bertlab.bench.speed import machine
from bertlab.nn import avx2, cpu
from bertlab.nn.precision import quantize_int8
from bertlab.openmp import LIBGOMP_SPIN, WAIT

SETTINGS = {  # name: (team, mkl)
    "neither (plain OpenMP)": (False, False),
    "team only": (True, False),
    "team and mkl (bertlab's default)": (True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--workloads", default="batch-1,sorted")
    ap.add_argument(
        "--torch-first",
        action="store_true",
        help="libgomp's own wait: as where torch was imported before bertlab (rerun in a child)",
    )
    args = ap.parse_args()
    if args.torch_first:  # (libgomp read its wait when torch loaded: a fresh process)
        argv = [a for a in sys.argv[1:] if a != "--torch-first"]
        env = {**os.environ, "GOMP_SPINCOUNT": str(LIBGOMP_SPIN)}
        print(f"libgomp's own wait, as where torch is imported first ({LIBGOMP_SPIN} pauses)")
        sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env).returncode)
    print(f"OpenMP wait: {WAIT}")
    torch.set_num_threads(args.threads)
    policy = cpu.current()
    if avx2.load() is not None or policy.float32_kernel not in cpu.OWN_FLOAT32:
        print(f"bertlab's own kernels do not run here (class {policy.cpu_class}): nothing to do")
        return
    tok = BertTokenizer.from_pretrained("default")
    texts, source = runtime_texts(args.data)
    base = BertModel.from_pretrained("default").eval()
    models = {
        "float32": base,
        "int8": quantize_int8(
            BertModel.from_pretrained("default").eval(), calibration_batches(tok)
        ),
    }
    alone = avx2.vector_math_alone  # (products.py looks it up on the module at each call)
    workloads = {
        w: [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches(tok, texts, w)]
        for w in args.workloads.split(",")
    }

    def run(model, work) -> float:
        tokens = 0
        start = time.perf_counter()
        with torch.inference_mode():
            for b in work:
                model(**b)
                tokens += int(b["attention_mask"].sum())
        return tokens / (time.perf_counter() - start)

    def setting(name: str) -> None:
        team, mkl = SETTINGS[name]
        avx2.adaptive_team(team)
        avx2.vector_math_alone = alone if mkl else (lambda y, op, *args: op(y, *args))

    for model in models.values():  # warm: the kernels built, the weights packed
        for work in workloads.values():
            run(model, work[:4])
    results: dict[tuple, list[float]] = {}
    for busy in (0, args.busy):
        with neighbours(busy):
            time.sleep(0.5)
            for _ in range(args.rounds):
                for w, work in workloads.items():
                    for precision, model in models.items():
                        for name in SETTINGS:
                            setting(name)
                            key = (busy, w, precision, name)
                            results.setdefault(key, []).append(run(model, work))
    setting("team and mkl (bertlab's default)")
    print(f"{machine()['cpu']}; {args.threads} threads, {args.rounds} alternating rounds; {source}")
    print(
        f"class {policy.cpu_class}, float32 kernel {policy.float32_kernel}, int8 kernel "
        f"{policy.int8_kernel}; workloads: "
        + ", ".join(f"{w} ({len(b)} batches)" for w, b in workloads.items())
    )
    print(f"| workload | precision | setting | quiet tokens/s | beside {args.busy} busy | kept |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for w in workloads:
        for precision in models:
            for name in SETTINGS:
                quiet = statistics.median(results[(0, w, precision, name)])
                loaded = statistics.median(results[(args.busy, w, precision, name)])
                print(
                    f"| {w} | {precision} | {name} | {quiet:,.0f} | {loaded:,.0f} | "
                    f"{loaded / quiet:.0%} |"
                )


if __name__ == "__main__":
    main()

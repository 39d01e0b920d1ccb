"""How long PyTorch's idle OpenMP threads spin after a parallel region, under each wait
setting (bertlab.openmp): each setting in a fresh process (libgomp reads it when torch loads),
``--regions`` times a region on both threads followed by a 100 ms sleep; the CPU time the
process spends in those gaps, over the regions' own CPU time run back to back, per gap.

    python benchmarks/harness/openmp_spin.py [--regions 50] [--threads 2]

Settings: libgomp's default (``LIBGOMP_SPIN`` pauses), bertlab's (``GOMP_SPINCOUNT`` = ``SPIN``) and
``OMP_WAIT_POLICY=PASSIVE``. The gap's CPU time above PASSIVE's is the spinning.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = """
import time, torch
torch.set_num_threads({threads})
x = torch.randn(4_000_000)
for _ in range(5):
    x.add_(1)
c0 = time.process_time()
for _ in range({regions}):
    x.add_(1)
    time.sleep(0.1)
gaps = time.process_time() - c0
c0 = time.process_time()
for _ in range({regions}):
    x.add_(1)
print((gaps - (time.process_time() - c0)) / {regions} * 1e3)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from bertlab.openmp import LIBGOMP_SPIN, SPIN

    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    settings = {
        "libgomp's default": {"GOMP_SPINCOUNT": str(LIBGOMP_SPIN)},
        f"bertlab's (GOMP_SPINCOUNT={SPIN})": {"GOMP_SPINCOUNT": str(SPIN)},
        "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    }
    code = CHILD.format(threads=args.threads, regions=args.regions)
    for name, extra in settings.items():
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=base | extra,
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"{name:38s} {float(out.stdout):6.2f} ms of CPU time per gap")


if __name__ == "__main__":
    main()

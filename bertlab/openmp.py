"""How PyTorch's OpenMP threads wait between two parallel regions, chosen before torch loads.

PyTorch's CPU operators run on OpenMP threads (GNU libgomp in PyTorch's Linux wheels). When a
region ends, the threads that have no work wait for the next one: they spin, then sleep.
libgomp reads how long they spin once, when it is loaded (``import torch``), from
``OMP_WAIT_POLICY`` (``ACTIVE``: spin for ever, ``PASSIVE``: sleep at once) or else
``GOMP_SPINCOUNT``: ``LIBGOMP_SPIN`` turns of the CPU's pause instruction by default, about 5 ms
of a core after every region on the 2-core Xeon of docs/performance.md.

Milliseconds of spinning are harmless on cores that nothing else wants. On cores shared with
other busy processes (a server's tokenizer and HTTP threads, a neighbour's job) a spinning thread
holds a core that the thread it waits for needs, and the model's throughput collapses (beside
two busy processes on those 2 cores, bertlab's float32 model kept 2% of its quiet throughput at
batch 1). Sleeping at once (``PASSIVE``) costs every region a wake-up instead: the server's own
batch-1 load ran 0.78x.

bertlab sets ``GOMP_SPINCOUNT`` to ``SPIN`` before it imports torch: about 0.6 ms there (the
pause instruction's length differs between CPUs, and the spin with it). The threads still spin
through the gaps inside one forward pass (microseconds) and sleep in the long ones between
requests. What it keeps beside busy processes and costs when quiet, against libgomp's default,
``PASSIVE`` and ONNX Runtime: docs/performance.md ("The bounded spin"),
benchmarks/contention-spin-*.json and benchmarks/harness/openmp_spin.py.

It is a default, never an override: nothing is set when the environment already has
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (``GOMP_SPINCOUNT=300000`` restores libgomp's own), or
when torch was imported before bertlab, since libgomp has then read its settings already.
``WAIT`` says which of these holds. Processes started from this one inherit the setting.
Other OpenMP runtimes (LLVM's, Intel's) ignore the variable.

The spin bounds what a waiting thread takes from a busy neighbour; what a thread that is off
its core costs the others (they wait for it at the end of each parallel loop) is bounded by
bertlab's own kernels themselves, which run a sentence's calls on fewer threads while that
happens (bertlab/nn/team.c).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

SPIN = 20_000  # GOMP_SPINCOUNT: the pause instructions a thread spins before it sleeps
LIBGOMP_SPIN = 300_000  # libgomp's own, where neither variable is set


def choose_wait(environ: MutableMapping[str, str], torch_loaded: bool) -> str:
    """Set ``GOMP_SPINCOUNT`` in ``environ`` unless the environment or an earlier ``import
    torch`` decided already; returns what is in effect, in words."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in environ:
            return f"{name}={environ[name]} (the environment's)"
    if torch_loaded:
        return (
            f"libgomp's default (torch was imported before bertlab; it spins {LIBGOMP_SPIN:,} "
            "pauses)"
        )
    environ["GOMP_SPINCOUNT"] = str(SPIN)
    return f"GOMP_SPINCOUNT={SPIN} (bertlab's default)"


WAIT = choose_wait(os.environ, "torch" in sys.modules)

"""How PyTorch's OpenMP threads wait between two parallel regions, chosen before torch loads.

PyTorch's CPU operators run on OpenMP threads (GNU libgomp in PyTorch's Linux wheels). When a
region ends, the threads that have no work wait for the next one: they spin, then sleep.
libgomp reads how long they spin once, when it is loaded (``import torch``), from
``OMP_WAIT_POLICY`` (``ACTIVE``: spin for ever, ``PASSIVE``: sleep at once) or else
``GOMP_SPINCOUNT``, whose default is 300,000 turns of the CPU's pause instruction. On the 2-core
Xeon of docs/performance.md that is about 5 ms of a core after every region (a region, then a
sleep: 6.4 ms of CPU time per gap with the default, 1.4 ms with ``PASSIVE``, 2.0 ms with
``SPIN``: benchmarks/harness/openmp_spin.py).

Milliseconds of spinning are harmless on cores that nothing else wants. On cores shared with
other busy processes (a server's tokenizer and HTTP threads, a neighbour's job) a spinning thread
holds a core that the thread it waits for needs, and the model's throughput collapses: beside
two busy processes on those 2 cores, bertlab's float32 model kept 9% of its quiet throughput on
sorted batches and 2% at batch 1 with libgomp's default. Sleeping at once (``PASSIVE``) kept
39-48%, but costs every region a wake-up: the server's own batch-1 load ran 0.78x.

bertlab sets ``GOMP_SPINCOUNT`` to ``SPIN`` (20,000 turns: about 0.6 ms there; the pause
instruction's length differs between CPUs, and the spin with it) before it imports torch. The
threads still spin through the gaps inside one forward pass (microseconds) and sleep in the long
ones between requests. Beside two busy processes it kept 43% (sorted) and 38% (batch 1), against
35% and 32% for ONNX Runtime in the same run; quiet, its throughput was within the run-to-run
spread of the default's (docs/performance.md, "Contention"; benchmarks/contention-*.json).

It is a default, never an override: nothing is set when the environment already has
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (``GOMP_SPINCOUNT=300000`` restores libgomp's own), or
when torch was imported before bertlab, since libgomp has then read its settings already.
``WAIT`` says which of these holds. Processes started from this one inherit the setting.
Other OpenMP runtimes (LLVM's, Intel's) ignore the variable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

SPIN = 20_000  # GOMP_SPINCOUNT: the pause instructions a thread spins before it sleeps


def choose_wait(environ: MutableMapping[str, str], torch_loaded: bool) -> str:
    """Set ``GOMP_SPINCOUNT`` in ``environ`` unless the environment or an earlier ``import
    torch`` decided already; returns what is in effect, in words."""
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if name in environ:
            return f"{name}={environ[name]} (the environment's)"
    if torch_loaded:
        return "libgomp's default (torch was imported before bertlab; it spins 300,000 pauses)"
    environ["GOMP_SPINCOUNT"] = str(SPIN)
    return f"GOMP_SPINCOUNT={SPIN} (bertlab's default)"


WAIT = choose_wait(os.environ, "torch" in sys.modules)

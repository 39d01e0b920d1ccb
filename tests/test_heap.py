"""bertlab.heap: with freed large blocks kept, a batch loop that makes and frees tensors of a
few MiB stops faulting in fresh pages on every pass; where the C library is not glibc, the
functions say so and change nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bertlab.heap import _glibc

# Each pass makes three 12 MiB tensors, writes them and frees them, as a layer's temporaries
# are made and freed by a large batch. glibc's default for such blocks moves as the process runs
# (its mmap threshold starts at 128 KiB and rises to the size of a large block once one is freed,
# and whether the heap's top is then handed back depends on what else lies there, which differs
# from one process to the next), so the loop first pins the threshold at its starting value:
# every block is mapped fresh and unmapped when freed, the faults keep_freed_memory() removes.
LOOP = r"""
import resource, sys, torch
from bertlab.heap import _M_MMAP_THRESHOLD, _glibc, keep_freed_memory, release_freed_memory

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        ts = [torch.empty(3 * 1024 * 1024).fill_(1.0) for _ in range(3)]
        del ts
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

assert _glibc().mallopt(_M_MMAP_THRESHOLD, 128 * 1024) == 1  # glibc's starting value, pinned
faults()  # the first pass warms everything up
default = faults()
assert keep_freed_memory() is None
faults()
kept = faults()
assert release_freed_memory() is True
print(default, kept)
"""


@pytest.mark.skipif(_glibc() is None, reason="the C library here is not glibc (no mallopt)")
def test_kept_freed_blocks_stop_the_page_faults_of_a_batch_loop():
    pages = 20 * 3 * 3 * 1024 * 1024 * 4 // 4096  # what 20 passes write, in 4 KiB pages
    out = subprocess.run(
        [sys.executable, "-c", LOOP], capture_output=True, text=True, timeout=120, check=True
    )
    default, kept = map(int, out.stdout.split())
    assert default > pages // 2, f"blocks mapped fresh on every pass should fault: {default}"
    assert kept < pages // 20, f"with the blocks kept, the loop still faulted: {kept}"


def test_without_glibc_the_functions_say_so_and_do_nothing(monkeypatch):
    from bertlab import heap

    monkeypatch.setattr(heap, "_glibc", lambda: None)
    assert heap.keep_freed_memory() == "the C library is not glibc (no mallopt)"
    assert heap.release_freed_memory() is False

"""How the C heap treats the large tensors of big batches, for processes that run them.

glibc's malloc serves a block above its mmap threshold (128 KiB at first, rising up to 32 MiB
as such blocks are freed) with pages fresh from the system and unmaps them when it is freed,
and it gives back the top of its heap whenever more than its trim threshold lies free there. A
forward pass over a batch of thousands of tokens makes and frees several tensors of a few MiB
in every layer, so their pages come and go on every batch, and the kernel faults in and zeroes
each one again. ``keep_freed_memory()`` sets the mmap threshold to glibc's largest (32 MiB) and
the trim threshold to 1 GiB: freed blocks stay in the heap and the next batch reuses them.

On the bundled model, 2-core Sapphire Rapids Xeon, 2 threads, batches of 256 SST-2 sentences
(about 3,500 tokens) run in the main thread took 71 instead of 84-89 ms in bfloat16 and 265
instead of 280 ms in float32; the embed pipeline on 3,072 of them in float32, 2-4% less time.
Run in a thread of their own, whose heap glibc trims less eagerly, the bfloat16 batches took
69 instead of 73 ms. Batches of 32 news sentences: within noise.

``bertlab serve`` calls it at start (``serve.run``). Under its serving benchmark's batch-256
requests in bfloat16 (``bertlab bench serve --systems bertlab --workloads batch256 --dtype
bfloat16 --seconds 20``), a system-wide profile of 12 s put 11.5% of both cores' time in page
faults with glibc's defaults, nearly all of it in the products writing their outputs onto fresh
pages, and 0.7% with freed blocks kept. Three runs of each, alternating, in tokens/s (p99 ms):
defaults 32,015 (575), 31,383 (576), 34,354 (513); freed blocks kept 32,896 (529), 36,703 (498),
34,712 (523); kept and the garbage collector's view frozen after loading (``gc.freeze``, which
the server also does) 34,687 (472), 35,389 (457), 35,324 (442). In float32, two runs each:
11,140 (1,630) and 11,236 (1,418) against 11,589 (1,283) and 11,913 (1,342) with both. Batch-1
requests in bfloat16: 9,431 (85) and 10,134 (69) against 10,188 (63) and 9,925 (63). An
earlier measurement, before the server's other changes, had found the batch-256 difference
within the run-to-run spread.

The price is memory held between batches: the process keeps what its largest batch needed
instead of returning it. ``release_freed_memory()`` (glibc's ``malloc_trim``) hands free pages
back when the caller chooses; ``bertlab serve``'s runners do so at most once a second.

``bertlab predict --file`` calls ``keep_freed_memory()`` at start; a program of one's own can
too (or set ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:
glibc.malloc.trim_threshold=1073741824`` before Python starts). Both are process-wide; where the
C library is not glibc (musl, macOS) they do nothing and say why.
"""

from __future__ import annotations

import ctypes
import functools

MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64 bits)
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> str | None:
    """Keep freed large blocks in the heap for the next batch (module docstring). None when
    done, else why not."""
    libc = _glibc()
    if libc is None:
        return "the C library is not glibc (no mallopt)"
    for parameter, value in (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    ):
        if libc.mallopt(parameter, value) != 1:
            return f"glibc refused mallopt({parameter}, {value})"
    return None


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the system (glibc's malloc_trim(0)). False where the
    C library has none."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True

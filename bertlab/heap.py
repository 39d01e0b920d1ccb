"""How the C heap treats the large tensors of big batches, for processes that run them.

glibc's malloc serves a block above its mmap threshold (128 KiB at first, rising up to 32 MiB
as such blocks are freed) with pages fresh from the system and unmaps them when it is freed,
and it gives back the top of its heap whenever more than its trim threshold lies free there. A
forward pass over a batch of thousands of tokens makes and frees several tensors of a few MiB
in every layer, so their pages come and go on every batch, and the kernel faults in and zeroes
each one again. ``keep_freed_memory()`` sets the mmap threshold to glibc's largest (32 MiB) and
the trim threshold to 1 GiB: freed blocks stay in the heap and the next batch reuses them.

Batches of a few hundred sentences (thousands of tokens) then run faster, most of all in
bfloat16, where the products are fast and the page faults a large share of what is left;
batches of a few dozen sentences do not change beyond noise.

``bertlab serve`` calls it at start (``serve.run``), and freezes the garbage collector's view
of what it loaded (``gc.freeze``). Under its serving benchmark's batch-256 requests in bfloat16,
page faults took a tenth of the cores' time with glibc's defaults, nearly all of it in the
products writing their outputs onto fresh pages, and almost none with freed blocks kept; the
server's throughput and p99 latency improved, batch-1 requests stayed within noise. (The
timings: docs/performance.md, "The choices in the code".)

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

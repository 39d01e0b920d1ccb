"""bertlab's own float32 kernels for AVX2 CPUs: the product of a linear layer on a weight packed
once, and the attention of short sequences.

    pack(weight)                              (N, K) -> (ceil(N/16), K, 16) panels
    product(x, panels, bias, n, add=None, gelu=False)
                                              (..., K) -> (..., N): act(x W^T + b) (+ add)
    attention(q, k, v, starts, longest)       (N, A, D) each -> (N, A, D): packed sequences
    load()                                    build and load the kernels once: None, or why not
    why_not()                                 why they cannot run in this process (None: they can)

Where ``cpu.current().float32_kernel`` is ``"sgemm-avx2"`` (the avx2 class of AMD CPUs, EPYC Zen
2 and 3, where oneDNN's float32 products and PyTorch's attention kernel ran slower than these:
docs/performance.md), products.py sends every float32 product to ``product`` and attention.py's
packed kernel sends inference batches whose sequences are at most ATTENTION_TOKENS long to
``attention``. The kernels are C, beside this file, each read in a sitting:

* sgemm_avx2.c: one loop of AVX2 fused multiply-adds over 6 rows x 16 columns. It sums each
  output's terms in order, then adds the bias, so its results differ from oneDNN's and PyTorch's
  by rounding only (about 1e-6 relative). The feed-forward network's GELU (with erf) is applied
  to each block while it is in registers, by a polynomial (avx2_math.h: erfc to 1.2e-7
  relative), which differs from PyTorch's GELU by rounding only;
* attention_avx2.c: softmax(q k^T / sqrt(D)) v for each (sequence, head) on its own, over that
  sequence's tokens only: no padding, no masks, no gathered windows. Its e^x is a polynomial
  (about 1 ulp), so its results differ from PyTorch's by rounding only.

Neither depends on the thread count: each output is computed by one thread, in one order.

They are compiled once with the system's C compiler (``CC``, else ``cc``) into one library in
``$XDG_CACHE_HOME/bertlab/kernels`` (else ``~/.cache/bertlab/kernels``; a fresh private
temporary folder if that cannot be written), named by a hash of the sources and flags, written
to a temporary name and renamed, so processes that build it at once never load half a file. It
links PyTorch's OpenMP runtime (GNU libgomp, which torch has loaded), so its threads are
PyTorch's threads: ``torch.set_num_threads`` sets both, and their spin (bertlab.openmp) is one.
It is loaded with ctypes: no Python extension, no PyTorch headers, a build of about a second.

Where it cannot run (no compiler, a failed build, an OpenMP runtime other than libgomp, a CPU
without AVX2 and FMA), ``load`` returns why, products.py warns once and keeps oneDNN's
products, and attention stays on PyTorch's kernel; a kernel forced by
``BERTLAB_FLOAT32_KERNEL=sgemm-avx2`` raises instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from bertlab.nn import cpu

PANEL = 16  # output columns a panel holds (two AVX2 registers of 8 floats)
SOURCES = tuple(Path(__file__).with_name(name) for name in ("sgemm_avx2.c", "attention_avx2.c"))
HEADER = Path(__file__).with_name("avx2_math.h")  # e^x and GELU, included by both
ATTENTION_TOKENS = 64  # the longest sequence ``attention`` is given. Against PyTorch's kernel
# (benchmarks/harness/attention_small.py, 12 heads of 32, 2 threads): up to 64 tokens it took
# 0.46-0.64x the time on one sequence and 0.30-0.50x on 32; from 80 to 128 tokens one run gave
# 0.78-0.96x and another 1.02-1.08x; at 256, 1.30x (benchmarks/attention-epyc-avx2.txt)
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared")

_LOADED: list[object] = []  # [the library's functions] or [str: why not], once a process


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 weight -> (ceil(N/16), K, 16): panel p holds, input by input, the weights
    of output columns 16p..16p+15, zeros past N (the layout sgemm_avx2.c reads)."""
    n, k = weight.shape
    padded = -(-n // PANEL) * PANEL
    w = weight.detach().to(torch.float32)
    if padded != n:
        w = torch.cat([w, w.new_zeros(padded - n, k)])
    return w.view(padded // PANEL, PANEL, k).transpose(1, 2).contiguous()


def product(
    x: torch.Tensor,
    panels: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    add: torch.Tensor | None = None,
    gelu: bool = False,
) -> torch.Tensor:
    """(..., K) float32 -> (..., n): ``act(x W^T + bias) (+ add)``, W packed by ``pack`` into
    ``panels``; ``bias`` (n) or None, ``add`` (..., n) or None; act GELU with erf where
    ``gelu``, else none. The first call loads the kernels (RuntimeError, saying why, where they
    cannot run)."""
    k = x.shape[-1]
    if (
        x.dtype != torch.float32
        or panels.shape != (-(-n // PANEL), k, PANEL)
        or panels.dtype != torch.float32
        or not panels.is_contiguous()
        or (bias is not None and (bias.shape != (n,) or not bias.is_contiguous()))
        or (add is not None and (add.shape != (*x.shape[:-1], n) or not add.is_contiguous()))
    ):
        raise ValueError(
            f"avx2.product: input {tuple(x.shape)} {x.dtype} does not fit panels "
            f"{tuple(panels.shape)}{'' if panels.is_contiguous() else ' (not contiguous)'} for {n} "
            f"outputs (bias "
            f"{None if bias is None else tuple(bias.shape)}, add "
            f"{None if add is None else tuple(add.shape)})"
        )
    x = x.contiguous()
    rows = x.numel() // k if k else 0
    out = x.new_empty(*x.shape[:-1], n)
    if rows and n:
        _kernels().sgemm(
            x.data_ptr(),
            rows,
            k,
            panels.data_ptr(),
            n,
            None if bias is None else bias.data_ptr(),
            bool(gelu),
            None if add is None else add.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
    return out


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, longest: int
) -> torch.Tensor:
    """q, k, v (N, A, D) float32, rows of packed sequences (views of one product's output are
    fine: each row's heads contiguous) -> (N, A, D): softmax(q k^T / sqrt(D)) v of each sequence
    over its own tokens, sequence b being rows ``starts[b]:starts[b + 1]`` (``starts`` int32,
    (B + 1,), from 0 to N); ``longest`` the longest sequence's length. D a multiple of 8; other
    shapes, and starts that do not fit, are refused (ValueError) before anything is read. The
    first call loads the kernels (RuntimeError, saying why, where they cannot run)."""
    n, heads, d = q.shape
    if (
        any(t.dtype != torch.float32 or t.shape != q.shape for t in (k, v))
        or q.dtype != torch.float32
        or d % 8
        or any(t.stride()[1:] != (d, 1) for t in (q, k, v))
        or starts.dtype != torch.int32
        or starts.dim() != 1
        or starts.numel() < 2
        or not starts.is_contiguous()
    ):
        raise ValueError(
            f"avx2.attention: q {tuple(q.shape)} {q.dtype} strides {q.stride()}, k "
            f"{tuple(k.shape)} {k.dtype} strides {k.stride()}, v {tuple(v.shape)} {v.dtype} "
            f"strides {v.stride()}, starts {tuple(starts.shape)} {starts.dtype}: float32 "
            "(N, A, D) each, D a multiple of 8, each row's heads contiguous, starts int32 (B + 1,)"
        )
    functions = _kernels()
    out = q.new_empty(n, heads, d)
    if n and heads and d:
        width = -(-longest // 32) * 32
        threads = torch.get_num_threads()
        scratch = q.new_empty(threads * (d + 2) * width)
        status = functions.attention(
            q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            out.data_ptr(), heads * d, starts.data_ptr(), starts.numel() - 1, n, longest,
            heads, d, d**-0.5, scratch.data_ptr(), threads,
        )  # fmt: skip
        if status:
            raise ValueError(
                f"avx2.attention: starts {starts.tolist()} must rise from 0 to the {n} rows, "
                f"no sequence longer than longest={longest}"
            )
    return out


def _kernels() -> Any:
    """The loaded library's functions (``.sgemm``, ``.attention``); RuntimeError where they
    cannot run here."""
    loaded = _LOADED[0] if _LOADED else load() or _LOADED[0]
    if isinstance(loaded, str):
        raise RuntimeError(f"bertlab's AVX2 kernels cannot run here: {loaded}")
    return loaded


def why_not() -> str | None:
    """Why the kernel cannot run in this process, before any build: None where it can try."""
    f = cpu.features()
    if not f.x86 or not {"avx2", "fma3"} <= f.flags:
        missing = "an x86 CPU" if not f.x86 else "AVX2 and FMA"
        return f"the sgemm-avx2 kernel needs {missing}; this CPU is {cpu.classify(f)}" + (
            f" within {', '.join(f.limits)}" if f.limits else ""
        )
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return "this PyTorch does not run its threads on OpenMP, which the kernel shares"
    if not _gomp_paths():
        return "this PyTorch has not loaded GNU libgomp, the OpenMP runtime the kernel links"
    if _compiler() is None:
        return "no C compiler was found (set CC, or install one such as gcc)"
    return None


def load() -> str | None:
    """Build (once a machine) and load (once a process) the kernels: None when they are ready,
    else why they cannot run here."""
    if not _LOADED:
        why = why_not()
        _LOADED.append(why if why is not None else _build_and_load())
    return _LOADED[0] if isinstance(_LOADED[0], str) else None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC") or "cc")


def _gomp_paths() -> set[str]:
    """The files of the GNU OpenMP runtimes mapped into this process."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]}


def _cache_dirs() -> Iterator[Path]:
    """The user's cache folder, then (only if that cannot be written) a fresh private folder:
    never a shared one, where another user could leave a library under the expected name."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    yield Path(base).expanduser() / "bertlab" / "kernels"
    try:
        yield Path(tempfile.mkdtemp(prefix="bertlab-kernels-"))
    except OSError:
        return


def _build_and_load() -> object:
    """The loaded library's functions, or why they could not be built or loaded (a string)."""
    compiler = _compiler()
    sources = b"".join(source.read_bytes() for source in (*SOURCES, HEADER))
    digest = hashlib.sha256(sources + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    built, why = None, "no folder to build it in could be written"
    for folder in _cache_dirs():
        target = folder / f"bertlab-avx2-{digest}.so"
        if target.exists():
            built = target
            break
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=target.name, suffix=".tmp")
            os.close(fd)
        except OSError as e:
            why = f"{folder} cannot be written ({e})"
            continue
        result = subprocess.run(
            [compiler, *FLAGS, *map(str, SOURCES), "-o", tmp], capture_output=True, text=True
        )
        if result.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            names = ", ".join(source.name for source in SOURCES)
            return f"{compiler} could not build {names}: " + " / ".join(tail)
        os.replace(tmp, target)
        built = target
        break
    if built is None:
        return why
    before = _gomp_paths()
    try:
        lib = ctypes.CDLL(str(built))
    except OSError as e:
        return f"{built} could not be loaded ({e})"
    if _gomp_paths() != before:  # a second OpenMP runtime: two pools of threads on the cores
        return (
            f"{built.name} loaded a second libgomp ({', '.join(sorted(_gomp_paths() - before))}) "
            "beside PyTorch's; the kernel would run its own threads"
        )
    i64, ptr, i32, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    sgemm, attend = lib.bertlab_sgemm, lib.bertlab_attention
    sgemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, i32, ptr, ptr, i32]
    attend.argtypes = [ptr, i64, ptr, i64, ptr, i64, ptr, i64, ptr, i64, i64, i64, i64, i64,
                       f32, ptr, i32]  # fmt: skip
    sgemm.restype, attend.restype = None, ctypes.c_int
    return SimpleNamespace(sgemm=sgemm, attention=attend)

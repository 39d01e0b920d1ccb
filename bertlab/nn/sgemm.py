"""bertlab's own float32 product for AVX2 CPUs: ``x W^T + b (+ add)`` on a weight packed once.

    pack(weight)                              (N, K) -> (ceil(N/16), K, 16) panels
    product(x, panels, bias, n, add=None)     (..., K) -> (..., N)
    load()                                    build and load the kernel once: None, or why not
    why_not()                                 why it cannot run in this process (None: it can)

products.py calls these for float32 products where ``cpu.current().float32_kernel`` is
``"sgemm-avx2"``: on the avx2 class of AMD CPUs (EPYC Zen 2 and 3), where oneDNN's float32
products ran slower than this kernel (docs/performance.md). The kernel is sgemm_avx2.c, beside
this file: one loop of AVX2 fused multiply-adds over 6 rows x 16 columns, read in a sitting. It
sums each output's terms in order, then adds the bias, so its results differ from oneDNN's and
PyTorch's by rounding only (about 1e-6 relative).

It is C, compiled once with the system's C compiler (``CC``, else ``cc``) into
``$XDG_CACHE_HOME/bertlab/kernels`` (else ``~/.cache/bertlab/kernels``; a fresh private
temporary folder if that cannot be written), named by a hash of its source and flags, written to
a temporary name and renamed, so processes that build it at once never load half a file. It
links PyTorch's OpenMP runtime (GNU libgomp, which torch has loaded), so its threads are
PyTorch's threads: ``torch.set_num_threads`` sets both, and their spin (bertlab.openmp) is one.
It is loaded with ctypes: no Python extension, no PyTorch headers, a build of about a second.

Where it cannot run (no compiler, a failed build, an OpenMP runtime other than libgomp, a CPU
without AVX2 and FMA), ``load`` returns why, products.py warns once and keeps oneDNN's
products; a kernel forced by ``BERTLAB_FLOAT32_KERNEL=sgemm-avx2`` raises instead.
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

import torch

from bertlab.nn import cpu

PANEL = 16  # output columns a panel holds (two AVX2 registers of 8 floats)
SOURCE = Path(__file__).with_name("sgemm_avx2.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-shared")

_LOADED: list[object] = []  # [ctypes function] or [str: why not], once a process


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
) -> torch.Tensor:
    """(..., K) float32 -> (..., n): ``x W^T + bias (+ add)``, W packed by ``pack`` into
    ``panels``; ``bias`` (n) or None, ``add`` (..., n) or None. The first call loads the kernel
    (RuntimeError, saying why, where it cannot run)."""
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
            f"sgemm.product: input {tuple(x.shape)} {x.dtype} does not fit panels "
            f"{tuple(panels.shape)}{'' if panels.is_contiguous() else ' (not contiguous)'} for {n} "
            f"outputs (bias "
            f"{None if bias is None else tuple(bias.shape)}, add "
            f"{None if add is None else tuple(add.shape)})"
        )
    kernel = _LOADED[0] if _LOADED else load() or _LOADED[0]
    if isinstance(kernel, str):
        raise RuntimeError(f"the sgemm-avx2 kernel cannot run here: {kernel}")
    x = x.contiguous()
    rows = x.numel() // k if k else 0
    out = x.new_empty(*x.shape[:-1], n)
    if rows and n:
        kernel(
            x.data_ptr(),
            rows,
            k,
            panels.data_ptr(),
            n,
            None if bias is None else bias.data_ptr(),
            None if add is None else add.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
    return out


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
    """Build (once a machine) and load (once a process) the kernel: None when it is ready,
    else why it cannot run here."""
    if not _LOADED:
        why = why_not()
        _LOADED.append(why if why is not None else _build_and_load())
    return _LOADED[0] if isinstance(_LOADED[0], str) else None


def reset() -> None:
    """Load again on the next ``load()`` (tests)."""
    _LOADED.clear()


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
    """The loaded kernel function, or why it could not be built or loaded (a string)."""
    compiler = _compiler()
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    built, why = None, "no folder to build it in could be written"
    for folder in _cache_dirs():
        target = folder / f"bertlab-sgemm-avx2-{digest}.so"
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
            [compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True
        )
        if result.returncode != 0:
            Path(tmp).unlink(missing_ok=True)
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            return f"{compiler} could not build {SOURCE.name}: " + " / ".join(tail)
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
    fn = lib.bertlab_sgemm
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ptr, ctypes.c_int]
    fn.restype = None
    return fn

"""bertlab's own kernels for AVX2 CPUs: the product of a linear layer on a weight packed once,
in float32 and in int8, the attention of short sequences, and the embeddings.

    pack(weight)                              (N, K) -> (ceil(N/16), K, 16) panels
    product(x, panels, bias, n, add=None, gelu=False, norm=None)
                                              (..., K) -> (..., N): norm(act(x W^T + b) (+ add))
    pack_int8(weight, scale, bias, levels, unsmooth=None)
                                              an int8 layer (N, K) -> Int8Panels
    qproduct(x, layer, add=None, gelu=False, norm=None)
                                              (..., K) -> (..., N): the int8 product, the same
    attention(q, k, v, starts, longest)       (N, A, D) each -> (N, A, D): packed sequences
    embed(ids, types, positions, word, type_table, position_table, norm)
                                              (n,) indices -> (n, H): the tables' rows, normalized
    load()                                    build and load the kernels once: None, or why not
    why_not()                                 why they cannot run in this process (None: they can)

Where ``cpu.current().float32_kernel`` is ``"sgemm-avx2"`` (the avx2 class of AMD CPUs, EPYC Zen
2 and 3) or ``"sgemm-avx512"`` (AMD's Zen 4, whose AVX-512 runs on 256-bit halves; there
oneDNN's float32 products and PyTorch's attention kernel ran slower than these:
docs/performance.md), products.py sends
every float32 product to ``product`` and attention.py's packed kernel sends inference batches
whose sequences are at most ATTENTION_TOKENS long to ``attention``, and the embeddings of
inference batches go to ``embed`` (products.embeddings). Where precision.py's int8
kernel is ``"u8-avx2"`` (chosen on AMD's AVX2 CPUs: cpu.py) or ``"u8-vnni"`` (AMD's Zen 4), an
int8 model's products run on ``qproduct``. The kernels are C, beside this file, each read in a
sitting:

* sgemm_avx2.c: one loop of AVX2 fused multiply-adds over 6 rows x 16 columns, or under
  sgemm-avx512 (``wide``) of AVX-512F ones over up to 10 rows, a row's 16 columns in one
  register: half the instructions, the same sums. It sums each output's terms in order, then
  adds the bias, so its results differ from oneDNN's and PyTorch's by rounding only (about 1e-6
  relative), and its two forms give the same bits. The feed-forward network's GELU (with erf)
  is applied to each block while it is in registers, by a rational fit of erf (avx2_math.h: within
  1.5e-6 of the float64 GELU, as PyTorch's own float32 GELU is within 1.2e-6 on AVX-512);
* int8_avx2.c: precision.py's int8 product (per-token activations rounded to 7 bits, inside the
  call; per-channel int8 weights; sums exact in int32) with VPMADDUBSW and VPMADDWD over 6 rows
  x 16 columns, its float32 arithmetic that of precision.py to the bit; GELU and the residual
  applied inside it as in sgemm_avx2.c. On a layer packed for VNNI (u8-vnni) the same loop sums
  with VPDPBUSD over up to 10 rows of 512-bit registers (AVX512-VNNI, and AVX512-VL on a last
  partial panel, in functions compiled for them alone, called only where the CPU reports
  both), and the activations keep 8 bits;
* attention_avx2.c: softmax(q k^T / sqrt(D)) v for each (sequence, head) on its own, over that
  sequence's tokens only: no padding, no masks, no gathered windows. Its e^x is a polynomial
  (about 1 ulp), so its results differ from PyTorch's by rounding only;
* embeddings_avx2.c: each token's rows of the word, type and position tables summed, in
  BertEmbeddings' order (the same bits), and the sum normalized by avx2_math.h's layer norm.

None depends on the thread count: each output is computed by one thread, in one order.

How many threads a call takes is team.c's: all of ``torch.get_num_threads()``, or, for a call
of one sentence's rows (at most 64) made a while after calls where a thread waited long at a
barrier for one that was off its core (beside busy processes), only those that were on theirs
(``adaptive_team`` turns that off). PyTorch's activation after a product (a pooler's tanh) runs
with MKL's own threads at 1 (``vector_math_alone``): MKL would open a parallel region for a few
hundred values.

They are compiled once with the system's C compiler (``CC``, else ``cc``) into one library in
``$XDG_CACHE_HOME/bertlab/kernels`` (else ``~/.cache/bertlab/kernels``; a fresh private
temporary folder if that cannot be written), named by a hash of the sources and flags, written
to a temporary name and renamed, so processes that build it at once never load half a file. It
links PyTorch's OpenMP runtime (GNU libgomp, which torch has loaded), so its threads are
PyTorch's threads: ``torch.set_num_threads`` sets both, and their spin (bertlab.openmp) is one.
It is loaded with ctypes: no Python extension, no PyTorch headers, a build of about a second.

``ops()`` builds the same C functions a second time behind a small C++ library
(avx2_ops.cpp, with PyTorch's headers: about 17 s, once a machine, cached beside the kernels)
as the PyTorch operators ``torch.ops.bertlab.sgemm`` and ``torch.ops.bertlab.qgemm``: a
program that bertlab compiles ahead of time (nn/compiled.py) calls those from C++, with no
Python between them. Traced for such a program (packing.own_program), ``product`` and
``qproduct`` write themselves as those operators.

Where it cannot run (no compiler, a failed build, an OpenMP runtime other than libgomp, a CPU
without AVX2 and FMA), ``load`` returns why, products.py warns once and keeps oneDNN's
products, attention stays on PyTorch's kernel, and int8 takes the policy's fallback kernel
(fbgemm's), saying so once; a kernel forced by ``BERTLAB_FLOAT32_KERNEL=sgemm-avx2`` (or
``sgemm-avx512``) or ``BERTLAB_INT8_KERNEL=u8-avx2`` raises instead.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch

from bertlab.nn import cpu
from bertlab.nn.packing import own_program, tracing

PANEL = 16  # output columns a panel holds (two AVX2 registers of 8 floats)
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("sgemm_avx2.c", "attention_avx2.c", "int8_avx2.c", "embeddings_avx2.c", "team.c")
)
HEADERS = tuple(  # e^x, GELU and the layer norm, included by all; how many threads a call takes
    Path(__file__).with_name(name) for name in ("avx2_math.h", "team.h")
)
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


class Norm(NamedTuple):
    """A layer norm applied to each output row once it is whole: (y - mean) / sqrt(var + eps) *
    weight + bias over the row's n values (F.layer_norm's, up to rounding), n a multiple of 8."""

    weight: torch.Tensor  # (n,) float32
    bias: torch.Tensor  # (n,) float32
    eps: float


def _norm(norm: Norm | None, n: int, who: str) -> tuple[int | None, int | None, float]:
    """The kernel's arguments for ``norm`` over rows of n (ValueError, naming them, where they
    do not fit)."""
    if norm is None:
        return None, None, 0.0
    w, b = norm.weight, norm.bias
    if (
        n % 8
        or w.dtype is not torch.float32
        or b.dtype is not torch.float32
        or w.shape != (n,)
        or b.shape != (n,)
        or not w.is_contiguous()
        or not b.is_contiguous()
    ):
        raise ValueError(
            f"avx2.{who}: a layer norm of weight {tuple(w.shape)} {w.dtype} and bias "
            f"{tuple(b.shape)} {b.dtype} over rows of {n}: float32 (n,) each, contiguous, n a "
            "multiple of 8"
        )
    return w.data_ptr(), b.data_ptr(), float(norm.eps)


def product(
    x: torch.Tensor,
    panels: torch.Tensor,
    bias: torch.Tensor | None,
    n: int,
    add: torch.Tensor | None = None,
    gelu: bool = False,
    norm: Norm | None = None,
    wide: bool | None = None,
) -> torch.Tensor:
    """(..., K) float32 -> (..., n): ``norm(act(x W^T + bias) (+ add))``, W packed by ``pack``
    into ``panels``; ``bias`` (n) or None, ``add`` (..., n) or None; act GELU with erf where
    ``gelu``, else none; ``norm`` a layer norm of each row (``Norm``) or None. ``wide``: the
    AVX-512F blocks (sgemm-avx512; the same bits), else the AVX2 ones; None: as the policy's
    float32 kernel says. The first call loads the kernels (RuntimeError, saying why, where they
    cannot run; also where wide is asked of a CPU without AVX-512F)."""
    if wide is None:
        wide = cpu.current().float32_kernel == "sgemm-avx512"
    k = x.shape[-1]
    if (
        x.dtype is not torch.float32
        or panels.shape != (-(-n // PANEL), k, PANEL)
        or panels.dtype is not torch.float32
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
    if tracing():  # (a program bertlab compiles: nn/compiled.py)
        w, b, eps = (None, None, 0.0) if norm is None else norm
        return torch.ops.bertlab.sgemm(
            x, panels, bias, n, add, bool(gelu), w, b, float(eps), bool(wide)
        )
    lnw, lnb, eps = _norm(norm, n, "product")
    x = x.contiguous()
    rows = x.numel() // k if k else math.prod(x.shape[:-1])
    out = x.new_empty(*x.shape[:-1], n)
    if rows and n:
        status = _kernels().sgemm(
            x.data_ptr(), rows, k, panels.data_ptr(), n,
            None if bias is None else bias.data_ptr(), bool(gelu),
            None if add is None else add.data_ptr(), lnw, lnb, eps, out.data_ptr(), bool(wide),
            torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise RuntimeError(
                "avx2.product: the wide blocks (sgemm-avx512) need AVX-512F, which this CPU "
                f"({cpu.classify(cpu.features())}) does not report"
            )
    return out


QGROUP = 4  # inputs an int8 panel holds per step (VPMADDUBSW then VPMADDWD, or VPDPBUSD, sum 4)
INT8_LEVELS = 63  # the most levels ``qproduct`` rounds activations to (7 bits: int8_avx2.c)
VNNI_LEVELS = 127  # the same with VNNI (``vnni``: 8 bits, summed by VPDPBUSD)


class Int8Panels(NamedTuple):
    """An int8 linear layer (N outputs, K inputs) as int8_avx2.c reads it, made (and checked)
    by ``pack_int8``: what stays the same from call to call."""

    panels: torch.Tensor  # (ceil(N/16), ceil(K/4), 16, 4) int8
    corr: torch.Tensor  # (N,) int32: (levels + 1) times each weight row's sum
    scale: torch.Tensor  # (N,) float32: the weights' scales s_w
    bias: torch.Tensor | None  # (N,) float32
    unsmooth: torch.Tensor | None  # (K,) float32: x is multiplied by it before it is rounded
    levels: int  # activations are rounded to -levels..levels
    inputs: int  # K
    vnni: bool = False  # summed with VPDPBUSD (AVX512-VNNI): levels up to 127


def pack_int8(
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    levels: int,
    unsmooth: torch.Tensor | None = None,
    vnni: bool = False,
) -> Int8Panels:
    """(N, K) int8 weight, its (N,) scales and bias -> the layer as ``qproduct`` reads it: panel
    p holds, for each group of 4 inputs, the 4 weights of each of columns 16p..16p+15 (zeros
    past N and K: the layout int8_avx2.c reads), with the corrections, (levels + 1) times each
    row's sum (the share of the zero point the activations are shifted by), for activations
    rounded to -levels..levels (1..63; 1..127 where ``vnni``: summed with VPDPBUSD, which
    needs AVX512-VNNI and AVX512-VL) after they are multiplied by ``unsmooth`` (K,) if given.
    ValueError, naming them, for shapes, dtypes or levels that do not fit."""
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    most = VNNI_LEVELS if vnni else INT8_LEVELS
    if (
        weight.dim() != 2
        or weight.dtype != torch.int8
        or not 1 <= levels <= most
        or any(
            t is not None and (t.dtype != torch.float32 or t.shape != (size,))
            for t, size in ((scale, n), (bias, n), (unsmooth, k))
        )
    ):
        raise ValueError(
            f"avx2.pack_int8: weight {tuple(weight.shape)} {weight.dtype}, scale "
            f"{tuple(scale.shape)} {scale.dtype}, bias "
            f"{None if bias is None else (tuple(bias.shape), bias.dtype)}, unsmooth "
            f"{None if unsmooth is None else (tuple(unsmooth.shape), unsmooth.dtype)}, levels "
            f"{levels}: an (N, K) int8 weight, float32 scale and bias (N,), unsmooth (K,), "
            f"levels 1..{most}{' (VNNI)' if vnni else ''}"
        )
    w = weight.detach()
    rows, cols = -(-n // PANEL) * PANEL, -(-k // QGROUP) * QGROUP
    if (rows, cols) != (n, k):
        w = torch.nn.functional.pad(w, (0, cols - k, 0, rows - n))
    panels = w.view(rows // PANEL, PANEL, cols // QGROUP, QGROUP).transpose(1, 2).contiguous()
    corr = weight.sum(1, dtype=torch.int32).mul_(levels + 1)
    own = [None if t is None else t.detach().contiguous() for t in (scale, bias, unsmooth)]
    return Int8Panels(panels, corr, own[0], own[1], own[2], levels, k, bool(vnni))


def qproduct(
    x: torch.Tensor,
    layer: Int8Panels,
    add: torch.Tensor | None = None,
    gelu: bool = False,
    norm: Norm | None = None,
) -> torch.Tensor:
    """(..., K) float32 -> (..., N): ``norm(act(s_x (q(x) W^T) s_w + bias) (+ add))``, each row
    of ``x * unsmooth`` rounded to -levels..levels by its own scale s_x (precision.py's int8
    product), for a layer packed by ``pack_int8``; ``add`` (..., N) or None; act GELU with erf
    where ``gelu``; ``norm`` a layer norm of each row (``Norm``) or None. The first call loads
    the kernels (RuntimeError, saying why, where they cannot run)."""
    n, k = layer.corr.shape[0], layer.inputs
    if (
        x.dtype is not torch.float32
        or x.shape[-1] != k
        or (add is not None and (add.shape != (*x.shape[:-1], n) or not add.is_contiguous()))
    ):
        raise ValueError(
            f"avx2.qproduct: input {tuple(x.shape)} {x.dtype} (add "
            f"{None if add is None else tuple(add.shape)}) does not fit a layer of "
            f"{layer.inputs} float32 inputs and {n} outputs (add (..., {n}), contiguous)"
        )
    if tracing():  # (a program bertlab compiles: nn/compiled.py)
        w, b, eps = (None, None, 0.0) if norm is None else norm
        return torch.ops.bertlab.qgemm(x, layer.panels, layer.corr, layer.scale, layer.bias,
                                       layer.unsmooth, layer.levels, layer.vnni, layer.inputs,
                                       add, bool(gelu), w, b, float(eps))  # fmt: skip
    lnw, lnb, eps = _norm(norm, n, "qproduct")
    x = x.contiguous()
    rows = x.numel() // k if k else math.prod(x.shape[:-1])
    out = x.new_empty(*x.shape[:-1], n)
    if rows and n:
        width = -(-k // QGROUP) * QGROUP
        # the rounded rows, then their scales (at a multiple of 4 bytes)
        scratch = _scratch(rows * (width + 4))
        address = scratch.data_ptr()
        bias, unsmooth = layer.bias, layer.unsmooth
        status = _kernels().qgemm(
            x.data_ptr(), rows, k, None if unsmooth is None else unsmooth.data_ptr(),
            layer.levels, layer.vnni, layer.panels.data_ptr(), layer.corr.data_ptr(),
            layer.scale.data_ptr(), n, None if bias is None else bias.data_ptr(), bool(gelu),
            None if add is None else add.data_ptr(), lnw, lnb, eps, out.data_ptr(), address,
            address + rows * width, torch.get_num_threads(),
        )  # fmt: skip
        if status == -2:
            raise RuntimeError(
                "avx2.qproduct: the layer is packed for VNNI, which this CPU does not have "
                "(AVX512-VNNI and AVX512-VL)"
            )
        if status:  # (pack_int8 checked them: a layer changed since)
            most = VNNI_LEVELS if layer.vnni else INT8_LEVELS
            raise ValueError(f"avx2.qproduct: levels {layer.levels} outside 1..{most}")
    return out


def quantize(
    x: torch.Tensor, unsmooth: torch.Tensor | None, levels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, K) float32 -> int8 (R, K) and each row's scale (R, 1): t = x * unsmooth (where
    given), s = max(max|t| / levels, the smallest normal float), round(t / s), in one pass:
    precision.py's rounding for oneDNN's signed int8 product, bit for bit. Other shapes, dtypes
    and levels outside 1..127 are refused (ValueError); the first call loads the kernels
    (RuntimeError, saying why, where they cannot run)."""
    if (
        x.dtype != torch.float32
        or x.dim() != 2
        or not 1 <= levels <= 127
        or (
            unsmooth is not None
            and (unsmooth.dtype != torch.float32 or unsmooth.shape != (x.shape[1],))
        )
    ):
        raise ValueError(
            f"avx2.quantize: x {tuple(x.shape)} {x.dtype}, unsmooth "
            f"{None if unsmooth is None else (tuple(unsmooth.shape), unsmooth.dtype)}, levels "
            f"{levels}: float32 (R, K), float32 (K,) or None, levels in 1..127"
        )
    functions = _kernels()
    x = x.contiguous()
    unsmooth = None if unsmooth is None else unsmooth.contiguous()
    rows, k = x.shape
    q = torch.empty(rows, k, dtype=torch.int8)
    scale = x.new_empty(rows, 1)
    if rows and k:
        smooth = None if unsmooth is None else unsmooth.data_ptr()
        functions.quantize(x.data_ptr(), rows, k, smooth, levels, q.data_ptr(), scale.data_ptr(),
                           torch.get_num_threads())  # fmt: skip
    return q, scale


def dequantize(
    acc: torch.Tensor,
    ascale: torch.Tensor,
    wscale: torch.Tensor,
    bias: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
    norm: Norm | None = None,
) -> torch.Tensor:
    """int32 (R, N) sums of rows ``quantize`` rounded -> float32 (R, N): ``norm(acc wscale
    ascale + bias (+ add))``, ascale (R, 1) the rows' scales, wscale (N,) the weight's, ``norm``
    a layer norm of each row or None: the int8 product's scaling and its epilogue in one pass.
    Other shapes and dtypes are refused (ValueError)."""
    rows, n = acc.shape if acc.dim() == 2 else (-1, -1)
    if (
        acc.dtype != torch.int32
        or rows < 0
        or ascale.dtype != torch.float32
        or ascale.numel() != rows
        or wscale.dtype != torch.float32
        or wscale.shape != (n,)
        or (bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,)))
        or (add is not None and (add.dtype != torch.float32 or add.shape != (rows, n)))
    ):
        raise ValueError(
            f"avx2.dequantize: acc {tuple(acc.shape)} {acc.dtype}, ascale "
            f"{tuple(ascale.shape)}, wscale {tuple(wscale.shape)}, bias "
            f"{None if bias is None else tuple(bias.shape)}, add "
            f"{None if add is None else tuple(add.shape)}: int32 (R, N), float32 R scales, N "
            "scales, N biases, (R, N)"
        )
    lnw, lnb, eps = _norm(norm, n, "dequantize")
    functions = _kernels()
    acc, ascale, wscale = acc.contiguous(), ascale.contiguous(), wscale.contiguous()
    bias = None if bias is None else bias.contiguous()
    add = None if add is None else add.contiguous()
    out = torch.empty(rows, n)
    if rows and n:
        functions.dequantize(
            acc.data_ptr(), rows, n, ascale.data_ptr(), wscale.data_ptr(),
            None if bias is None else bias.data_ptr(), None if add is None else add.data_ptr(),
            lnw, lnb, eps, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
    return out


SCRATCH_KEPT = 1 << 20  # bytes: the most scratch memory a thread keeps between calls
_SCRATCH = threading.local()


def _scratch(size: int) -> torch.Tensor:
    """At least ``size`` bytes a kernel may write during one call (the caller holds the tensor
    until the call returns): the calling thread's own buffer, kept between calls up to
    SCRATCH_KEPT bytes (an allocation costs a few microseconds, as much as a short product's
    other work), else a fresh one."""
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is not None and buffer.numel() >= size:
        return buffer
    buffer = torch.empty(max(size, 4096), dtype=torch.uint8)
    if size <= SCRATCH_KEPT:
        _SCRATCH.buffer = buffer
    return buffer


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, longest: int
) -> torch.Tensor:
    """q, k, v (N, A, D) float32, rows of packed sequences (views of one product's output are
    fine: each row's heads contiguous) -> (N, A, D): softmax(q k^T / sqrt(D)) v of each sequence
    over its own tokens, sequence b being rows ``starts[b]:starts[b + 1]`` (``starts`` int32,
    (B + 1,), from 0 to N); ``longest`` the longest sequence's length. D a multiple of 8; other
    shapes, and starts that do not fit, are refused (ValueError) before anything is read. The
    first call loads the kernels (RuntimeError, saying why, where they cannot run)."""
    n, heads, d = shape = q.shape
    rows = (d, 1)  # (each row's heads contiguous)
    if (
        q.dtype is not torch.float32
        or k.dtype is not torch.float32
        or v.dtype is not torch.float32
        or k.shape != shape
        or v.shape != shape
        or d % 8
        or q.stride()[1:] != rows
        or k.stride()[1:] != rows
        or v.stride()[1:] != rows
        or starts.dtype is not torch.int32
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
        scratch = _scratch(4 * threads * (d + 2) * width)  # (floats)
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


def embed(
    ids: torch.Tensor,
    types: torch.Tensor | None,
    positions: torch.Tensor,
    word: torch.Tensor,
    type_table: torch.Tensor,
    position_table: torch.Tensor,
    norm: Norm,
) -> torch.Tensor:
    """(n,) int64 token ids, type ids (None: all 0) and positions -> (n, H) float32:
    ``norm((word[ids] + type_table[types]) + position_table[positions])``, the tables float32
    (rows, H), contiguous, H a multiple of 8. Other shapes and dtypes, and an index outside its
    table, are refused (ValueError) before anything is written. The first call loads the
    kernels (RuntimeError, saying why, where they cannot run)."""
    n, h = ids.numel(), word.shape[-1]
    fits = h % 8 == 0
    for t in (ids, positions) if types is None else (ids, types, positions):
        fits = fits and t.dtype == torch.int64 and t.dim() == 1 and t.numel() == n
        fits = fits and t.is_contiguous()
    for t in (word, type_table, position_table):
        fits = fits and t.dtype == torch.float32 and t.dim() == 2 and t.shape[1] == h
        fits = fits and t.is_contiguous()
    if not fits:
        raise ValueError(
            f"avx2.embed: ids {tuple(ids.shape)} {ids.dtype}, types "
            f"{None if types is None else (tuple(types.shape), types.dtype)}, positions "
            f"{tuple(positions.shape)} {positions.dtype}, tables "
            f"{[(tuple(t.shape), t.dtype) for t in (word, type_table, position_table)]}: int64 "
            "(n,) indices, float32 (rows, H) contiguous tables, H a multiple of 8"
        )
    functions = _kernels()
    lnw, lnb, eps = _norm(norm, h, "embed")
    out = word.new_empty(n, h)
    status = functions.embed(
        ids.data_ptr(), None if types is None else types.data_ptr(), positions.data_ptr(), n, h,
        word.data_ptr(), word.shape[0], type_table.data_ptr(), type_table.shape[0],
        position_table.data_ptr(), position_table.shape[0], lnw, lnb, eps, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status:
        raise ValueError(
            f"avx2.embed: an index is outside its table (ids < {word.shape[0]}, types < "
            f"{type_table.shape[0]}, positions < {position_table.shape[0]})"
        )
    return out


def adaptive_team(on: bool) -> bool:
    """Whether a call of the kernels takes fewer of PyTorch's threads for a while after some of
    them were found off their cores (team.c; on by default): set it, clearing any hold under
    way (``False``: every call takes all its threads, as a plain OpenMP loop does), and return
    the setting before. The first call loads the kernels (RuntimeError where they cannot run)."""
    return bool(_kernels().team_adapt(int(on)))


def vector_math_alone(y: torch.Tensor, op: Any, *args: Any) -> torch.Tensor:
    """``op(y, *args)``, PyTorch's operations after a kernel (a pooler's tanh), with MKL's own
    threads held at 1 on this thread meanwhile. PyTorch hands a small tensor's tanh (below 2,048
    values) whole to MKL's vector math, which opens a parallel region of every thread even for
    384 values: one region a sentence, whose barrier waits a time slice for a thread that is
    off its core (team.c). Where PyTorch has no MKL inside (libtorch_cpu without its symbols:
    Arm, some builds), and while a program is traced, ``op`` runs as it is."""
    local = _mkl_local()
    if local is None or tracing() or torch.get_num_threads() == 1:
        return op(y, *args)
    before = local(1)
    try:
        return op(y, *args)
    finally:
        local(before)


@functools.cache
def _mkl_local() -> Any:
    """MKL_Set_Num_Threads_Local (by value: the C form) where PyTorch links MKL into
    libtorch_cpu, else None. (torch.set_num_threads sets this thread-local count too.)"""
    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        function = ctypes.CDLL(str(path)).MKL_Set_Num_Threads_Local
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
    return function


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


def _compile(command: list[str], target: Path, sources: tuple[Path, ...]) -> str | None:
    """Run a compiler's ``command`` (without its output) into a temporary name beside
    ``target``, renamed to it once whole, so processes that build it at once never load half a
    file: None, or why it failed (the compiler's last lines). OSError where the folder cannot be
    written."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(fd)
    result = subprocess.run([*command, "-o", tmp], capture_output=True, text=True)
    if result.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        names = ", ".join(source.name for source in sources)
        return f"{command[0]} could not build {names}: " + " / ".join(tail)
    os.replace(tmp, target)
    return None


def _build_and_load() -> object:
    """The loaded library's functions, or why they could not be built or loaded (a string)."""
    compiler = _compiler()
    sources = b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(sources + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    built, why = None, "no folder to build it in could be written"
    for folder in _cache_dirs():
        target = folder / f"bertlab-avx2-{digest}.so"
        if target.exists():
            built = target
            break
        try:
            folder.mkdir(parents=True, exist_ok=True)
            failed = _compile([compiler, *FLAGS, *map(str, SOURCES)], target, SOURCES)
        except OSError as e:
            why = f"{folder} cannot be written ({e})"
            continue
        if failed is not None:
            return failed
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
    sgemm, attend, qgemm = lib.bertlab_sgemm, lib.bertlab_attention, lib.bertlab_qgemm
    sgemm.argtypes = [ptr, i64, i64, ptr, i64, ptr, i32, ptr, ptr, ptr, f32, ptr, i32, i32]
    attend.argtypes = [ptr, i64, ptr, i64, ptr, i64, ptr, i64, ptr, i64, i64, i64, i64, i64,
                       f32, ptr, i32]  # fmt: skip
    qgemm.argtypes = [ptr, i64, i64, ptr, i32, i32, ptr, ptr, ptr, i64, ptr, i32, ptr, ptr, ptr,
                      f32, ptr, ptr, ptr, i32]  # fmt: skip
    sgemm.restype = attend.restype = qgemm.restype = ctypes.c_int
    rounding, back = lib.bertlab_quantize, lib.bertlab_dequantize
    rounding.argtypes = [ptr, i64, i64, ptr, i32, ptr, ptr, i32]
    rounding.restype = ctypes.c_int
    back.argtypes = [ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, f32, ptr, i32]
    back.restype = None
    embed = lib.bertlab_embed
    embed.argtypes = [ptr, ptr, ptr, i64, i64, ptr, i64, ptr, i64, ptr, i64, ptr, ptr, f32, ptr,
                      i32]  # fmt: skip
    embed.restype = ctypes.c_int
    team, waited, adapt = lib.bertlab_team, lib.bertlab_team_waited, lib.bertlab_team_adapt
    team.argtypes, team.restype = [i32, i64], ctypes.c_int
    waited.argtypes, waited.restype = [ctypes.POINTER(i64), i32, i64], None
    adapt.argtypes, adapt.restype = [i32], ctypes.c_int
    return SimpleNamespace(sgemm=sgemm, attention=attend, qgemm=qgemm, quantize=rounding,
                           dequantize=back, embed=embed, team=team, team_waited=waited,
                           team_adapt=adapt, path=built)  # fmt: skip


# ============================================================================ as operators
OPS_SOURCE = Path(__file__).with_name("avx2_ops.cpp")
_OPS: list[str | None] = []  # [None: registered] or [why not], once a process


def ops() -> str | None:
    """Build (once a machine) and load (once a process) avx2_ops.cpp: the kernels as the
    PyTorch operators ``torch.ops.bertlab.sgemm``, ``torch.ops.bertlab.qgemm`` and
    ``torch.ops.bertlab.attention`` (padded (B, A, T, D) inputs and their mask: each row's real
    tokens, where they come first, as one sequence of ``attention``, else PyTorch's attention),
    which a program that bertlab compiles ahead of time calls from C++ (nn/compiled.py). None
    when they are registered, else why they cannot be (the kernels cannot run, no C++
    compiler, PyTorch's headers missing, a failed build: its last lines)."""
    if not _OPS:
        _OPS.append(_build_ops())
    return _OPS[0]


def _build_ops() -> str | None:
    why = load()
    if why is not None:
        return why
    from torch.utils import cpp_extension

    kernels = _kernels().path
    compiler = shutil.which(os.environ.get("CXX") or "c++")
    if compiler is None:
        return "no C++ compiler was found (set CXX, or install one such as g++)"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libraries = cpp_extension.library_paths()
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    flags = ["-O2", "-std=c++17", "-fPIC", "-shared", abi, "-w"]
    key = " ".join((compiler, *flags, str(kernels), torch.__version__)).encode()
    digest = hashlib.sha256(OPS_SOURCE.read_bytes() + key).hexdigest()[:16]
    target = kernels.with_name(f"bertlab-avx2-ops-{digest}.so")
    if not target.exists():  # (the kernels' folder: written when they were built)
        command = [compiler, *flags, *includes, str(OPS_SOURCE), str(kernels),
                   *(f"-L{p}" for p in libraries), "-lc10", "-ltorch", "-ltorch_cpu"]  # fmt: skip
        try:
            failed = _compile(command, target, (OPS_SOURCE,))
        except OSError as e:
            return f"{target.parent} cannot be written ({e})"
        if failed is not None:
            return failed
    try:
        torch.ops.load_library(str(target))
    except (OSError, RuntimeError) as e:
        return f"{target} could not be loaded ({e})"
    torch.library.register_fake("bertlab::sgemm")(_sgemm_shape)
    torch.library.register_fake("bertlab::qgemm")(_qgemm_shape)
    torch.library.register_fake("bertlab::attention")(_attention_shape)
    return None


def traced_as_operators() -> bool:
    """A program that bertlab compiles itself is being traced (packing.own_program) and the
    operators are registered: the kernels' calls go into its graph as those operators."""
    return own_program() and ops() is None


def _sgemm_shape(x, panels, bias, n, add, gelu, lnw, lnb, eps, wide=False):  # noqa: ANN001, ANN202, E501
    return x.new_empty(*x.shape[:-1], n)


def _qgemm_shape(x, panels, corr, scale, bias, unsmooth, levels, vnni, k, add, gelu, lnw, lnb, eps):  # noqa: ANN001, ANN202, E501
    return x.new_empty(*x.shape[:-1], corr.shape[0])


def _attention_shape(q, k, v, mask, limit):  # noqa: ANN001, ANN202
    B, A, T, D = q.shape
    return q.new_empty(B, T, A, D).transpose(1, 2)  # (the operator's rows: (B, T, A, D))

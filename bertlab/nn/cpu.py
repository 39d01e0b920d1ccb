"""The CPU at hand: what it can run, its class, and the kernels bertlab uses on it.

    features()   the CPU's instruction sets, read once (PyTorch's cpuinfo, else /proc/cpuinfo),
                 narrowed by any limit set on the math libraries (below)
    policy(f)    the class of a feature set and the choices bertlab makes for it (a Policy)
    current()    policy(features()), read once: what products.py, precision.py and compiled.py
                 follow, and what ``bertlab bench runtimes`` records

The classes, and what each one runs (a choice is made from the features, never by trying an
instruction; what was measured where, natively or on a simulation: docs/performance.md):

    class        CPUs                           products: float32 | bfloat16   int8 kernel
    amx          Xeon 4th generation and later  oneDNN | oneDNN (AMX)          onednn-s8 (AMX)
    avx512-bf16  EPYC Zen 4 and 5, Cooper Lake  oneDNN† | oneDNN               onednn-s8 (VNNI)†
    avx512-vnni  Cascade Lake, Ice Lake         oneDNN | in float32            onednn-s8 (VNNI)
    avx512       Skylake-SP                     oneDNN | in float32            fbgemm-u8, 7 bits
    avx2-vnni    Alder Lake and later clients   oneDNN | in float32            onednn-u8, 8 bits
    avx2         EPYC Zen 2 and 3, Haswell on   sgemm* | in float32            u8-avx2*, 7 bits
    x86          x86 without AVX2               PyTorch's | in float32         none (needs AVX2)
    arm          Graviton, Apple, Ampere        PyTorch's | PyTorch's (BF16)   onednn-u8, 8 bits
                                                or in float32 (no BF16)
    other        anything else                  PyTorch's | in float32         none

* **products.** "oneDNN" is products.py's "onednn" route (packed weights, fused epilogues).
  "in float32": a bfloat16 model on a CPU without bfloat16 instructions (AVX512-BF16, AMX-BF16;
  BF16 on Arm) has its linear products computed in float32 on float32 copies of its weights,
  the results rounded to bfloat16 (products.py's "float32" route): PyTorch's bfloat16 kernels
  emulate those instructions there, several times slower than float32. bfloat16 is never
  refused: it runs, and warns once a process that its products run in float32.
  "PyTorch's": the module route, PyTorch's own kernels (on Arm, its NEON/SVE ones).
  "sgemm*": on AMD CPUs of the class, bertlab's own AVX2 kernel (below); on Intel's, oneDNN.
  "oneDNN†": on AMD's Zen 4 (family 25), bertlab's own kernel in AVX-512F (below).
  "onednn-s8 (VNNI)†": on AMD's Zen 4, bertlab's own int8 kernel with VNNI, u8-vnni (below).
  "u8-avx2*": on AMD CPUs of the class, bertlab's own int8 kernel (below); on Intel's, fbgemm-u8.
* **float32 kernel** (``Policy.float32_kernel``): the oneDNN route's float32 products (and a
  bfloat16 model's, computed in float32) run on ``sgemm-avx2``, bertlab's AVX2 kernel
  (avx2.py, sgemm_avx2.c), on AMD CPUs of the avx2 class, where oneDNN's took 1.4x its time at
  batch 1, and on ``sgemm-avx512``, the same kernel with its blocks in AVX-512F (the same
  bits), on AMD's AVX-512 CPUs of family 25 (Zen 4: ``half_width_avx512``). Those run each
  512-bit instruction as two 256-bit halves, so oneDNN's AVX-512 kernels multiply no faster:
  they took 1.19x sgemm-avx2's time at batch 1 and 1.07x on sorted batches, and sgemm-avx2
  took 1.09x sgemm-avx512's, whose blocks issue half its instructions (docs/performance.md).
  Everywhere else oneDNN's: Intel's AVX-512 and AMX CPUs, and Zen 5, have full-width units for
  oneDNN's wider kernels, and Intel's AVX2 CPUs were not measured with it. The kernel is
  compiled at its first product; where it cannot be (no C compiler), products.py warns once
  and the products stay on oneDNN. ``bertlab bench kernels --save`` measures, on the machine
  itself, the whole model on each kernel the CPU runs, and keeps the fastest for this CPU in a
  file (``measured_path``): where that file is, its kernel comes before the class's (the
  classes no project machine belongs to were chosen without a measurement).
  ``BERTLAB_FLOAT32_KERNEL`` (``auto``, ``sgemm-avx512``, ``sgemm-avx2`` or ``onednn``) forces
  one over both; one that cannot run here is refused by name.
* **few rows** (``Policy.few_rows``): a float32 product of at most products.FEW_ROWS rows (one
  short sentence, a handful of them) reads its whole weight for little arithmetic, and MKL's
  packed product does that faster than oneDNN's on Intel CPUs (docs/performance.md). There,
  where float32 takes the oneDNN route and this PyTorch has MKL's packed product, such products
  take it ("mkl"); elsewhere they stay on oneDNN ("onednn"): on an AMD EPYC (Zen 3, AVX2)
  MKL's took 1.27x oneDNN's time at batch 1, and AMD's other classes were not measured with
  it. ``BERTLAB_FEW_ROWS`` (``auto``, ``mkl`` or ``onednn``) forces one; one that cannot run
  here is refused by name.
* **int8 kernels** (precision.py): ``onednn-s8`` is oneDNN's int8 x int8 product summed in
  int32 by its VNNI or AMX kernels, ``torch._int_mm`` (PyTorch sends it to oneDNN only where
  the CPU has AVX512-VNNI, and to a scalar loop elsewhere, so the kernel is chosen there only;
  a traced graph calls it too, for inductor to fuse). Where the CPU has AMX, products of more
  than precision.S8_FEW_ROWS rows take oneDNN's linear operator (``qlinear_pointwise``) on the
  weight prepacked once instead (``Policy.int8_prepacked``): the same sums, faster on batches.
  With VNNI alone (oneDNN limited to AVX512_CORE_VNNI on the Xeon) that operator ran signed
  8-bit inputs on oneDNN's reference kernel, so ``torch._int_mm`` takes every product there.
  ``fbgemm-u8`` and ``onednn-u8`` take the activations as unsigned 8-bit numbers (a token's
  values shifted by a zero point) against int8 weights, with fbgemm's or oneDNN's kernels,
  on weights prepacked once. ``u8-avx2`` is bertlab's own kernel of that kind (avx2.py,
  int8_avx2.c), which rounds the activations inside the call and applies GELU and the residual
  there too: on an AMD EPYC (Zen 3) the int8 model took 0.63-0.67x fbgemm-u8's time at batch 1
  (docs/performance.md), so it is chosen on AMD's avx2 class, with fbgemm-u8 as the fallback
  where it cannot be built (no C compiler: ``Policy.int8_fallback``); elsewhere it comes last,
  for a PyTorch without fbgemm or oneDNN. ``u8-vnni`` is the same kernel summing with VNNI's
  VPDPBUSD (AVX512-VNNI, in 512-bit blocks, and in its 256-bit form, AVX512-VL, on the last
  columns), which adds four u8 x s8 products
  straight into 32 bits, so the activations keep 8 bits: the same sums as onednn-s8's, with
  the rounding, scaling, GELU, residual and layer norm inside the one call. On the Zen 4 EPYC
  (``half_width_avx512``) the int8 model on onednn-s8 took 1.60x its time at batch 1 and 1.03x
  on sorted batches (docs/performance.md), so it is chosen there, with onednn-s8 as the
  fallback; on Intel's VNNI CPUs and Zen 5 it was not measured and comes after the others.
  Without VNNI those kernels multiply with VPMADDUBSW, which adds two u8 x s8 products in 16
  bits and saturates past 32,767: so the activations keep 7 bits there (levels -63..63, as
  fbgemm's ``reduce_range``), 8 with VNNI (``int8_levels``; u8-avx2 keeps 7 everywhere, u8-vnni
  8). fbgemm has no AVX-VNNI code, oneDNN has: so on avx2-vnni CPUs oneDNN's kernel keeps 8
  bits where fbgemm's would keep 7; on avx2 (but AMD's) and avx512 fbgemm's is chosen.
  On Arm (aarch64) PyTorch builds oneDNN's int8 kernels for Arm, and int8 takes ``onednn-u8``
  there, with 8-bit activations: its sums of the largest values were exact under emulation of
  four Arm CPUs, with and without SVE and dot-product instructions (docs/performance.md).
  ``torch._int_mm``, which onednn-s8 calls, does not call oneDNN there (PyTorch 2.9.1 and
  2.13.0). No Arm CPU was at hand to time it on.
  Weights are int8 per output channel and activations per token on every kernel.
  ``bertlab bench kernels --save`` measures the int8 model on each kernel that rounds the
  activations to as many levels as the class's (and stays as close to float32's embeddings) and
  keeps the fastest for this CPU, as for float32 (above); where that file is, its kernel comes
  before the class's order (``Policy.int8_kernel_why`` says which), with the class's kernel as
  the fallback of one of bertlab's own.
  ``BERTLAB_INT8_KERNEL`` (``auto`` or a kernel's name) forces one; a kernel this CPU or this
  PyTorch cannot run is refused by name, with the instruction set or operator it lacks, before
  any product runs (never an illegal instruction).
* **Compiled** (compiled.py) runs its program only in the precisions of ``COMPILED`` for the
  class: those where it was measured faster than the model (amx and avx512-bf16: float32,
  bfloat16 and int8 on onednn-s8; avx2: float32 and int8 on short inputs only, at most
  ``COMPILED_TOKENS`` positions, rows times length, where it saves the Python between short
  products and loses on larger ones). Where the model's products run on bertlab's own kernels
  (float32 on sgemm-avx2, int8 on u8-avx2 or u8-vnni) the program calls the same kernels, as
  operators built beside them (avx2.ops), and its cap is ``COMPILED_TOKENS_AVX2``. Elsewhere
  (int8 on PyTorch's u8 kernels, which a compiled program cannot call; bfloat16 without bfloat16
  instructions; every precision on classes where it was measured no faster, or not measured,
  and a precision whose products run on bertlab's own kernels, forced or measured here, on a
  class where the program calling them was not measured) ``Compiled`` calls the model itself,
  and says why (``Policy.not_compiled``).

Limits. The math libraries each take a limit on the instruction sets they use:
``ONEDNN_MAX_CPU_ISA`` (oneDNN), ``ATEN_CPU_CAPABILITY`` (PyTorch's own kernels and
torch.compile's code), ``FBGEMM_ENABLE_INSTRUCTIONS`` and ``MKL_ENABLE_INSTRUCTIONS``. A limit
set on any of them narrows the features here, so the class is that of the CPU the libraries
are allowed to use. Set together they simulate an older CPU on a newer one (AVX2:
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2``), as tests/test_cpu.py does.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertlab import openmp
from bertlab.nn.measured import Measured, measured_path, read_measured

# ============================================================================ features
# The instruction sets that matter here, by PyTorch's (cpuinfo's) names, in the order a limit
# admits them. A limit names a level; every set up to that level stays.
LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("sse41", frozenset({"sse4_1"})),
    ("avx", frozenset({"avx"})),
    ("avx2", frozenset({"avx2", "fma3"})),
    ("avx2_vnni", frozenset({"avx_vnni"})),
    ("avx512_core", frozenset({"avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_cd"})),
    ("avx512_core_vnni", frozenset({"avx512_vnni"})),
    ("avx512_core_bf16", frozenset({"avx512_bf16"})),
    ("avx512_core_fp16", frozenset({"avx512_fp16"})),
    ("avx512_core_amx", frozenset({"amx_tile", "amx_int8", "amx_bf16"})),
)
X86_FLAGS = frozenset().union(*(flags for _, flags in LEVELS))
ARM_FLAGS = frozenset({"asimd", "asimddp", "i8mm", "bf16", "sve", "sve2"})
ARM = ("aarch64", "arm64")  # platform.machine()'s names for 64-bit Arm
# each library's names for its levels (ours above); a name not listed sets no limit
LIMITS = {
    "ONEDNN_MAX_CPU_ISA": {
        "SSE41": "sse41",
        "AVX": "avx",
        "AVX2": "avx2",
        "AVX2_VNNI": "avx2_vnni",
        "AVX2_VNNI_2": "avx2_vnni",
        "AVX512_CORE": "avx512_core",
        "AVX512_CORE_VNNI": "avx512_core_vnni",
        "AVX512_CORE_BF16": "avx512_core_bf16",
        "AVX512_CORE_FP16": "avx512_core_fp16",
        "AVX10_1_512": "avx512_core_fp16",
    },
    # AVX-VNNI matters to bertlab only in oneDNN's int8 kernel (the other libraries have no
    # level of their own for it: AVX2 is what they run on a CPU with AVX-VNNI), so only
    # ONEDNN_MAX_CPU_ISA takes it away
    "ATEN_CPU_CAPABILITY": {"DEFAULT": "sse41", "AVX2": "avx2_vnni"},
    "FBGEMM_ENABLE_INSTRUCTIONS": {"AVX2": "avx2_vnni", "AVX512": "avx512_core"},
    "MKL_ENABLE_INSTRUCTIONS": {"SSE4_2": "sse41", "AVX": "avx", "AVX2": "avx2_vnni",
                                "AVX2_E1": "avx2_vnni", "AVX512": "avx512_core",
                                "AVX512_E1": "avx512_core_vnni"},
}  # fmt: skip
# oneDNN's name for the highest level a feature set reaches (what it dispatches to)
ONEDNN_ISA = {
    "sse41": "SSE4.1",
    "avx": "AVX",
    "avx2": "AVX2",
    "avx2_vnni": "AVX2_VNNI",
    "avx512_core": "AVX512_CORE",
    "avx512_core_vnni": "AVX512_CORE_VNNI",
    "avx512_core_bf16": "AVX512_CORE_BF16",
    "avx512_core_fp16": "AVX512_CORE_FP16",
    "avx512_core_amx": "AVX512_CORE_AMX",
}


@dataclass(frozen=True)
class Features:
    """What a CPU can run, as the libraries bertlab calls see it."""

    arch: str  # "x86_64", "aarch64", ...
    model: str  # the CPU's model name
    flags: frozenset[str]  # instruction sets (LEVELS, ARM_FLAGS), after the limits
    limits: tuple[str, ...] = ()  # the limits that narrowed them ("ONEDNN_MAX_CPU_ISA=AVX2")
    onednn: bool = True  # this PyTorch has oneDNN (and it is enabled)
    onednn_bf16: bool = True  # oneDNN computes bfloat16 here (natively or not)
    fbgemm: bool = True  # this PyTorch has fbgemm's int8 linear kernels
    int_mm: bool = True  # this PyTorch has torch._int_mm
    vendor: str = ""  # "GenuineIntel", "AuthenticAMD", ... ("" where not read)
    mkl: bool = True  # this PyTorch has MKL's packed float32 product (torch.ops.mkl._mkl_linear)
    family: int | None = None  # the x86 CPU family (/proc/cpuinfo's "cpu family"; None: not read)

    @property
    def x86(self) -> bool:
        return self.arch in ("x86_64", "amd64", "i386", "i686", "x86")

    def level(self) -> str | None:
        """The highest x86 level whose every set of instructions (and all below) is here."""
        top = None
        for name, flags in LEVELS:
            if name == "avx2_vnni":  # a side branch: AVX-512 CPUs reach VNNI by avx512_core_vnni
                continue
            if not flags <= self.flags:
                break
            top = name
        if top == "avx2" and "avx_vnni" in self.flags:
            top = "avx2_vnni"
        return top


# /proc/cpuinfo's names that differ from cpuinfo's (PyTorch's)
PROC_NAMES = {
    "fma": "fma3",
    "avx512f": "avx512_f",
    "avx512bw": "avx512_bw",
    "avx512vl": "avx512_vl",
    "avx512dq": "avx512_dq",
    "avx512cd": "avx512_cd",
}


def _hardware_flags() -> tuple[str, frozenset[str], str, int | None]:
    """(model name, instruction sets, vendor, family) from PyTorch's cpuinfo, else
    /proc/cpuinfo."""
    model, flags, vendor, family = platform.processor() or "unknown", set(), "", None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model name") and model in ("unknown", "", "x86_64"):
                model = value.strip()
            elif key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key == "cpu family" and family is None and value.strip().isdigit():
                family = int(value)
            elif key in ("flags", "Features") and not flags:
                flags = {PROC_NAMES.get(n, n) for n in value.split()}
    except OSError:
        pass
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        try:
            found = capabilities()
        except Exception:  # noqa: BLE001 - cpuinfo could not read this CPU: /proc/cpuinfo's
            found = {}
        if found:
            flags = {k for k, v in found.items() if v is True} | (flags & ARM_FLAGS)
            if model == "unknown" and isinstance(found.get("cpu_name"), str):
                model = found["cpu_name"]
    return model, frozenset(flags & (X86_FLAGS | ARM_FLAGS)), vendor, family


def _limits(environ: dict[str, str] | os._Environ) -> tuple[tuple[str, ...], frozenset[str]]:
    """The limits set in ``environ`` and the instruction sets they allow (all, if none)."""
    allowed = set(X86_FLAGS)
    named: list[str] = []
    for variable, levels in LIMITS.items():
        value = environ.get(variable, "").strip().upper()
        if variable == "ONEDNN_MAX_CPU_ISA" and not value:
            value = environ.get("DNNL_MAX_CPU_ISA", "").strip().upper()
        level = levels.get(value)
        if level is None:
            continue
        named.append(f"{variable}={value}")
        names = [n for n, _ in LEVELS]
        below = {f for n, flags in LEVELS[: names.index(level) + 1] for f in flags}
        if level != "avx2_vnni" and names.index(level) < names.index("avx512_core_vnni"):
            below.discard("avx_vnni")  # (AVX2_VNNI is a level of its own)
        allowed &= below
    return tuple(named), frozenset(allowed)


def features() -> Features:
    """This CPU's features, narrowed by the libraries' limits (module docstring). Read once, and
    never kept from inside a trace: torch.export and torch.compile turn oneDNN off while they
    trace, so features read there would lack it for the rest of the process."""
    if _FEATURES:
        return _FEATURES[0]
    found = read_features()
    if not torch.compiler.is_compiling():
        _FEATURES.append(found)
    return found


_FEATURES: list[Features] = []


def read_features() -> Features:
    """This CPU's features as the libraries see them now (``features`` keeps them)."""
    model, flags, vendor, family = _hardware_flags()
    arch = platform.machine().lower()
    limits, allowed = _limits(os.environ)
    if arch in ("x86_64", "amd64"):
        flags = flags & allowed
    onednn = bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)
    quantized = getattr(torch.backends, "quantized", None)
    engines = getattr(quantized, "supported_engines", ()) if quantized else ()
    return Features(
        arch=arch,
        model=model,
        flags=flags,
        limits=limits,
        onednn=onednn,
        onednn_bf16=onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        fbgemm="fbgemm" in engines and _has_op("quantized", FBGEMM_LINEAR),
        int_mm=hasattr(torch, "_int_mm"),
        vendor=vendor,
        mkl=torch.backends.mkl.is_available() and _has_op("mkl", "_mkl_linear"),
        family=family,
    )


FBGEMM_LINEAR = "linear_with_input_q_dq_qweight_dq_output_fp32"  # fbgemm's u8 x s8 -> float32


def _has_op(namespace: str, name: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


# ============================================================================ the policy
INT8_KERNELS = ("onednn-s8", "u8-vnni", "u8-avx2", "fbgemm-u8", "onednn-u8")
OWN_INT8 = ("u8-vnni", "u8-avx2")  # bertlab's own (avx2.py, int8_avx2.c): built at first use
# the instruction sets a kernel needs, by (ours, a reader's) name
NEEDS = {
    "onednn-s8": (("avx512_vnni",), "AVX512-VNNI"),
    "u8-vnni": (("avx2", "fma3", "avx512_vnni", "avx512_vl"), "AVX512-VNNI and AVX512-VL"),
    "u8-avx2": (("avx2", "fma3"), "AVX2 and FMA"),
    "fbgemm-u8": (("avx2",), "AVX2"),
    "onednn-u8": (("avx2",), "AVX2"),
}
NO_BF16 = "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX) for oneDNN"
# the precisions in which Compiled's program was measured faster than the model, by class
# (docs/performance.md); elsewhere Compiled calls the model
COMPILED = {
    "amx": ("float32", "bfloat16", "int8"),  # Sapphire Rapids Xeon
    "avx512-bf16": ("float32", "bfloat16", "int8"),  # EPYC Zen 4
    "avx2": ("float32", "int8"),  # EPYC Zen 3: short inputs only (COMPILED_TOKENS*)
}
# where the program wins only on short inputs: the most positions (rows x length) of a batch it
# runs, by class and precision; larger batches run the model. On the AVX2 EPYC the program took
# 0.68-0.93x the model's time from 8 to 48 positions, 0.99-1.01x at 64 and 1.06-1.22x from 96 up
# (benchmarks/compiled-sizes-epyc-avx2.txt): the same oneDNN products with less Python between
# them, which counts only while the products are small
COMPILED_TOKENS = {"avx2": {"float32": 48}}
# the same where the model's products run on bertlab's own kernels (float32 on sgemm-avx2, int8
# on u8-avx2 or u8-vnni), which the program calls too, as operators (avx2.ops), without the
# Python between them: on the AVX2 EPYC it took 0.62-0.94x the model's time in float32 and
# 0.52-0.93x in int8 from 8 to 128 positions, 1.07x and 0.99x at 256
# (benchmarks/compiled-sizes-epyc-avx2.txt); on the AVX-512 EPYC (Zen 4: half_width_avx512)
# 0.62-0.96x in float32 (sgemm-avx2) from 8 to 128, 0.99x at 256 and 1.04x at 768; in int8
# (u8-vnni) 0.44-0.89x from 8 to 128, 0.92x at 256 and 0.96x at 768 (two runs: 0.44-0.99x,
# 0.95x, 1.03x) (benchmarks/compiled-sizes-epyc-avx512.txt)
COMPILED_TOKENS_AVX2 = {
    "avx2": {"float32": 128, "int8": 128},
    "avx512-bf16": {"float32": 128, "int8": 256},
}


def _on_avx2_kernels(precision: str, float32_kernel: str | None, int8_kernel: str | None) -> bool:
    """``precision``'s products run on bertlab's AVX2 kernels (float32 on sgemm-avx2 or
    sgemm-avx512, int8 on u8-avx2 or u8-vnni), which a compiled program calls as operators
    (avx2.ops)."""
    return (precision == "float32" and float32_kernel in OWN_FLOAT32) or (
        precision == "int8" and int8_kernel in OWN_INT8
    )


def _compiled_tokens(
    cls: str, compiled: frozenset[str], float32_kernel: str | None, int8_kernel: str | None
) -> dict[str, int]:
    """The most positions a batch of each compiled precision may have (module docstring)."""
    caps = dict(COMPILED_TOKENS.get(cls, {}))
    for precision, cap in COMPILED_TOKENS_AVX2.get(cls, {}).items():
        if _on_avx2_kernels(precision, float32_kernel, int8_kernel):
            caps[precision] = cap
    return {k: v for k, v in caps.items() if k in compiled}


@dataclass(frozen=True)
class Policy:
    """The choices for one CPU class (module docstring)."""

    cpu_class: str
    features: Features
    int8_kernel: str | None  # one of INT8_KERNELS, or None (int8_why says why)
    int8_why: str | None
    int8_kernel_why: str  # why this kernel: the class's order, forced, or measured here
    # the kernel taken where int8_kernel (u8-avx2, built at its first product) cannot be built in
    # the process; None where it was forced or nothing else runs here (precision.int8_kernel)
    int8_fallback: str | None
    int8_levels: int  # activations are rounded to -levels..levels: 127 (8 bits) or 63 (7)
    bf16_native: bool
    bf16_why: str | None  # why bfloat16 is not native here, or None
    # how products.py computes a linear product, by the input's dtype (else "module")
    products: dict[torch.dtype, str] = field(default_factory=dict)
    compiled: frozenset[str] = frozenset()  # the precisions Compiled runs as its program
    # the most positions (rows x length) of a batch the program runs, by precision (no entry:
    # any batch)
    compiled_tokens: dict[str, int] = field(default_factory=dict)
    # why Compiled calls the model in each other precision ("float32", "bfloat16", "int8")
    not_compiled: dict[str, str] = field(default_factory=dict)
    # the kernel of float32 products with few rows on the oneDNN route: "mkl" or "onednn"
    # (None where float32 takes PyTorch's kernels), and why
    few_rows: str | None = None
    few_rows_why: str = ""
    # the kernel of float32 products on the oneDNN route: "sgemm-avx2" or "sgemm-avx512"
    # (bertlab's own, every row count, before few_rows) or "onednn" (None where float32 takes
    # PyTorch's kernels), and why
    float32_kernel: str | None = None
    float32_kernel_why: str = ""
    # onednn-s8 products of more than precision.S8_FEW_ROWS rows on oneDNN's linear kernel with
    # the weight prepacked (AMX only: with VNNI alone oneDNN runs signed 8-bit inputs on its
    # reference kernel), else every product on torch._int_mm
    int8_prepacked: bool = False

    @property
    def onednn_isa(self) -> str | None:
        """oneDNN's name for the instructions it dispatches to here (None off x86)."""
        level = self.features.level() if self.features.x86 else None
        return None if level is None or not self.features.onednn else ONEDNN_ISA[level]

    def on_avx2_kernels(self, precision: str) -> bool:
        """``precision``'s products run on bertlab's AVX2 kernels here (``_on_avx2_kernels``)."""
        return _on_avx2_kernels(precision, self.float32_kernel, self.int8_kernel)

    def describe(self) -> dict[str, object]:
        """The class and its choices, as ``bertlab bench runtimes`` records them."""
        f = self.features
        return {
            "class": self.cpu_class,
            "model": f.model,
            "arch": f.arch,
            "flags": sorted(f.flags),
            "limits": list(f.limits),
            "onednn_isa": self.onednn_isa,
            "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "int8_kernel": self.int8_kernel,
            "int8_activation_bits": self.int8_levels.bit_length() + 1 if self.int8_kernel else None,
            "int8_why": self.int8_why,
            "int8_kernel_why": self.int8_kernel_why,
            "int8_fallback": self.int8_fallback,
            "bf16_native": self.bf16_native,
            "bf16_why": self.bf16_why,
            "products": {str(k).removeprefix("torch."): v for k, v in self.products.items()},
            "compiled": sorted(self.compiled),
            "compiled_tokens": dict(self.compiled_tokens),
            "not_compiled": dict(self.not_compiled),
            "few_rows": self.few_rows,
            "few_rows_why": self.few_rows_why,
            "float32_kernel": self.float32_kernel,
            "float32_kernel_why": self.float32_kernel_why,
            "int8_prepacked": self.int8_prepacked,
            "openmp_wait": openmp.WAIT,
        }  # fmt: skip


def classify(f: Features) -> str:
    """The class of a feature set (module docstring)."""
    if f.arch in ARM:
        return "arm"
    if not f.x86:
        return "other"
    has = f.flags.__contains__
    if has("amx_bf16") and has("amx_int8") and has("avx512_bf16"):
        return "amx"
    if has("avx512_f") and has("avx512_bw") and has("avx512_vl"):
        if has("avx512_bf16") and has("avx512_vnni"):
            return "avx512-bf16"
        return "avx512-vnni" if has("avx512_vnni") else "avx512"
    if has("avx2") and has("fma3"):
        return "avx2-vnni" if has("avx_vnni") else "avx2"
    return "x86"


def _kernel_why(kernel: str, f: Features, cls: str) -> str | None:
    """Why ``kernel`` cannot run here (the instruction set or operator it lacks), or None."""
    if not f.x86 and not (kernel == "onednn-u8" and f.arch in ARM):
        return f"the {kernel} kernel runs on x86 CPUs; this one is {f.arch}"
    flags, name = NEEDS[kernel]
    if f.x86 and not set(flags) <= f.flags:  # (every aarch64 CPU has Advanced SIMD)
        return f"the {kernel} kernel needs {name}, which this CPU ({cls}) does not have" + (
            f" within {', '.join(f.limits)}" if f.limits else ""
        )
    if kernel == "onednn-s8" and not (
        f.int_mm and f.onednn and _has_op("onednn", "qlinear_pointwise")
    ):
        return (
            f"PyTorch {torch.__version__} has no oneDNN int8 matrix product (torch._int_mm and "
            "qlinear_pointwise)"
        )
    if kernel == "fbgemm-u8" and not f.fbgemm:
        return f"PyTorch {torch.__version__} has no fbgemm int8 linear kernel"
    if kernel == "onednn-u8" and not (f.onednn and _has_op("onednn", "qlinear_pointwise")):
        return (
            f"PyTorch {torch.__version__} has no oneDNN int8 linear kernel (qlinear_pointwise)"
            + ("" if f.x86 else f", the only int8 kernel bertlab runs on {f.arch}")
        )
    return None


def _int8(f: Features, cls: str, forced: str) -> tuple[str | None, str | None, str | None]:
    """(kernel, None, fallback) or (None, why not, None). fallback: the kernel taken where the
    chosen one, u8-avx2, cannot be built in the process (None where it was forced, or where no
    other kernel runs here)."""
    if forced not in ("", "auto"):
        if forced not in INT8_KERNELS:
            choices = ", ".join(INT8_KERNELS)
            why = f"BERTLAB_INT8_KERNEL={forced} is not a kernel; choose auto or one of {choices}"
            return None, why, None
        why = _kernel_why(forced, f, cls)
        return (None, f"BERTLAB_INT8_KERNEL={forced}: {why}", None) if why else (forced, None, None)
    if f.arch in ARM:  # oneDNN's u8 kernel, the one PyTorch builds for aarch64
        why = _kernel_why("onednn-u8", f, cls)
        return (None, why, None) if why else ("onednn-u8", None, None)
    if not f.x86:
        why = (
            f"bertlab's int8 kernels are x86 ones, from AVX2 up (oneDNN's, fbgemm's and its own), "
            f"and oneDNN's on aarch64; this CPU is {f.arch}"
        )
        return None, why, None
    # VNNI's (or AMX's) int8 x int8 products where PyTorch sends torch._int_mm to them; with
    # AVX-VNNI alone, oneDNN's u8 kernel (its AVX-VNNI code keeps 8-bit activations, fbgemm has
    # none and would keep 7); on AMD's AVX2 CPUs bertlab's own u8 kernel, and on Zen 4 its VNNI
    # form (each measured faster than PyTorch's kernels there); else the u8 kernels, fbgemm's
    # first. bertlab's come last everywhere else: they need no fbgemm or oneDNN in PyTorch, only
    # AVX2, FMA (and VNNI for u8-vnni) and a C compiler
    if "avx512_vnni" in f.flags and half_width_avx512(f):
        order = ("u8-vnni", "onednn-s8", "fbgemm-u8", "onednn-u8")
    elif "avx512_vnni" in f.flags:
        order = ("onednn-s8", "fbgemm-u8", "onednn-u8", "u8-vnni", "u8-avx2")
    elif "avx_vnni" in f.flags:
        order = ("onednn-u8", "fbgemm-u8", "u8-avx2")
    elif cls == "avx2" and f.vendor == "AuthenticAMD":
        order = ("u8-avx2", "fbgemm-u8", "onednn-u8")
    else:
        order = ("fbgemm-u8", "onednn-u8", "u8-avx2")
    runs = [kernel for kernel in order if _kernel_why(kernel, f, cls) is None]
    if runs:
        return runs[0], None, runs[1] if runs[0] in OWN_INT8 and len(runs) > 1 else None
    reasons = [_kernel_why(kernel, f, cls) for kernel in order]
    return None, reasons[0] if "avx2" not in f.flags else "; ".join(map(str, reasons)), None


def int8_levels(kernel: str | None, f: Features) -> int:
    """The activations' levels L (rounded to -L..L) of an int8 kernel on these features: 127
    (8 bits) where the kernel sums with VNNI (or AMX), and on aarch64, else 63 (7 bits).
    Without VNNI the x86 u8 kernels multiply with VPMADDUBSW, which adds two u8 x s8 products
    in 16 bits and saturates past 32,767; the activations enter shifted by the zero point L + 1,
    so a pair reaches 2 x 255 x 127 = 64,770 at L = 127 and 2 x 127 x 127 = 32,258 at L = 63.
    oneDNN's aarch64 kernel summed the worst case exactly at L = 127 (tests/test_precision.py's
    exactness test, run under emulation of four Arm CPUs: docs/performance.md)."""
    if kernel == "u8-avx2":  # (VPMADDUBSW on every CPU: int8_avx2.c)
        return 63
    if kernel is not None and f.arch in ARM:  # oneDNN's aarch64 kernel: exact at 8 bits
        return 127
    if kernel in ("onednn-s8", "u8-vnni") or (kernel is not None and "avx512_vnni" in f.flags):
        return 127
    if kernel == "onednn-u8" and "avx_vnni" in f.flags:  # oneDNN's AVX-VNNI code (fbgemm has none)
        return 127
    return 63


def policy(
    f: Features, environ: dict[str, str] | os._Environ | None = None, measured: bool = True
) -> Policy:
    """The choices for a feature set (module docstring). ``environ``: where BERTLAB_INT8_KERNEL
    and the other settings are read (the process's environment by default). ``measured``: the
    kernels ``bertlab bench kernels --save`` kept for this CPU come before the class's; False:
    the class's own choices."""
    environ = os.environ if environ is None else environ
    cls = classify(f)
    forced_int8 = environ.get("BERTLAB_INT8_KERNEL", "").strip().lower()
    kernel, int8_why, fallback = _int8(f, cls, forced_int8)
    found = read_measured(measured_path(f, environ), f) if measured else None
    if kernel is None:
        int8_kernel_why = ""
    elif forced_int8 in ("", "auto"):
        kernel, fallback, int8_kernel_why = _measured_int8(f, cls, kernel, fallback, found)
    else:
        int8_kernel_why = f"forced by BERTLAB_INT8_KERNEL={forced_int8}"
    levels = int8_levels(kernel, f)
    if f.x86:
        native = f.onednn_bf16 and bool({"avx512_bf16", "amx_bf16"} & f.flags)
        bf16_why = None if native else (
            NO_BF16 if f.onednn else
            "this PyTorch build has no oneDNN, which runs bfloat16 products on the CPU"
        )  # fmt: skip
    else:
        native = "bf16" in f.flags
        bf16_why = None if native else f"this {f.arch} CPU has no bfloat16 instructions (BF16)"
    products: dict[torch.dtype, str] = {}
    if f.x86 and f.onednn and "avx2" in f.flags:
        products[torch.float32] = "onednn"
        products[torch.bfloat16] = "onednn" if native else "float32"
    elif not native:
        products[torch.bfloat16] = "float32"
    sgemm_kernel, sgemm_why = _float32_kernel(
        f, cls, products, environ.get("BERTLAB_FLOAT32_KERNEL", ""), found
    )
    not_compiled: dict[str, str] = {}
    if not native:
        not_compiled["bfloat16"] = f"bfloat16 products run in float32 here ({bf16_why})"
    if kernel is None:
        not_compiled["int8"] = f"int8 does not run here ({int8_why})"
    elif kernel not in ("onednn-s8", *OWN_INT8):
        not_compiled["int8"] = (
            f"the int8 products run on the {kernel} kernel, which a compiled program cannot "
            "call (it would compute them in float32)"
        )
    for precision in ("float32", "bfloat16", "int8"):
        if precision not in COMPILED.get(cls, ()) and precision not in not_compiled:
            not_compiled[precision] = (
                f"the compiled program was not measured faster than the model on this class "
                f"of CPU ({cls})"
            )
    # a program calling bertlab's own kernels (forced or measured here) only where it was
    # measured with them
    for precision, own in (("float32", sgemm_kernel), ("int8", kernel)):
        if (
            own in (*OWN_FLOAT32, *OWN_INT8)
            and precision not in not_compiled
            and precision not in COMPILED_TOKENS_AVX2.get(cls, {})
        ):
            measured = [c for c, caps in COMPILED_TOKENS_AVX2.items() if precision in caps]
            not_compiled[precision] = (
                f"the compiled program calling the {own} kernel was measured only on the "
                f"{', '.join(measured)} class, not on this one ({cls})"
            )
    compiled = frozenset(COMPILED.get(cls, ())) - set(not_compiled)
    few_rows, few_rows_why = _few_rows(f, products, environ.get("BERTLAB_FEW_ROWS", ""))
    return Policy(
        cpu_class=cls,
        features=f,
        int8_kernel=kernel,
        int8_why=int8_why,
        int8_kernel_why=int8_kernel_why,
        int8_fallback=fallback,
        int8_levels=levels,
        bf16_native=native,
        bf16_why=bf16_why,
        products=products,
        compiled=compiled,
        compiled_tokens=_compiled_tokens(cls, compiled, sgemm_kernel, kernel),
        not_compiled=not_compiled,
        few_rows=few_rows,
        few_rows_why=few_rows_why,
        float32_kernel=sgemm_kernel,
        float32_kernel_why=sgemm_why,
        int8_prepacked=kernel == "onednn-s8" and "amx_int8" in f.flags,
    )


FEW_ROWS_KERNELS = ("mkl", "onednn")


def _few_rows(f: Features, products: dict[torch.dtype, str], forced: str) -> tuple[str | None, str]:
    """(kernel, why) of float32 products with few rows (module docstring); a forced kernel
    that cannot run here is refused (ValueError), naming what is missing."""
    forced = forced.strip().lower()
    if forced not in ("", "auto", *FEW_ROWS_KERNELS):
        raise ValueError(f"BERTLAB_FEW_ROWS={forced} is not a kernel; choose auto, mkl or onednn")
    if products.get(torch.float32) != "onednn":
        if forced in FEW_ROWS_KERNELS:
            raise ValueError(
                f"BERTLAB_FEW_ROWS={forced}: float32 products take PyTorch's own kernels on "
                f"this CPU ({classify(f)}), not oneDNN's route"
            )
        return None, "float32 products take PyTorch's own kernels here"
    if not f.mkl:
        if forced == "mkl":
            raise ValueError(
                f"BERTLAB_FEW_ROWS=mkl: PyTorch {torch.__version__} has no MKL packed product "
                "(torch.ops.mkl._mkl_linear)"
            )
        return "onednn", f"PyTorch {torch.__version__} has no MKL packed product"
    if forced in FEW_ROWS_KERNELS:
        return forced, f"forced by BERTLAB_FEW_ROWS={forced}"
    if f.vendor != "GenuineIntel":
        return "onednn", (
            f"MKL's packed product was measured faster on Intel CPUs only (on an AMD EPYC, "
            f"1.27x oneDNN's time at batch 1); this one is {f.vendor or 'of an unknown vendor'}"
        )
    return "mkl", "MKL's packed product, measured faster than oneDNN's on few rows"


FLOAT32_KERNELS = ("sgemm-avx512", "sgemm-avx2", "onednn")
# bertlab's own (avx2.py, sgemm_avx2.c): the same kernel, its blocks in AVX-512F or in AVX2
OWN_FLOAT32 = ("sgemm-avx512", "sgemm-avx2")
# the instruction sets each of those needs, by (ours, a reader's) name
FLOAT32_NEEDS = {
    "sgemm-avx2": (frozenset({"avx2", "fma3"}), "AVX2 and FMA"),
    "sgemm-avx512": (frozenset({"avx2", "fma3", "avx512_f"}), "AVX2, FMA and AVX-512F"),
}


def _float32_kernel(
    f: Features,
    cls: str,
    products: dict[torch.dtype, str],
    forced: str,
    measured: Measured | None = None,
) -> tuple[str | None, str]:
    """(kernel, why) of float32 products on the oneDNN route (module docstring); a forced kernel
    that cannot run on this CPU is refused (ValueError), naming what is missing. Else the choice
    ``bertlab bench kernels --save`` measured on this CPU (``read_measured``), where there is one
    that holds here, else the class's. Whether bertlab's kernel builds in this process is found
    at its first product (avx2.load)."""
    forced = forced.strip().lower()
    if forced not in ("", "auto", *FLOAT32_KERNELS):
        raise ValueError(
            f"BERTLAB_FLOAT32_KERNEL={forced} is not a kernel; choose auto, "
            f"{', '.join(FLOAT32_KERNELS[:-1])} or onednn"
        )
    needs = FLOAT32_NEEDS
    if forced in needs and not (f.x86 and needs[forced][0] <= f.flags):
        raise ValueError(
            f"BERTLAB_FLOAT32_KERNEL={forced}: the kernel needs "
            + (
                f"an x86 CPU; this one is {f.arch}"
                if not f.x86
                else f"{needs[forced][1]}, which this CPU ({cls}) does not have"
            )  # fmt: skip
            + (f" within {', '.join(f.limits)}" if f.limits else "")
        )
    if products.get(torch.float32) != "onednn":
        return None, "float32 products take PyTorch's own kernels here"
    if forced in FLOAT32_KERNELS:
        return forced, f"forced by BERTLAB_FLOAT32_KERNEL={forced}"
    kernel, why = class_float32_kernel(f, cls)
    chosen, said = (None, None) if measured is None else measured.choice("float32")
    required = needs.get(str(chosen), (frozenset(),))[0]
    if chosen is not None and (chosen not in FLOAT32_KERNELS or not required <= f.flags):
        chosen, said = None, measured.passed_over(f"its float32 kernel {chosen!r} cannot run here")
    if chosen is None:  # (no choice kept, or one that does not hold here)
        return kernel, why if said is None else f"{why} ({said})"
    return chosen, said


def class_float32_kernel(f: Features, cls: str) -> tuple[str, str]:
    """(kernel, why): the class's float32 kernel, where float32 products take the oneDNN route
    and nothing was forced or measured (module docstring)."""
    if half_width_avx512(f):
        return "sgemm-avx512", (
            "bertlab's kernel in AVX-512F: this CPU (AMD family 25, Zen 4) runs AVX-512 on "
            "256-bit halves, so oneDNN's wider kernels multiply no faster, and bertlab's was "
            "measured faster than them; its AVX-512 blocks issue half the instructions of its "
            "AVX2 ones, which it was measured faster than too"
        )
    if cls != "avx2":
        return "onednn", (
            f"oneDNN's products, whose kernels use this class's wider instructions ({cls})"
            if cls.startswith(("avx512", "amx"))
            else f"oneDNN's products (sgemm-avx2 was not measured on this class, {cls})"
        )
    if f.vendor != "AuthenticAMD":
        return "onednn", (
            "oneDNN's products: sgemm-avx2 was measured faster on AMD's AVX2 CPUs only; this "
            f"one is {f.vendor or 'of an unknown vendor'}"
        )
    return "sgemm-avx2", "bertlab's AVX2 kernel, measured faster than oneDNN's on this class"


def half_width_avx512(f: Features) -> bool:
    """AMD's AVX-512 CPUs of family 25 (0x19: Zen 4; its AVX2 CPUs are Zen 3), which run each
    512-bit instruction as two 256-bit halves: an AVX2 kernel does as many multiplications a
    cycle. Zen 5 (family 26) has full 512-bit units."""
    return f.vendor == "AuthenticAMD" and f.family == 25 and "avx512_f" in f.flags


# ============================================================================ measured choices
def _measured_int8(
    f: Features, cls: str, kernel: str, fallback: str | None, measured: Measured | None
) -> tuple[str, str | None, str]:
    """(kernel, fallback, why) of int8 products: the class's ``kernel``, or the one measured
    here where it runs on this CPU and rounds the activations to as many levels. Measured, one
    of bertlab's own kernels falls back to the class's where it cannot be built in the
    process."""
    chosen, said = (None, None) if measured is None else measured.choice("int8")
    why = "the first of the class's kernels that runs here (bertlab.nn.cpu)"
    if chosen is None:
        return kernel, fallback, why if said is None else f"{why} ({said})"
    problem = (
        f"its int8 kernel {chosen!r} is not one" if chosen not in INT8_KERNELS
        else _kernel_why(chosen, f, cls) or (
            None if int8_levels(chosen, f) == int8_levels(kernel, f) else
            f"its int8 kernel {chosen} rounds the activations to other levels than {kernel}"
        )
    )  # fmt: skip
    if problem is not None:
        return kernel, fallback, f"{why} ({measured.passed_over(problem)})"
    if chosen == kernel:
        return kernel, fallback, str(said)
    return (
        chosen,
        (kernel if chosen in OWN_INT8 and kernel not in OWN_INT8 else fallback),
        str(said),
    )


@contextlib.contextmanager
def using(chosen: Policy) -> Iterator[Policy]:
    """Within it, ``current()`` is ``chosen`` (the same policy with another kernel, to time it)."""
    before = current()
    _CURRENT[0] = chosen
    try:
        yield chosen
    finally:
        _CURRENT[0] = before


def inductor_options() -> dict[str, object]:
    """inductor settings that keep its C++ kernels right under ``ATEN_CPU_CAPABILITY=avx2`` on
    a CPU with AVX-512 (a simulated AVX2 CPU): the limit narrows the instructions inductor
    compiles for, but (torch 2.13) not the vector width it tiles its loops for, which it reads
    from the CPU, so it writes 16-lane loops of 8-lane vectors and computes half of each. The
    width pinned to AVX2's makes the two agree; on a real AVX2 CPU it is the width anyway."""
    if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().upper() == "AVX2":
        return {"cpp.simdlen": 256}
    return {}


_CURRENT: list[Policy] = []  # (a plain global, which torch.compile reads without tracing into)


def current() -> Policy:
    """The policy of this machine and process, read once."""
    if not _CURRENT:
        if torch.compiler.is_compiling():  # (not kept: see features)
            return policy(features())
        _CURRENT.append(policy(features()))
    return _CURRENT[0]


def reset() -> None:
    """Read the CPU and the environment again on the next ``current()`` (tests)."""
    _FEATURES.clear()
    _CURRENT.clear()

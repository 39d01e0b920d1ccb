"""Lower-precision inference: int8 linear layers on the CPU.

bfloat16 needs nothing here: ``model.to(torch.bfloat16)`` (or ``from_pretrained(dir,
dtype=torch.bfloat16)``) for inference, ``torch.autocast(device, torch.bfloat16)`` for training.
Where the CPU has no bfloat16 instructions the products of a bfloat16 model are computed in
float32 (cpu.py, products.py), and ``bf16_supported`` says why bfloat16 is not native.
``torch.compile(model)`` works on every kernel; ``tests/test_precision.py`` holds it to the
eager results.

int8 (``quantize_int8``) replaces the linear layers by ``Int8Linear``:

    y = s_x * (q(x) Q(W)^T) * s_w + b

* weights: int8, one scale per output row (per channel), s_w = max|W_row| / 127;
* activations: one scale per token (row of x), s_x = max|x_row| / L, taken on every call, and
  rounded to the integers -L..L: L = 127 (8 bits), or 63 (7 bits) on CPUs without VNNI, whose
  u8 kernels would overflow 16-bit sums at 8 (cpu.py). A token's result depends on that token
  alone: never on the padding or on the other sequences in the batch. For onednn-s8 in eager
  mode (on torch._int_mm), where bertlab's AVX2 kernels load, the product is three calls
  (``s8_product``): the rounding in one pass of C (avx2.quantize) rather than seven PyTorch
  operations, the same numbers bit for bit; oneDNN's sums; the scales, the bias and the
  product's epilogue (residual, layer norm) in one more pass (avx2.dequantize; measured in
  docs/performance.md, the Zen 4 EPYC's int8);
* the product: summed exactly in int32 by the CPU's int8 kernel (cpu.py chooses it: oneDNN's
  s8 x s8 kernels on VNNI or AMX, or fbgemm's, oneDNN's or bertlab's own (u8-avx2, and u8-vnni
  with VNNI: avx2.py) u8 x s8 kernels from AVX2 up), on the weight prepacked once into the
  kernel's layout where cpu.py says so, then scaled back to float32 with the bias added.

Everything else stays in float32: the embeddings, every LayerNorm, the attention scores, softmax
and the attention-weighted sum of values, the activations and the residual sums.

Calibration (``calibrate=``, batches of real inputs) does two things:

* **smoothing.** A BERT's LayerNorm outputs carry a few channels tens of times larger than the
  rest; a per-token scale sized for them rounds every other channel coarsely. With the maximum
  of each input channel a_j seen in calibration and the largest weight w_j of that column, the
  layer computes (x / s)(W s)^T, which equals x W^T, with s_j = sqrt(a_j / w_j): the large
  channels are scaled down in the activation and up in the weight before both are rounded
  (SmoothQuant's migration; s_j = a_j^alpha / w_j^(1 - alpha) in general). s is fixed at
  calibration, so a token's result still depends on that token alone. Layers that read the same
  input (the three attention projections) share one s, so they still run as one product. Each
  group takes the strength of ``SMOOTHING`` with the lowest int8 error on the calibration
  batches, or none where none lowers it;
* **tolerance.** Each layer's int8 error on those inputs (with this CPU's kernel) is measured,
  and layers past ``tolerance`` stay float32. ``model.int8_report`` lists what was smoothed,
  what was kept and why, and the kernel.
"""

from __future__ import annotations

import copy
import re
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from bertlab.nn import avx2, cpu
from bertlab.nn.packing import tracing

HIGHER_PRECISION = (
    "embeddings (word, position, segment) and their sum",
    "every LayerNorm",
    "attention scores, softmax and the weighted sum of values",
    "activations (GELU) and residual sums",
)


def bf16_supported() -> str | None:
    """None when this CPU runs bfloat16 products natively (oneDNN: AVX512-BF16 or AMX; BF16 on
    Arm), else why not. Where not, a bfloat16 model still runs, its products in float32."""
    return cpu.current().bf16_why


def int8_supported() -> str | None:
    """None when this machine has an int8 kernel for bertlab's products (``int8_kernel()``
    names it), else why not: the instruction set, operator or architecture it lacks."""
    try:
        int8_kernel()
    except RuntimeError as e:
        return str(e).removeprefix("int8 products cannot run here: ")
    return None


_KERNEL: list[tuple[cpu.Policy, str]] = []  # (the policy, the kernel products run on under it)


def int8_kernel() -> str:
    """The kernel int8 products run on in this process: the policy's (``cpu.current()``), but
    where that is bertlab's own u8-avx2 and its library cannot be built or loaded here (no C
    compiler, avx2.py), the policy's fallback kernel, with a warning once. RuntimeError,
    saying why, where no kernel runs (u8-avx2 forced and not built, or none for this CPU)."""
    policy = cpu.current()
    if _KERNEL and _KERNEL[0][0] is policy:
        return _KERNEL[0][1]
    kernel = policy.int8_kernel
    if kernel is None:
        raise RuntimeError(f"int8 products cannot run here: {policy.int8_why}")
    if kernel in cpu.OWN_INT8 and (why := avx2.load()) is not None:
        if policy.int8_fallback is None:
            raise RuntimeError(f"int8 products cannot run here: the {kernel} kernel: {why}")
        warnings.warn(
            f"int8 products run on {policy.int8_fallback}, not on bertlab's {kernel} kernel: "
            f"{why} (bertlab.nn.precision)",
            stacklevel=3,
        )
        kernel = policy.int8_fallback
    _KERNEL[:] = [(policy, kernel)]
    return kernel


def _quantize_rows(
    t: torch.Tensor, own: bool = False, levels: int = 127
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, K) float -> int8 (R, K) and the scale of each row (R, 1): symmetric, max|row| ->
    ``levels``. own: t is a temporary of the caller's, divided in place."""
    scale = _row_scales(t, levels)
    return (t.div_(scale) if own else t.div(scale)).round_().to(torch.int8), scale


def _row_scales(t: torch.Tensor, levels: int) -> torch.Tensor:
    """(R, K) -> (R, 1): max|row| / levels, at least the smallest normal float."""
    scale = t.abs().amax(-1, keepdim=True).div_(levels)  # (much faster than vector_norm(inf))
    return scale.clamp_(min=torch.finfo(torch.float32).tiny)


class Int8Weight(NamedTuple):
    """An int8 weight as the product reads it: (in, out) int8, one scale per column, the
    inverse smoothing 1/s (in,) that x is multiplied by before it is rounded (or None), and the
    weight in the form the kernel reads (None where the product computes on ``int8`` itself:
    in a traced graph, and on torch._int_mm for onednn-s8 where cpu.py prepacks nothing). The
    (in, out) matrix is the transposed view of an (out, in) one, as ``torch._int_mm`` reads
    it."""

    int8: torch.Tensor  # (in, out), a view of (out, in) memory
    scale: torch.Tensor  # (out,) float32
    unsmooth: torch.Tensor | None = None  # (in,) float32
    packed: Any = None  # the kernel's prepacked weight, or None
    kernel: str = "onednn-s8"  # cpu.INT8_KERNELS
    levels: int = 127  # activations are rounded to -levels..levels


S8_FEW_ROWS = 32  # onednn-s8 where cpu.py prepacks (AMX): products of at most this many rows
# (a short sentence) take torch._int_mm on the plain int8 weight, larger ones oneDNN's linear
# kernel on the prepacked weight. The same sums either way. The whole model took 0.78-0.83x the
# time on sorted batches of 32 sentences; one sentence at a time, the prepacked kernel taking
# every product took 1.02-1.07x (docs/performance.md)


def int8_product(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """(..., in) float -> (..., out) float32: s_x * (q(x / s) W_int8) * s_w + b, one scale per
    row of x (per token), on ``weight.kernel``. Traced (torch.compile, export), the u8 kernels'
    product is written as a float32 one on the rounded values, whose sums are exact up to
    2**24 (1,040 inputs at 8 bits, 2,080 at 7): the traced graph gets the same numbers."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).float()
    out = weight.int8.shape[1]
    if flat.shape[0] == 0:
        return flat.new_zeros(*shape[:-1], out)
    if weight.kernel in cpu.OWN_INT8 and weight.packed is not None:  # rounds, sums, scales itself
        return avx2.qproduct(flat, weight.packed).view(*shape[:-1], out)  # (its bias is packed)
    smoothed = weight.unsmooth is not None
    if s8_in_one_pass(weight, flat.shape[0]):
        return s8_product(flat, weight, bias).view(*shape[:-1], out)
    if weight.kernel == "onednn-s8":
        if _rounds_in_c():  # (prepacked, on more rows: the rounding in one pass all the same)
            q, scale = avx2.quantize(flat, weight.unsmooth, weight.levels)
        else:
            t = flat * weight.unsmooth if smoothed else flat
            q, scale = _quantize_rows(t, own=smoothed, levels=weight.levels)
        if weight.packed is not None and flat.shape[0] > S8_FEW_ROWS:
            # oneDNN's kernel on the prepacked weight, the sums times s_w as it writes them
            packed, zeros = weight.packed
            acc = _QLINEAR(q, 1.0, 0, packed, weight.scale, zeros, None, 1.0, 0, torch.float32,
                           "none", [], "")  # fmt: skip
        else:  # traced (the product inductor fuses), or few rows, where this was the faster
            acc = torch.mul(torch._int_mm(q, weight.int8), weight.scale)
    else:
        t = flat * weight.unsmooth if smoothed else flat
        scale = _row_scales(t, weight.levels)
        t = t.div_(scale) if smoothed else t.div(scale)  # -levels..levels, not yet rounded
        zero = weight.levels + 1  # the u8 zero point: the values sit in 1..2 * levels + 1
        if weight.packed is None:  # traced
            acc = torch.mul(t.round_() @ weight.int8.float(), weight.scale)
        elif weight.kernel == "fbgemm-u8":  # it rounds, shifts and clamps t itself
            acc = _FBGEMM(t, 1.0, zero, weight.packed)  # (the sums times s_w)
        else:
            u = t.round_().add_(zero).to(torch.uint8)
            packed, zeros = weight.packed
            acc = _QLINEAR(u, 1.0, zero, packed, weight.scale, zeros, None, 1.0, 0, torch.float32,
                           "none", [], "")  # fmt: skip
    y = acc.mul_(scale) if bias is None else torch.addcmul(bias, acc, scale)
    return y.view(*shape[:-1], out)


def s8_in_one_pass(weight: Int8Weight, rows: int) -> bool:
    """onednn-s8's product of ``rows`` rows runs as ``s8_product``: eager, on torch._int_mm
    (not the prepacked kernel), where bertlab's AVX2 kernels load."""
    return (
        weight.kernel == "onednn-s8"
        and (weight.packed is None or rows <= S8_FEW_ROWS)
        and _rounds_in_c()
    )


def _rounds_in_c() -> bool:
    """avx2.quantize can round here: eager (not traced), bertlab's AVX2 kernels loaded."""
    return not tracing() and avx2.load() is None


def s8_product(
    flat: torch.Tensor,
    weight: Int8Weight,
    bias: torch.Tensor | None,
    add: torch.Tensor | None = None,
    norm: avx2.Norm | None = None,
) -> torch.Tensor:
    """(R, in) float32 -> (R, out): onednn-s8's product in three calls, the rounding in one
    pass of C (avx2.quantize), oneDNN's int32 sums (torch._int_mm), then the scales, the bias
    and the epilogue (``add``, the layer norm ``norm``) in one more (avx2.dequantize)."""
    q, scale = avx2.quantize(flat, weight.unsmooth, weight.levels)
    acc = torch._int_mm(q, weight.int8)
    return avx2.dequantize(acc, scale, weight.scale, bias, add, norm)


def _op(namespace: str, name: str) -> Any:
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):  # pragma: no cover - cpu.py does not choose it then
        return None


_FBGEMM = _op("quantized", "linear_with_input_q_dq_qweight_dq_output_fp32")
_QLINEAR = _op("onednn", "qlinear_pointwise")


def _pack(
    kernel: str,
    int8: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    levels: int,
    unsmooth: torch.Tensor | None,
) -> Any:
    """The kernel's own form of the (out, in) int8 weight with its (out,) scales: bertlab's
    panels with the zero point's corrections and the layer's scales, bias and smoothing
    (u8-avx2 or u8-vnni, for activations of ``levels``), fbgemm's prepacked weight, or
    oneDNN's (for its s8 and u8 kernels alike) with zero points."""
    out = int8.shape[0]
    if kernel in cpu.OWN_INT8:
        return avx2.pack_int8(int8, scale, bias, levels, unsmooth, vnni=kernel == "u8-vnni")
    if kernel == "fbgemm-u8":
        import warnings

        with warnings.catch_warnings():  # (quantized tensors: fbgemm's weight format)
            warnings.simplefilter("ignore", UserWarning)
            q = torch._make_per_channel_quantized_tensor(
                int8, scale.double(), torch.zeros(out, dtype=torch.long), 0
            )
            return torch.ops.quantized.linear_prepack(q, None)
    return torch.ops.onednn.qlinear_prepack(int8, None), torch.zeros(out, dtype=torch.long)


# kernel -> first layer of a group -> (the group's layer ids, stamp, sources, Int8Weight, bias):
# one table a kernel, so a model timed on several kernels in turn (bertlab
# bench kernels) keeps each kernel's packed weights. Weakly keyed, as products.py's packed float
# weights: nothing here is a buffer or in a state dict, and a layer that is dropped takes its
# packed weights with it.
_PACKED: dict[str, weakref.WeakKeyDictionary[nn.Module, tuple]] = {
    kernel: weakref.WeakKeyDictionary() for kernel in cpu.INT8_KERNELS
}


def int8_weight(layers: tuple[Int8Linear, ...]) -> tuple[Int8Weight, torch.Tensor | None]:
    """The int8 product's (weight, bias) for one layer or several that share their smoothing
    (stacked by rows), in the form this CPU's kernel reads: made once and cached, made again
    when a buffer is replaced or written in place (inference tensors, which keep no version,
    are made on every call). RuntimeError, with the reason, where this machine has no int8
    kernel."""
    kernel = int8_kernel()
    first = layers[0]
    traced = tracing()
    stamp = None
    ids = tuple(map(id, layers))
    if not traced:  # (a traced graph's tensors have no memory to stamp)
        try:
            stamp = _stamp(layers)
        except RuntimeError:  # inference tensors keep no version counter
            pass
        cached = None if stamp is None else _PACKED[kernel].get(first)
        if cached is not None and cached[:2] == (ids, stamp):
            return cached[3], cached[4]  # (first: what every product after the first finds)
    policy = cpu.current()
    # a program bertlab compiles calls its own kernel as an operator, on panels packed in the graph
    # (constants there, folded as it compiles)
    operator = traced and kernel in cpu.OWN_INT8 and avx2.traced_as_operators()
    # torch._int_mm computes on the int8 weight itself: in another traced graph, and for
    # onednn-s8 where the policy prepacks nothing (cpu.py)
    unpacked = (traced and not operator) or (kernel == "onednn-s8" and not policy.int8_prepacked)
    if len(layers) == 1 and unpacked:  # nothing to stack or pack
        w = Int8Weight(first.weight_int8.t(), first.weight_scale, first.unsmooth, None, kernel,
                       policy.int8_levels)  # fmt: skip
        return w, first.bias
    int8 = first.weight_int8 if len(layers) == 1 else torch.cat([m.weight_int8 for m in layers])
    scale = first.weight_scale if len(layers) == 1 else torch.cat([m.weight_scale for m in layers])
    # (and onednn-s8's weights that keep no version, which would be packed on every call)
    unpacked = unpacked or (kernel == "onednn-s8" and stamp is None)
    bias = first.bias if len(layers) == 1 else _stacked_bias(layers)
    packed = None if unpacked else _pack(kernel, int8, scale, bias, policy.int8_levels,
                                         first.unsmooth)  # fmt: skip
    w = Int8Weight(int8.t(), scale, first.unsmooth, packed, kernel, policy.int8_levels)
    if not traced and stamp is not None:
        sources = [m._buffers[name] for m in layers for name in _STAMPED]
        _PACKED[kernel][first] = (ids, stamp, sources, w, bias)
    return w, bias


_STAMPED = ("weight_int8", "weight_scale", "bias", "unsmooth")  # the buffers a packed weight reads


def _stamp(layers: tuple[Int8Linear, ...]) -> tuple[int, ...] | None:
    """Where each buffer of the layers is and how often it was written in place (RuntimeError
    for an inference tensor, which keeps no version counter). Read from ``_buffers`` directly:
    this runs at every product, and nn.Module's attribute lookup costs more."""
    stamp: list[int] = []
    for layer in layers:
        buffers = layer._buffers
        for name in _STAMPED:
            t = buffers[name]
            if t is not None:
                stamp += (t.data_ptr(), t._version)
    return tuple(stamp)


def _stacked_bias(layers: tuple[Int8Linear, ...]) -> torch.Tensor | None:
    if all(m.bias is None for m in layers):
        return None
    parts = [torch.zeros(m.out_features) if m.bias is None else m.bias for m in layers]
    return torch.cat(parts)


class Int8Linear(nn.Module):
    """A linear layer computed in int8: per-channel weights, per-token activations (see the
    module docstring). x (..., in) float -> (..., out) float32. ``smooth`` (in,): the layer
    computes (x / s)(W s)^T, equal to x W^T before rounding."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().float()
        if smooth is not None:
            if smooth.shape != (self.in_features,) or not bool((smooth > 0).all()):
                raise ValueError(
                    f"smooth must be {self.in_features} positive factors, one per input "
                    f"channel; got shape {tuple(smooth.shape)}"
                )
            w = w * smooth.float()
        weight, scale = _quantize_rows(w)
        self.register_buffer("weight_int8", weight)  # (out, in), as nn.Linear keeps it
        self.register_buffer("weight_scale", scale.squeeze(1))  # (out,)
        unsmooth = None if smooth is None else smooth.float().reciprocal()
        self.register_buffer("unsmooth", unsmooth)
        # quantize_int8 names the group of layers whose one smoothing this layer shares (the
        # first layer's name): a traced graph, which cannot compare values, runs a group as one
        # product. None for a layer built on its own.
        self.smoothing_group: str | None = None
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise ValueError(f"int8 layers run on the CPU; the input is on {x.device}")
        return int8_product(x, *int8_weight((self,)))

    def extra_repr(self) -> str:
        smoothed = ", smoothed" if self.unsmooth is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{smoothed}"


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


CALIBRATION = 128  # texts: how many a calibration pass reads by default


def text_batches(
    tokenizer: Any, texts: list[str], batch_size: int = 32, max_length: int = 512
) -> list[dict[str, torch.Tensor]]:
    """Texts as calibration batches for ``quantize_int8(calibrate=...)``: padded, truncated to
    ``max_length`` tokens, ``batch_size`` texts each."""
    return [
        dict(
            tokenizer(
                texts[i : i + batch_size],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
        )
        for i in range(0, len(texts), batch_size)
    ]


SMOOTHING = (0.3, 0.4, 0.5, 0.6, 0.7)  # the strengths alpha tried for each group of layers


def _run(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], hook: Callable[..., None]
) -> None:
    """The float model on ``batches``, ``hook(name, x, out)`` called after each linear layer
    with its input and output."""
    handles = [
        lin.register_forward_hook(lambda m, args, out, name=name: hook(name, args[0], out))
        for name, lin in _linears(model).items()
    ]
    try:
        with torch.inference_mode():
            for b in batches:
                model(**b)
    finally:
        for h in handles:
            h.remove()


def input_maxima(
    model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]
) -> tuple[dict[str, torch.Tensor], list[list[str]]]:
    """Each linear layer's largest input per channel, max |x_j| (in,), over ``batches``, and the
    groups of layers that read one and the same input tensor (a layer's query, key and value)."""
    maxima: dict[str, torch.Tensor] = {}
    groups: list[list[str]] = []
    last: list[Any] = [None]  # the input the newest group read (held, so its memory is not reused)

    def hook(name: str, x: torch.Tensor, out: torch.Tensor) -> None:
        top = x.detach().reshape(-1, x.shape[-1]).abs().amax(0).float()
        if name in maxima:  # seen before: its group is known
            maxima[name] = torch.maximum(maxima[name], top)
            return
        maxima[name] = top
        if last[0] is x:
            groups[-1].append(name)
        else:
            groups.append([name])
            last[0] = x

    _run(model, batches, hook)
    return maxima, groups


def smoothing(
    model: nn.Module, maxima: dict[str, torch.Tensor], groups: list[list[str]], alpha: float
) -> dict[str, torch.Tensor]:
    """s (in,) for each layer: a_j^alpha / w_j^(1 - alpha), with a_j its input's largest value in
    channel j and w_j the largest weight in column j over its group (one s per group)."""
    linears = _linears(model)
    factors = {}
    for group in groups:
        a = maxima[group[0]].clamp(min=1e-5)
        w = torch.stack([linears[n].weight.detach().float().abs().amax(0) for n in group])
        s = (a**alpha / w.amax(0).clamp(min=1e-5) ** (1 - alpha)).clamp(1e-5, 1e5)
        factors.update({n: s for n in group})
    return factors


def layer_errors(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    smooth: dict[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """Each linear layer's int8 error on real inputs: ||int8(x) - float(x)|| / ||float(x)||
    over the inputs the float32 model gives it on ``batches`` (dicts of model inputs), with the
    layer smoothed by ``smooth[name]`` where given."""
    sums: dict[str, list[float]] = {}
    probes = {
        n: Int8Linear(lin, None if smooth is None else smooth.get(n))
        for n, lin in _linears(model).items()
    }

    def hook(name: str, x: torch.Tensor, out: torch.Tensor) -> None:
        got = probes[name](x)
        s = sums.setdefault(name, [0.0, 0.0])
        s[0] += float((got - out.float()).pow(2).sum())
        s[1] += float(out.float().pow(2).sum())

    _run(model, batches, hook)
    return {n: (e / max(r, 1e-30)) ** 0.5 for n, (e, r) in sums.items()}


def _kernel_note() -> str:
    """The int8 kernel of this machine and its activations' width, for ``int8_report``."""
    policy = cpu.current()
    bits = 8 if policy.int8_levels == 127 else 7
    return f"{int8_kernel()} ({bits}-bit activations; CPU class {policy.cpu_class})"


def quantize_int8(
    model: nn.Module,
    calibrate: Iterable[dict[str, torch.Tensor]] | None = None,
    tolerance: float = 0.05,
    keep: Iterable[str] = (),
    smoothing_strength: float | Iterable[float] | None = SMOOTHING,
) -> nn.Module:
    """A copy of ``model`` (float32, eval) whose linear layers run in int8 (``Int8Linear``); the
    original is untouched.

    calibrate: batches (dicts of model inputs) on which each layer's input channels are measured
        for smoothing and its int8 error is measured (``layer_errors``); layers whose relative
        error passes ``tolerance`` stay float32.
    keep: names or regular expressions of layers to keep in float32 regardless.
    smoothing_strength: the strength alpha of the smoothing (module docstring), in (0, 1), or
        several: each group of layers takes the one (or none) with the lowest int8 error on the
        calibration batches. None: no smoothing. Needs ``calibrate``.

    The copy's ``int8_report`` says which layers run in int8, which were smoothed, which were
    kept and why, and what always stays in higher precision. Refused, by name, where this
    machine cannot run the int8 kernels or the model is not on the CPU."""
    first = next(model.parameters(), None)
    if first is not None and first.device.type != "cpu":
        raise ValueError(
            f"int8 inference runs on the CPU: the model is on {first.device}; move it first"
        )
    if not 0 < tolerance:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    if smoothing_strength is None:
        strengths: tuple[float, ...] = ()
    elif isinstance(smoothing_strength, (int, float)):
        strengths = (float(smoothing_strength),)
    else:
        strengths = tuple(float(a) for a in smoothing_strength)
    for alpha in strengths:
        if not 0 < alpha < 1:
            raise ValueError(f"smoothing_strength must be in (0, 1), got {alpha}")
    if calibrate is None and smoothing_strength is not None and smoothing_strength is not SMOOTHING:
        raise ValueError(
            f"smoothing_strength={smoothing_strength} needs calibrate= batches: the smoothing is "
            "measured on them"
        )
    why = int8_supported()  # (after the arguments: those are wrong on every machine)
    if why is not None:
        raise RuntimeError(f"int8 inference is not available: {why}")
    patterns = [re.compile(k) for k in keep]
    q = copy.deepcopy(model).float().eval()
    errors: dict[str, float] = {}
    factors: dict[str, torch.Tensor] = {}
    strength: dict[str, float] = {}
    groups: list[list[str]] = []  # layers that read one input
    if calibrate is not None:
        batches = list(calibrate)
        errors = layer_errors(q, batches)
        if strengths:
            maxima, groups = input_maxima(q, batches)
            for alpha in strengths:
                candidate = smoothing(q, maxima, groups, alpha)
                smoothed = layer_errors(q, batches, candidate)
                for group in groups:  # smoothed where it lowers the group's error the most
                    if sum(smoothed[n] ** 2 for n in group) < sum(errors[n] ** 2 for n in group):
                        factors.update({n: candidate[n] for n in group})
                        errors.update({n: smoothed[n] for n in group})
                        strength.update({n: alpha for n in group})
    kept: dict[str, str] = {}
    quantized = []
    group_of = {n: group[0] for group in groups for n in group}  # layer -> its group's first
    for name, lin in _linears(q).items():
        if any(p.fullmatch(name) for p in patterns):
            kept[name] = "asked (keep=)"
        elif errors.get(name, 0.0) > tolerance:
            kept[name] = f"int8 error {errors[name]:.3f} > tolerance {tolerance}"
        else:
            layer = Int8Linear(lin, factors.get(name))
            if name in factors:  # a group is smoothed as one (by the same s) or not at all
                layer.smoothing_group = group_of[name]
            _set(q, name, layer)
            quantized.append(name)
    report: dict[str, Any] = {
        "int8": quantized,
        "smoothed": {n: strength[n] for n in quantized if n in factors},  # name -> alpha
        "kept_float32": kept,
        "errors": {n: round(e, 5) for n, e in errors.items()},
        "always_float32": list(HIGHER_PRECISION),
        "scheme": "weights per output channel, activations per token, symmetric, int32 sums",
        "kernel": _kernel_note(),
    }
    q.int8_report = report
    return q

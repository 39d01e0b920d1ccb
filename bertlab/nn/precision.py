"""Lower-precision inference: int8 linear layers on the CPU.

bfloat16 needs nothing here: ``model.to(torch.bfloat16)`` (or ``from_pretrained(dir,
dtype=torch.bfloat16)``) for inference, ``torch.autocast(device, torch.bfloat16)`` for training.
``torch.compile(model)`` works on every kernel; ``tests/test_precision.py`` holds it to the
eager results.

int8 (``quantize_int8``) replaces the linear layers by ``Int8Linear``:

    y = s_x * (q(x) Q(W)^T) * s_w + b

* weights: int8, one scale per output row (per channel), s_w = max|W_row| / 127;
* activations: int8, one scale per token (row of x), s_x = max|x_row| / 127, taken on every
  call. A token's result depends on that token alone: never on the padding or on the other
  sequences in the batch;
* the product: int8 x int8 summed exactly in int32 (``torch._int_mm``: oneDNN's VNNI kernels),
  then scaled back to float32 with the bias added.

Everything else stays in float32: the embeddings, every LayerNorm, the attention scores, softmax
and the attention-weighted sum of values, the activations and the residual sums. A calibration
pass (``calibrate=``) measures each linear layer's int8 error on real inputs and keeps the
layers past ``tolerance`` in float32; ``model.int8_report`` lists what was kept and why.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

HIGHER_PRECISION = (
    "embeddings (word, position, segment) and their sum",
    "every LayerNorm",
    "attention scores, softmax and the weighted sum of values",
    "activations (GELU) and residual sums",
)


def bf16_supported() -> str | None:
    """None when this CPU runs bfloat16 products natively (oneDNN: AVX512-BF16 or AMX), else
    why not."""
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN, which runs bfloat16 products on the CPU"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX) for oneDNN"
    return None


def int8_supported() -> str | None:
    """None when this machine runs the int8 kernels natively, else why not (by name)."""
    if not hasattr(torch, "_int_mm"):
        return f"PyTorch {torch.__version__} has no int8 matrix product (torch._int_mm)"
    vnni = getattr(torch.cpu, "_is_vnni_supported", None)
    if vnni is not None and not vnni():
        return "this CPU has no VNNI instructions (AVX512-VNNI or AVX-VNNI) for int8 products"
    return None


def _quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, K) float -> int8 (R, K) and the scale of each row (R, 1): symmetric, max|row| -> 127."""
    scale = t.abs().amax(-1, keepdim=True).div_(127)  # 5x faster than vector_norm(inf) here
    scale.clamp_(min=torch.finfo(torch.float32).tiny)
    return t.div(scale).round_().to(torch.int8), scale


class Int8Weight(NamedTuple):
    """An int8 weight as the product reads it: (in, out) int8 and one scale per column."""

    int8: torch.Tensor  # (in, out)
    scale: torch.Tensor  # (out,) float32


def int8_product(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """(..., in) float -> (..., out) float32: s_x * (q(x) W_int8) * s_w + b, one scale per row
    of x (per token)."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1]).float()
    out = weight.int8.shape[1]
    if flat.shape[0] == 0:
        return flat.new_zeros(*shape[:-1], out)
    q, scale = _quantize_rows(flat)
    acc = torch._int_mm(q, weight.int8).float().mul_(weight.scale)
    y = acc.mul_(scale) if bias is None else torch.addcmul(bias, acc, scale)
    return y.view(*shape[:-1], out)


class Int8Linear(nn.Module):
    """A linear layer computed in int8: per-channel weights, per-token activations (see the
    module docstring). x (..., in) float -> (..., out) float32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight, scale = _quantize_rows(linear.weight.detach().float())
        # (in, out): the layout the int8 product reads
        self.register_buffer("weight_int8", weight.t().contiguous())
        self.register_buffer("weight_scale", scale.squeeze(1))  # (out,)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise ValueError(f"int8 layers run on the CPU; the input is on {x.device}")
        return int8_product(x, Int8Weight(self.weight_int8, self.weight_scale), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def layer_errors(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Each linear layer's int8 error on real inputs: ||int8(x) - float(x)|| / ||float(x)||
    over the inputs the float32 model gives it on ``batches`` (dicts of model inputs)."""
    sums: dict[str, list[float]] = {}
    handles = []
    for name, lin in _linears(model).items():
        probe = Int8Linear(lin)

        def hook(m: nn.Module, args: tuple, out: torch.Tensor, name=name, probe=probe) -> None:
            got = probe(args[0])
            s = sums.setdefault(name, [0.0, 0.0])
            s[0] += float((got - out.float()).pow(2).sum())
            s[1] += float(out.float().pow(2).sum())

        handles.append(lin.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            for b in batches:
                model(**b)
    finally:
        for h in handles:
            h.remove()
    return {n: (e / max(r, 1e-30)) ** 0.5 for n, (e, r) in sums.items()}


def quantize_int8(
    model: nn.Module,
    calibrate: Iterable[dict[str, torch.Tensor]] | None = None,
    tolerance: float = 0.05,
    keep: Iterable[str] = (),
) -> nn.Module:
    """A copy of ``model`` (float32, eval) whose linear layers run in int8 (``Int8Linear``); the
    original is untouched.

    calibrate: batches (dicts of model inputs) on which each layer's int8 error is measured
        (``layer_errors``); layers whose relative error passes ``tolerance`` stay float32.
    keep: names or regular expressions of layers to keep in float32 regardless.

    The copy's ``int8_report`` says which layers run in int8, which were kept and why, and what
    always stays in higher precision. Refused, by name, where this machine cannot run the int8
    kernels or the model is not on the CPU."""
    why = int8_supported()
    if why is not None:
        raise RuntimeError(f"int8 inference is not available: {why}")
    first = next(model.parameters(), None)
    if first is not None and first.device.type != "cpu":
        raise ValueError(
            f"int8 inference runs on the CPU: the model is on {first.device}; move it first"
        )
    if not 0 < tolerance:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    patterns = [re.compile(k) for k in keep]
    q = copy.deepcopy(model).float().eval()
    errors = layer_errors(q, calibrate) if calibrate is not None else {}
    kept: dict[str, str] = {}
    quantized = []
    for name, lin in _linears(q).items():
        if any(p.fullmatch(name) for p in patterns):
            kept[name] = "asked (keep=)"
        elif errors.get(name, 0.0) > tolerance:
            kept[name] = f"int8 error {errors[name]:.3f} > tolerance {tolerance}"
        else:
            _set(q, name, Int8Linear(lin))
            quantized.append(name)
    report: dict[str, Any] = {
        "int8": quantized,
        "kept_float32": kept,
        "errors": {n: round(e, 5) for n, e in errors.items()},
        "always_float32": list(HIGHER_PRECISION),
        "scheme": "weights per output channel, activations per token, symmetric, int32 sums",
    }
    q.int8_report = report
    return q

"""Fused linear layers for bfloat16 inference on the CPU.

On a CPU with bfloat16 matrix units (AMX, AVX512-BF16) a linear layer's product is so fast that
what follows it dominates: PyTorch writes the bias into the output before the product, then
reads and writes the whole output again for the activation or the residual sum. oneDNN, which
PyTorch ships, can apply the bias, the activation and the residual sum to each tile of the
product while it is still in cache. For bert-base on variable-length text that is about a fifth
of a bfloat16 forward pass (``bertlab bench variable``).

    linear(layer, x)               layer(x)
    linear_act(layer, x, act)      act(layer(x))      act: a key of model.ACTIVATIONS
    linear_add(layer, x, other)    layer(x) + other   (the residual connection)

Each runs the fused oneDNN operator when ``fusable`` says so (a CPU bfloat16 tensor, an
nn.Linear without hooks, no gradient to record, not inside torch.compile, which fuses on its
own) and the plain PyTorch ops otherwise, so results differ only by bfloat16 rounding: the
fused form rounds once, after the activation or sum, where the plain one rounds before it too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

try:  # oneDNN's fused linear (the operator torch.compile uses for the same fusion on CPU)
    _linear_pointwise = torch.ops.mkldnn._linear_pointwise
    _AVAILABLE = bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
except (AttributeError, RuntimeError):  # pragma: no cover - a PyTorch built without oneDNN
    _linear_pointwise = None
    _AVAILABLE = False

# model.ACTIVATIONS names -> oneDNN's (attribute, algorithm)
_ONEDNN_ACT = {
    "gelu": ("gelu", "none"),  # exact, with erf
    "gelu_new": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
}


def shape_cached(x: torch.Tensor) -> bool:
    """True when the products on ``x`` run as oneDNN kernels built and cached per shape (CPU
    bfloat16, no gradient): then a packed batch rounds its token count (packing.round_rows)."""
    return (
        _AVAILABLE
        and x.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and x.requires_grad)
        and not torch.compiler.is_compiling()
    )


def fusable(layer: nn.Module, x: torch.Tensor) -> bool:
    """True when ``layer(x)`` may run as one fused oneDNN call."""
    return (
        shape_cached(x)
        and isinstance(layer, nn.Linear)
        and layer.weight.dtype == torch.bfloat16
        and not (torch.is_grad_enabled() and layer.weight.requires_grad)
        and not _hooked(layer)
    )


def _hooked(layer: nn.Module) -> bool:
    """A hook on the layer (or on every module) must see the call, so it runs as a module."""
    m = nn.modules.module
    return bool(
        layer._forward_hooks
        or layer._forward_pre_hooks
        or m._global_forward_hooks
        or m._global_forward_pre_hooks
    )


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """(..., in) -> (..., out): the bias added inside the product."""
    if fusable(layer, x):
        return _linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
    return layer(x)


def linear_act(
    layer: nn.Linear, x: torch.Tensor, act: str, plain: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """(..., in) -> (..., out): ``act(layer(x))``; ``plain`` is the activation to apply when the
    call cannot be fused (or oneDNN lacks ``act``)."""
    if act in _ONEDNN_ACT and fusable(layer, x):
        name, algorithm = _ONEDNN_ACT[act]
        return _linear_pointwise(x, layer.weight, layer.bias, name, [], algorithm)
    return plain(layer(x))


def linear_add(layer: nn.Linear, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """(..., in), (..., out) -> (..., out): ``layer(x) + other``."""
    same = other.dtype == x.dtype and other.shape == (*x.shape[:-1], layer.out_features)
    if same and fusable(layer, x):
        return _linear_pointwise.binary(x, other.contiguous(), layer.weight, layer.bias, "add")
    return layer(x).add_(other)

"""Linear layers computed by oneDNN for CPU inference, float32 and bfloat16.

PyTorch runs a plain float32 ``nn.Linear`` through its BLAS (MKL). oneDNN, which PyTorch also
ships, does three things better for inference:

* **weights packed once.** oneDNN reorders a weight into the blocked layout its kernels read,
  and ``torch.ops.mkldnn._reorder_linear_weight`` keeps that reordered copy. Cached here per
  layer (``packed``), repacked only when the weight changes (a new tensor, a cast, an
  in-place write that moves the parameter's version counter, or a train()/eval() switch:
  fused optimizers write without moving it). On the project's 2-core AMD EPYC
  this makes the products of a 6-layer, 384-wide encoder (timed alone, six layers of distinct
  weights) 2.0x faster at 26 tokens and 1.3x at 567 tokens in float32 than MKL, and 1.3x and
  1.1x faster in bfloat16 than unpacked oneDNN. The
  packed copy is bit-identical in results to the unpacked oneDNN call, and costs one more copy
  of each linear weight in memory while the model serves.
* **fused epilogues.** The bias, the activation and the residual sum are applied to each tile
  of the product while it is still in cache, instead of reading and writing the whole output
  again (about a fifth of a bfloat16 forward pass of bert-base on variable-length text).
* **the three attention projections as one product** (``qkv``): x [W_Q; W_K; W_V]^T, one
  kernel call and one pass over x instead of three.

    linear(layer, x)               layer(x)
    linear_act(layer, x, act)      act(layer(x))      act: a key of model.ACTIVATIONS
    linear_add(layer, x, other)    layer(x) + other   (the residual connection)
    qkv(attention, x)              cat(query(x), key(x), value(x))

Each runs oneDNN when ``fusable`` says so (a CPU float32 or bfloat16 tensor, an nn.Linear
without hooks, no gradient to record, not inside torch.compile, which fuses on its own) and the
plain PyTorch ops otherwise. In bfloat16 the fused form rounds once, after the activation or
sum, where the plain one rounds before it too; in float32 the two differ by the order of the
sums inside the product (about 1e-6 relative).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bertlab.nn.packing import tracing

try:  # oneDNN's fused linear (the operator torch.compile uses for the same fusion on CPU)
    _linear_pointwise = torch.ops.mkldnn._linear_pointwise
    _reorder = torch.ops.mkldnn._reorder_linear_weight
    _AVAILABLE = bool(torch.backends.mkldnn.is_available())
    _BF16 = _AVAILABLE and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
except (AttributeError, RuntimeError):  # pragma: no cover - a PyTorch built without oneDNN
    _linear_pointwise = _reorder = None
    _AVAILABLE = _BF16 = False

PACK_ROWS = 512  # the row count oneDNN is told to expect when it reorders a weight: of 1, 32,
# 128, 256, 512 and 2048, 512 was fastest both at batch 1 and on sorted batches of 32 sentences

_TORCH_ACT = {  # model.ACTIVATIONS names -> the function, in place (for int8 products)
    "gelu": lambda t: torch.ops.aten.gelu_(t),
    "gelu_new": lambda t: torch.ops.aten.gelu_(t, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda t: torch.nn.functional.silu(t, inplace=True),
}

# model.ACTIVATIONS names -> oneDNN's (attribute, algorithm)
_ONEDNN_ACT = {
    "gelu": ("gelu", "none"),  # exact, with erf
    "gelu_new": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
}


def onednn_dtype(dtype: torch.dtype) -> bool:
    """True when oneDNN computes CPU products in ``dtype`` here (float32 always, bfloat16 where
    the CPU has bfloat16 instructions)."""
    return _AVAILABLE and (dtype == torch.float32 or (dtype == torch.bfloat16 and _BF16))


def shape_cached(x: torch.Tensor) -> bool:
    """True when the products on ``x`` run as oneDNN kernels built and cached per shape (CPU
    float32 or bfloat16, no gradient): then a packed batch rounds its token count
    (packing.round_rows)."""
    return (
        onednn_dtype(x.dtype)
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and x.requires_grad)
        and not torch.compiler.is_compiling()
    )


def fusable(layer: nn.Module, x: torch.Tensor, called: bool = False) -> bool:
    """True when ``layer(x)`` may run as one fused oneDNN call. ``called``: from inside the
    layer's own forward, where its hooks have already been served."""
    return (
        shape_cached(x)
        and isinstance(layer, nn.Linear)
        and layer.weight.dtype == x.dtype
        and not (torch.is_grad_enabled() and layer.weight.requires_grad)
        and (called or not _hooked(layer))
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


# ============================================================================ packed weights
# owner module -> (stamp, the source tensors, the packed groups). Weakly keyed: a module that is
# dropped takes its packed copy with it, and nothing here is a parameter, a buffer or part of a
# state dict, a copy or a pickle. The entry holds its source tensors, so their memory cannot be
# reused by another tensor that would then match the stamp; fast.install drops the entries of a
# model that is moved or cast.
_PACKED: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()

Group = tuple[nn.Linear, ...]  # linear layers whose products run as one (rows stacked)


def packed_groups(owner: nn.Module, groups: tuple[Group, ...]) -> tuple[tuple, ...]:
    """For each group of linear layers, (weight, bias): the weights stacked by rows in oneDNN's
    layout, the biases stacked (None if no layer has one). Made once and cached on ``owner``,
    made again when any weight or bias changes: a new tensor, a cast, or an in-place write
    (its version counter moves). Inference tensors keep no version: theirs are made on every
    call, unpacked (the same kernel's numbers, a little slower)."""
    tensors = [t for group in groups for lin in group for t in _sources(lin)]
    try:
        stamp = tuple((t.data_ptr(), t._version) for t in tensors if t is not None)
    except RuntimeError:  # an inference tensor has no version counter
        return tuple(_stack(group, pack=False) for group in groups)
    cached = _PACKED.get(owner)
    if cached is not None and cached[0] == stamp:
        return cached[2]
    made = tuple(_stack(group, pack=True) for group in groups)
    _PACKED[owner] = (stamp, [t.detach() for t in tensors if t is not None], made)
    return made


def packed(owner: nn.Module, layers: Group) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of ``layers`` stacked by rows and packed (``packed_groups``)."""
    return packed_groups(owner, (layers,))[0]


def forget(model: nn.Module) -> None:
    """Drop the packed weights of every module of ``model`` (it was moved or cast)."""
    for m in model.modules():
        _PACKED.pop(m, None)


def _sources(layer: nn.Module) -> tuple[torch.Tensor | None, ...]:
    """The tensors a layer's packed form is made from (an nn.Linear or a precision.Int8Linear)."""
    if isinstance(layer, nn.Linear):
        return layer.weight, layer.bias
    return layer.weight_int8, layer.weight_scale, layer.unsmooth, layer.bias


def _one_input(layers: Group) -> bool:
    """Layers that can run as one product: all float, or all int8 with the same smoothing (the
    input is divided by it once, before it is rounded): layers quantize_int8 smoothed as one
    group (``smoothing_group``), or equal smoothings compared by value, except while tracing (a
    traced graph cannot depend on values)."""
    from bertlab.nn.precision import Int8Linear

    int8 = {isinstance(lin, Int8Linear) for lin in layers}
    if int8 != {True}:
        return int8 == {False}
    first = layers[0].unsmooth
    if first is None:
        return all(lin.unsmooth is None for lin in layers)
    group = layers[0].smoothing_group
    if group is not None and all(lin.smoothing_group == group for lin in layers):
        return True
    if tracing():
        return False
    return all(lin.unsmooth is not None and torch.equal(lin.unsmooth, first) for lin in layers)


def _stack(layers: Group, pack: bool) -> tuple[Any, torch.Tensor | None]:
    from bertlab.nn.precision import Int8Linear, Int8Weight

    if not _one_input(layers):  # int8 beside float32, or int8 smoothed differently
        return [_stack((lin,), pack) for lin in layers], None  # one product each, side by side
    with torch.no_grad():
        if any(lin.bias is not None for lin in layers):
            bias = torch.cat(
                [
                    lin.bias
                    if lin.bias is not None
                    else torch.zeros(lin.out_features, dtype=_sources(lin)[0].dtype)
                    for lin in layers
                ]
            ).detach()
        else:
            bias = None
        if isinstance(layers[0], Int8Linear):
            weight = torch.cat([lin.weight_int8 for lin in layers]).t()  # (in, out) view
            scale = torch.cat([lin.weight_scale for lin in layers])
            weight = Int8Weight(weight, scale, layers[0].unsmooth)
            return weight, (None if bias is None else bias.float())
        weight = torch.cat([lin.weight for lin in layers]) if len(layers) > 1 else layers[0].weight
        weight = weight.detach()
        return (_reorder(weight, PACK_ROWS) if pack else weight), bias


def product(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: str | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """(..., in) -> (..., out): x W^T + b in one oneDNN call, then ``act`` (a key of
    model.ACTIVATIONS) or ``+ add``, applied inside it. ``weight``, ``bias`` from ``packed``;
    the caller has checked ``fusable``. An int8 weight (precision.Int8Weight) runs the int8
    product, then the activation or the sum; a list (int8 layers beside float32 ones) runs one
    product per layer, side by side."""
    if isinstance(weight, list):
        return torch.cat([product(x, *part) for part in weight], dim=-1)
    if not isinstance(weight, torch.Tensor):
        from bertlab.nn.precision import int8_product

        y = int8_product(x, weight, bias)
        if act is not None:
            return _TORCH_ACT[act](y)
        return y if add is None else y.add_(add)
    if add is not None:
        return _linear_pointwise.binary(x, add.contiguous(), weight, bias, "add")
    if act is None:
        return _linear_pointwise(x, weight, bias, "none", [], "")
    name, algorithm = _ONEDNN_ACT[act]
    return _linear_pointwise(x, weight, bias, name, [], algorithm)


def linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """(..., in) -> (..., out): the bias added inside the product."""
    if fusable(layer, x):
        return product(x, *packed(layer, (layer,)))
    return layer(x)


def linear_act(
    layer: nn.Linear, x: torch.Tensor, act: str, plain: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """(..., in) -> (..., out): ``act(layer(x))``; ``plain`` is the activation to apply when the
    call cannot be fused (or oneDNN lacks ``act``)."""
    if act in _ONEDNN_ACT and fusable(layer, x):
        return product(x, *packed(layer, (layer,)), act=act)
    return plain(layer(x))


def linear_add(layer: nn.Linear, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """(..., in), (..., out) -> (..., out): ``layer(x) + other``."""
    same = other.dtype == x.dtype and other.shape == (*x.shape[:-1], layer.out_features)
    if same and fusable(layer, x):
        return product(x, *packed(layer, (layer,)), add=other)
    return layer(x).add_(other)


def int8_qkv(attention: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """(..., H) -> (..., 3H) while a model is traced: int8 query, key and value projections
    that share their smoothing as one int8 product (the input rounded once, one kernel call),
    or None (other layers, or a hook to serve). Their weights are concatenated in the graph;
    a frozen graph folds that into one constant."""
    from bertlab.nn.precision import Int8Linear

    layers = (attention.query, attention.key, attention.value)
    if not all(type(lin) is Int8Linear for lin in layers) or any(map(_hooked, layers)):
        return None
    if not _one_input(layers):
        return None
    return product(x, *_stack(layers, pack=False))


def qkv(attention: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """(..., H) -> (..., 3H): the query, key and value projections of ``attention`` as one
    product (their rows stacked, packed once), or None when they cannot be fused (then the
    caller runs the three layers). Hooks on the projections are the caller's to serve."""
    layers = (attention.query, attention.key, attention.value)
    if not all(fusable(lin, x, called=True) for lin in layers):  # the caller serves hooks
        return None
    return product(x, *packed(attention, layers))

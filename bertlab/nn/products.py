"""The product of a linear layer: one seam, one policy.

    linear(layer, x, act=None, dropout=None, residual=None, norm=None)
                               norm(residual + dropout(act(layer(x))))
    projections(layers, x)     tuple(l(x) for l in layers)

The forwards of model.py and heads.py call these wherever a linear layer's output meets its
activation, its residual sum or the layer norm after them, and for the query, key and value
projections, which read one input. ``route`` chooses how each call is computed, from the
layer's type, the dtype and device of the input, whether a gradient is recorded or autocast is
on, whether the model is being traced, and the CPU's class (cpu.py: ``cpu.current().products``
maps a dtype to its route):

    "onednn"  a plain ``nn.Linear``, CPU, float32 on x86 from AVX2 up (or bfloat16 where the
              CPU has bfloat16 instructions: AVX512-BF16 or AMX), no gradient recorded, no
              autocast, dropout inactive, no hook on the layer, not traced. oneDNN computes the
              product on the weight packed once into its blocked layout (cached here per
              layer, made again when the weight changes) and applies the bias, the activation
              or the residual sum to each tile while it is in cache; layers that read one
              input run as one product on their stacked weights. A product of at most
              FEW_ROWS rows (a short sentence) reads the whole weight for little arithmetic:
              where the policy says so (``cpu.current().few_rows == "mkl"``: Intel CPUs) MKL's
              packed product computes it instead, on a second packed copy of the weight made
              the first time such a product runs, and the epilogue follows in place. Where
              ``cpu.current().float32_kernel`` is ``"sgemm-avx2"`` (AMD's AVX2 CPUs) or
              ``"sgemm-avx512"`` (Zen 4) every float32 product runs on bertlab's own kernel
              instead (avx2.py; the two differ in their blocks' instructions only), on the
              weight packed in
              its panels, the residual or GELU applied inside it (another activation in place
              after), and the layer norm that follows (``norm=``) inside it too, on each row
              once it is whole: PyTorch's layer norm cost 10-26 us a call on a short sentence.
    "float32" the same layer in bfloat16 on a CPU without bfloat16 instructions, where
              PyTorch's bfloat16 products emulate them several times slower than float32: the
              product is computed in float32 (on oneDNN's packed float32 copy of the weight on
              x86, else on a float32 copy with PyTorch's kernel), the activation and the sum
              too, and the result is rounded to bfloat16 once. The first such call warns.
    "int8"    an ``Int8Linear`` (precision.quantize_int8) without hooks: the int8 product
              (precision.int8_product, on the CPU's int8 kernel), then the activation or the
              sum in place; layers that share their smoothing run as one product (the input
              rounded once). On bertlab's own kernels (u8-avx2, u8-vnni) the GELU, the sum
              and the layer norm run inside them, as on sgemm-avx2; on onednn-s8 in eager
              mode the sum and the layer norm run inside the pass that scales oneDNN's sums
              back (``_s8``).
    "module"  anything else: the layer is called as a module (its hooks run, autograd records
              it, an adapter such as LoRA wrapped around it computes, a compiler or exporter
              traces ``F.linear`` and fuses on its own, autocast picks its dtype), then the
              activation, dropout and sum in PyTorch (the sum into dropout's fresh output
              where dropout ran, as its backward needs only its mask).

A layer norm is called as its module wherever the kernel does not apply it (every route but
sgemm-avx2 and u8-avx2, and there a norm with a hook, a gradient recorded for its parameters, or
a shape or dtype the kernel does not take: ``_inside``).

The routes give the same results up to rounding: in float32 the oneDNN, MKL and sgemm-avx2
products order their sums differently from PyTorch's BLAS and from each other (about 1e-6
relative; so on Intel CPUs a text's float32 numbers can differ at that level between a batch of
at most FEW_ROWS tokens and a larger one); in bfloat16 the fused and the float32 forms round
once, after the activation or the sum, where the module route rounds before it too. On Arm and
other CPUs without oneDNN's x86 kernels, float32 takes the module route: PyTorch's own kernels.
``set_fast_inference(False)`` on a model (``plain``) sends all its layers by the module route,
to reproduce another library's float32 numbers bit for bit.

Also here, for the same batches: ``row_rounding``, the token count of a packed batch rounded up
where oneDNN builds a kernel per matrix shape, and ``in_row_chunks``, the feed-forward network
run in row chunks when its intermediate would be large.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn import avx2, cpu
from bertlab.nn.activations import ACTIVATIONS, activation_of
from bertlab.nn.packing import round_rows, tracing
from bertlab.nn.precision import (
    Int8Linear,
    Int8Weight,
    int8_product,
    int8_weight,
    s8_in_one_pass,
    s8_product,
)

try:  # oneDNN's fused linear (the operator torch.compile uses for the same fusion on CPU)
    _linear_pointwise = torch.ops.mkldnn._linear_pointwise
    _reorder = torch.ops.mkldnn._reorder_linear_weight
except (AttributeError, RuntimeError):  # pragma: no cover - a PyTorch built without oneDNN
    _linear_pointwise = _reorder = None
try:  # MKL's packed float32 product (what torch.compile calls for a linear of fixed row count)
    _mkl_linear = torch.ops.mkl._mkl_linear
    _mkl_pack = torch.ops.mkl._mkl_reorder_linear_weight
except (AttributeError, RuntimeError):  # pragma: no cover - a PyTorch built without MKL
    _mkl_linear = _mkl_pack = None

PACK_ROWS = 512  # the row count oneDNN is told to expect when it reorders a weight: of 1, 32,
# 128, 256, 512 and 2048, 512 was fastest both at batch 1 and on sorted batches of 32 sentences
FEW_ROWS = 128  # float32 products of at most this many rows may take MKL's packed product: the
# model's products took 0.67-0.88x oneDNN's time with it from 8 to 128 rows, 0.99x at 192
# (docs/performance.md)
MKL_PACK_ROWS = 128  # the row count MKL is told to expect when it packs a weight. Its packed
# layout serves any row count (the product is told the actual one: tests/test_products.py checks
# 1 to 200 rows against F.linear), but how fast depends on the count it was packed for: packed
# for 512 rows the products took 1.09x oneDNN's time at 21 rows, packed for 128 0.82x

PLAIN = "plain_product"  # a layer attribute: True sends it by the module route (plain())

_GLOBAL_HOOKS = nn.modules.module  # where nn.Module keeps the hooks registered for every module


def onednn_dtype(dtype: torch.dtype) -> bool:
    """True when oneDNN computes CPU products in ``dtype`` here (float32 on x86 from AVX2 up,
    bfloat16 where the CPU has bfloat16 instructions, or in float32 where not)."""
    way = cpu.current().products.get(dtype)
    return way == "onednn" or (way == "float32" and _onednn_here())


def _recording(x: torch.Tensor, layer: nn.Module) -> bool:
    """Whether autograd records ``layer(x)`` (call under grad mode only)."""
    weight = getattr(layer, "weight", None)
    return x.requires_grad or (weight is not None and weight.requires_grad)


def _watched(module: nn.Module) -> bool:
    """A hook on the module, or on every module, must see the call."""
    g = _GLOBAL_HOOKS
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or g._global_forward_hooks
        or g._global_forward_pre_hooks
    )


def route(layer: nn.Module, x: torch.Tensor, dropout: nn.Module | None = None) -> str:
    """How ``layer(x)`` is computed: "onednn", "float32", "int8" or "module" (the module
    docstring)."""
    if torch.is_grad_enabled() and _recording(x, layer):
        _drop(layer)  # an optimizer may write the weight without a version change
        return "module"
    if (
        not x.is_cpu
        or _watched(layer)
        or (dropout is not None and dropout.training and dropout.p > 0)
        or torch.is_autocast_enabled("cpu")  # autocast chooses the products' dtype itself
    ):
        return "module"
    kind = type(layer)
    if kind is Int8Linear:
        return "int8"
    if (
        kind is nn.Linear
        and (way := cpu.current().products.get(x.dtype)) is not None
        and layer._parameters["weight"].dtype == x.dtype
        and PLAIN not in layer.__dict__
        and (not tracing() or (way == "onednn" and _operator(x.dtype)))
    ):
        return way
    return "module"


def _operator(dtype: torch.dtype) -> bool:
    """While a program that bertlab compiles itself is traced (packing.own_program), float32
    products on sgemm-avx2 stay on it, as the operator ``torch.ops.bertlab.sgemm`` (avx2.ops)
    where it could be built; anything else is traced as the module."""
    return dtype == torch.float32 and _sgemm_here() and avx2.traced_as_operators()


def plain(model: nn.Module, enabled: bool) -> None:
    """Send every linear layer of ``model`` by the module route, and its embeddings through
    their modules (``enabled``), or let the policy choose again
    (BertPreTrainedModel.set_fast_inference)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            if enabled:
                m.__dict__[PLAIN] = True
            else:
                m.__dict__.pop(PLAIN, None)
            forget(m)


# ============================================================================ the seam
def linear(
    layer: nn.Module,
    x: torch.Tensor,
    act: nn.Module | None = None,
    dropout: nn.Module | None = None,
    residual: torch.Tensor | None = None,
    norm: nn.Module | None = None,
) -> torch.Tensor:
    """(..., in) -> (..., out): ``norm(residual + dropout(act(layer(x))))``, each part optional.
    ``act`` is the activation module the network holds (its oneDNN form is found in
    activations.py); ``residual`` (..., out); ``norm`` the layer norm module that follows
    (computed inside bertlab's AVX2 kernels where ``_inside`` says so, else called)."""
    way = route(layer, x, dropout)
    if way == "float32":  # a bfloat16 product without bfloat16 instructions
        _say_float32()
        res = None if residual is None else residual.float()
        y = _product((layer,), x.float(), act, res).to(x.dtype)
    elif way == "onednn":
        return _product((layer,), x, act, residual, norm)
    elif way == "int8":
        weight, bias = int8_weight((layer,))
        if weight.kernel in cpu.OWN_INT8 and weight.packed is not None:
            return _qgemm(x, weight.packed, act, residual, norm)
        if s8_in_one_pass(weight, x.numel() // x.shape[-1] if x.shape[-1] else 0):
            n = weight.int8.shape[1]
            return _fused(_s8, (x, weight, bias, n), n, act, residual, norm)
        y = _epilogue(int8_product(x, weight, bias), act, residual)
    else:
        y = layer(x)
        if act is not None:
            y = act(y)
        if dropout is not None:
            y = dropout(y)
        if residual is None:
            pass
        elif dropout is not None and dropout.training and dropout.p > 0 and not _watched(dropout):
            y = y.add_(residual)  # into dropout's fresh output: its backward needs its mask only
        else:
            y = y + residual
    return y if norm is None else norm(y)


def _inside(norm: nn.Module | None, n: int) -> avx2.Norm | None:
    """``norm`` as bertlab's AVX2 kernels apply it to each output row of a product of ``n``
    outputs: a plain nn.LayerNorm over the last dimension with float32 weight and bias, n a
    multiple of 8, no hook on it, no gradient recorded for it. None where it must be called."""
    if norm is None or type(norm) is not nn.LayerNorm:
        return None
    weight, bias = norm._parameters.get("weight"), norm._parameters.get("bias")
    if (
        weight is None
        or bias is None
        or weight.dtype is not torch.float32
        or bias.dtype is not torch.float32
        or norm.normalized_shape != (n,)  # (a tuple: nn.LayerNorm keeps one)
        or n % 8
        or _watched(norm)
        or (torch.is_grad_enabled() and (weight.requires_grad or bias.requires_grad))
    ):
        return None
    return avx2.Norm(weight, bias, norm.eps)


def embeddings(
    module: nn.Module,
    ids: torch.Tensor,
    types: torch.Tensor | None,
    positions: torch.Tensor,
) -> torch.Tensor | None:
    """BertEmbeddings ``module``'s output for token ``ids`` (any shape), their ``types`` (None:
    all 0) and ``positions`` (broadcast to the ids' shape) by bertlab's AVX2 kernel (avx2.embed):
    float32 inference where the policy runs sgemm-avx2 and it loaded, int64 indices, its parts
    plain nn.Embedding and nn.LayerNorm modules (``_inside``) that no hook watches, not sent by
    the module route (``plain``), dropout inactive, nothing traced. None where the module must run
    its own operations."""
    if not _sgemm_here() or tracing() or torch.is_autocast_enabled("cpu"):
        return None
    parts = module._modules
    dropout, tables = parts["dropout"], []
    for name in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
        part = parts[name]
        table = part._parameters["weight"] if type(part) is nn.Embedding else None
        if table is None or table.dtype != torch.float32 or part.max_norm is not None:
            return None
        if _watched(part) or PLAIN in part.__dict__:
            return None
        if table.requires_grad and torch.is_grad_enabled():
            return None
        tables.append(table)
    if (dropout.training and dropout.p > 0) or _watched(dropout) or not ids.is_cpu:
        return None
    if any(t is not None and t.dtype != torch.int64 for t in (ids, types, positions)):
        return None  # (int32 ids, say: the modules take any integer dtype, the kernel int64)
    norm = _inside(parts["LayerNorm"], tables[0].shape[1])
    if norm is None:
        return None
    shape = ids.shape
    if ids.dim() != 1:  # (B, T) -> (B*T,); positions (T,) and types broadcast to it
        ids, positions = ids.reshape(-1), positions.expand(shape).reshape(-1)
        types = None if types is None else types.expand(shape).reshape(-1)
    return avx2.embed(ids, types, positions, *tables, norm).view(*shape, -1)


def _epilogue(
    y: torch.Tensor, act: nn.Module | None, residual: torch.Tensor | None
) -> torch.Tensor:
    """``residual + act(y)`` on a fresh float output of our own: in place."""
    if act is not None:
        spec = activation_of(act)
        y = spec.inplace(y) if spec is not None else act(y)
    return y if residual is None else y.add_(residual)


def _product(
    layers: tuple[nn.Linear, ...],
    x: torch.Tensor,
    act: nn.Module | None = None,
    residual: torch.Tensor | None = None,
    norm: nn.Module | None = None,
) -> torch.Tensor:
    """``norm(residual + act(x W^T + b))`` for the layers' stacked weights, in x's dtype
    (float32 or bfloat16): one oneDNN call with its epilogue where oneDNN runs here, else
    PyTorch's product on the cached copy of the weights, then the epilogue in place. float32
    with at most FEW_ROWS rows: MKL's packed product where the policy says so, then the
    epilogue. On sgemm-avx2 (``_sgemm``) the norm runs inside the kernel where it can."""
    if x.dtype == torch.float32 and _sgemm_here():
        return _sgemm(layers, x, act, residual, norm)
    y = _onednn_product(layers, x, act, residual)
    return y if norm is None else norm(y)


def _onednn_product(
    layers: tuple[nn.Linear, ...],
    x: torch.Tensor,
    act: nn.Module | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """``_product`` where the product is not on sgemm-avx2, without the norm."""
    if (
        x.dtype == torch.float32
        and x.numel() <= FEW_ROWS * x.shape[-1]
        and cpu.current().few_rows == "mkl"
    ):
        return _epilogue(_few_rows(layers, x), act, residual)
    weight, bias = packed(layers, x.dtype)
    if _linear_pointwise is None or not _onednn_here():
        return _epilogue(F.linear(x, weight, bias), act, residual)
    spec = None if act is None else activation_of(act)
    fusable = (act is None or spec is not None) and (
        residual is None or (residual.dtype == x.dtype and residual.is_contiguous())
    )
    if fusable and act is None:
        return _onednn(x, weight, bias, None, residual)
    if fusable and residual is None:
        return _onednn(x, weight, bias, spec.onednn, None)
    return _epilogue(_onednn(x, weight, bias, None, None), act, residual)


def _sgemm(
    layers: tuple[nn.Linear, ...],
    x: torch.Tensor,
    act: nn.Module | None,
    residual: torch.Tensor | None,
    norm: nn.Module | None = None,
) -> torch.Tensor:
    """``norm(residual + act(x W^T + b))`` in float32 by bertlab's AVX2 kernel (avx2.product),
    on the layers' weights packed in its panels, with ``_fused``'s epilogue."""
    weight, bias = packed(layers, torch.float32, kernel="sgemm")
    if weight.dim() != 3:  # an inference tensor's weight, not packed (see packed())
        y = _epilogue(F.linear(x, weight, bias), act, residual)
        return y if norm is None else norm(y)
    n = sum(layer.out_features for layer in layers)
    return _fused(avx2.product, (x, weight, bias, n), n, act, residual, norm)


def _qgemm(
    x: torch.Tensor,
    layer: avx2.Int8Panels,
    act: nn.Module | None,
    residual: torch.Tensor | None,
    norm: nn.Module | None = None,
) -> torch.Tensor:
    """``norm(residual + act(int8 product))`` by bertlab's u8-avx2 or u8-vnni kernel
    (avx2.qproduct), on the layer as precision.py packed it (its bias with it; the activations
    rounded inside the kernel), with ``_fused``'s epilogue."""
    if x.dtype is not torch.float32:
        x = x.float()
    return _fused(avx2.qproduct, (x, layer), layer.corr.shape[0], act, residual, norm)


def _s8(
    x: torch.Tensor,
    weight: Int8Weight,
    bias: torch.Tensor | None,
    n: int,
    add: torch.Tensor | None,
    gelu: bool,
    norm: avx2.Norm | None,
) -> torch.Tensor:
    """onednn-s8's product of ``x`` with ``_fused``'s epilogue inside (precision.s8_product),
    but for GELU, which PyTorch's own kernel applies after (``_fused`` asks for GELU without a
    sum): where oneDNN's s8 kernel runs the CPU has AVX-512, and on the Zen 4 EPYC the pass with
    an AVX2 GELU inside timed slower than PyTorch's operations."""
    flat = x.reshape(-1, x.shape[-1]).float()
    if not gelu:
        plus = None if add is None else add.reshape(-1, n)
        return s8_product(flat, weight, bias, plus, norm).view(*x.shape[:-1], n)
    y = torch.ops.aten.gelu_(s8_product(flat, weight, bias))
    if norm is not None:
        y = F.layer_norm(y, (n,), norm.weight, norm.bias, norm.eps)
    return y.view(*x.shape[:-1], n)


def _fused(
    kernel: Callable[..., torch.Tensor],
    args: tuple,
    n: int,
    act: nn.Module | None,
    residual: torch.Tensor | None,
    norm: nn.Module | None,
) -> torch.Tensor:
    """``norm(residual + act(y))`` for y the product that ``kernel(*args, add, gelu, norm)``
    computes (avx2.product or avx2.qproduct, ``args`` the input x and the layer) of ``n``
    outputs: GELU (with erf) inside it, the residual summed inside it where no activation comes
    first, then the layer norm inside it (``_inside``); another activation in place after, and
    a norm the kernel cannot apply called after."""
    x, inside = args[0], _inside(norm, n)
    if act is None and residual is not None and residual.dtype == torch.float32:
        y = kernel(*args, _addend(residual, (*x.shape[:-1], n)), False, inside)
    elif act is not None and activation_of(act) is ACTIVATIONS["gelu"]:
        if residual is None:
            y = kernel(*args, None, True, inside)
        else:  # (the sum comes after the activation: the norm too)
            y, inside = kernel(*args, None, True, None).add_(residual), None
    else:
        y, inside = kernel(*args, None, False, None), None
        if act is None:  # (at most a residual of another dtype to add)
            y = _epilogue(y, None, residual)
        else:  # PyTorch's activation after the kernel: its vector math on this thread alone
            y = avx2.vector_math_alone(y, _epilogue, act, residual)
    return y if norm is None or inside is not None else norm(y)


def _addend(residual: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The residual as a kernel reads it: contiguous, in the output's shape (broadcast where it
    is smaller; no copy where it already is)."""
    if residual.shape == shape and residual.is_contiguous():
        return residual
    return residual.expand(*shape).contiguous()


_SGEMM: list[tuple[cpu.Policy, bool]] = []  # (the policy, whether the kernel runs under it)


def _sgemm_here() -> bool:
    """The policy's float32 kernel is sgemm-avx2 and it loaded. Decided at the first float32
    product under a policy (a test may set another): where the kernel cannot run, that call
    warns once (products stay on oneDNN) or, where it was forced, raises."""
    policy = cpu.current()
    if _SGEMM and _SGEMM[0][0] is policy:
        return _SGEMM[0][1]
    ok = policy.float32_kernel in cpu.OWN_FLOAT32
    if ok and (why := avx2.load()) is not None:
        if policy.float32_kernel_why.startswith("forced"):
            raise RuntimeError(f"{policy.float32_kernel_why}, but it cannot run here: {why}")
        warnings.warn(
            f"float32 products run on oneDNN, not on bertlab's sgemm-avx2 kernel: {why} "
            "(bertlab.nn.sgemm)",
            stacklevel=5,
        )
        ok = False
    _SGEMM[:] = [(policy, ok)]
    return ok


def _few_rows(layers: tuple[nn.Linear, ...], x: torch.Tensor) -> torch.Tensor:
    """x W^T + b in float32 by MKL's packed product, told the actual row count."""
    weight, bias = packed(layers, torch.float32, kernel="mkl")
    if not weight.is_mkldnn:  # an inference tensor's weight, not packed (see packed())
        return F.linear(x, weight, bias)
    inputs = x.shape[-1]
    stand_in = _stand_in(sum(layer.out_features for layer in layers), inputs)
    return _mkl_linear(x, weight, stand_in, bias, x.numel() // inputs)


@functools.cache
def _stand_in(outputs: int, inputs: int) -> torch.Tensor:
    """What ``_mkl_linear`` gets for the unpacked weight: a view of one zero in its shape. The
    operator reads that weight only at row counts other than the one it is told, and it is told
    the actual count, so no unpacked copy of stacked weights is held. Made once a shape (an
    expand per product cost 3 us in the batch-1 profile)."""
    return _ZERO.expand(outputs, inputs)


_ZERO = torch.zeros(())


def _onednn_here() -> bool:
    """oneDNN computes products on this CPU (its float32 ones take the "onednn" route)."""
    return cpu.current().products.get(torch.float32) == "onednn"


_SAID: list[bool] = []


def _say_float32() -> None:
    """Warn, once a process, that bfloat16 products run in float32 here."""
    if not _SAID:
        _SAID.append(True)
        warnings.warn(
            f"bfloat16 products are computed in float32 here: {cpu.current().bf16_why} "
            "(bertlab.nn.cpu)",
            stacklevel=4,
        )


def projections(layers: tuple[nn.Module, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(..., in) -> one (..., out_i) per layer: ``tuple(layer(x) for layer in layers)``, as one
    product on the layers' stacked weights where they take one route and can share one (the
    attention's query, key and value)."""
    ways = {route(layer, x) for layer in layers}
    if ways == {"onednn"}:
        return _split(_product(layers, x), layers)
    if ways == {"float32"}:
        _say_float32()
        return _split(_product(layers, x.float()).to(x.dtype), layers)
    if ways == {"int8"} and _one_input(layers):
        return _split(int8_product(x, *int8_weight(layers)), layers)
    return tuple(linear(layer, x) for layer in layers)


def _split(y: torch.Tensor, layers: tuple[nn.Module, ...]) -> tuple[torch.Tensor, ...]:
    return y.split([layer.out_features for layer in layers], dim=-1)


def _onednn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    act: tuple[str, str] | None,
    add: torch.Tensor | None,
) -> torch.Tensor:
    """x W^T + b in one oneDNN call, then oneDNN's ``act`` or ``+ add`` inside it."""
    if add is not None:
        return _linear_pointwise.binary(x, add, weight, bias, "add")
    if act is None:
        return _linear_pointwise(x, weight, bias, "none", [], "")
    return _linear_pointwise(x, weight, bias, act[0], [], act[1])


# ============================================================================ packed weights
# kernel -> first layer of a group -> (the group's layer ids, dtype, stamp, the source tensors,
# weight, bias), one dictionary for oneDNN's packed layout and one for MKL's. Weakly keyed: a
# layer that is dropped takes its packed copy with it, and nothing here is a parameter, a buffer
# or part of a state dict, a copy or a pickle. An entry holds its source tensors, so their
# memory cannot be reused by another tensor that would then match the stamp.
_PACKED: dict[str, weakref.WeakKeyDictionary[nn.Module, tuple]] = {
    "onednn": weakref.WeakKeyDictionary(),
    "mkl": weakref.WeakKeyDictionary(),
    "sgemm": weakref.WeakKeyDictionary(),
}


def _stamp(layers: tuple[nn.Linear, ...]) -> tuple[int, ...]:
    """Where each weight and bias is and how often it was written in place (RuntimeError for an
    inference tensor, which keeps no version counter)."""
    stamp: tuple[int, ...] = ()
    for layer in layers:
        p = layer._parameters  # (read directly: nn.Module's attribute lookup costs more here)
        w, b = p["weight"], p["bias"]
        stamp += (
            (w.data_ptr(), w._version)
            if b is None
            else (w.data_ptr(), w._version, b.data_ptr(), b._version)
        )
    return stamp


def packed(
    layers: tuple[nn.Linear, ...], dtype: torch.dtype | None = None, kernel: str = "onednn"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of ``layers`` stacked by rows in ``dtype`` (default: the weights' own),
    the weight in oneDNN's packed layout where oneDNN computes products here (in MKL's, for
    float32, with ``kernel="mkl"``), the biases stacked (None if no layer has one). Made once
    and cached, made again when any weight or bias changes: a new tensor (a cast, a move), or
    an in-place write that moves its version counter (load_state_dict, a plain optimizer step);
    a fused optimizer writes without moving it, and ``route`` drops the packed copies of a
    layer whose gradient is recorded. Inference tensors keep no version: theirs are made on
    every call, unpacked (the same numbers up to rounding, a little slower)."""
    dtype = layers[0].weight.dtype if dtype is None else dtype
    if tracing():  # (for an operator of a compiled program: packed in its graph, not cached)
        return _stack(layers, dtype, kernel)
    try:
        stamp = _stamp(layers)
    except RuntimeError:  # an inference tensor has no version counter
        return _stack(layers, dtype, None)
    ids = tuple(map(id, layers))  # (not the layers: a value must not hold its weak key)
    cache = _PACKED[kernel]
    cached = cache.get(layers[0])
    if cached is not None and cached[2] == stamp and cached[:2] == (ids, dtype):
        return cached[4], cached[5]
    layout = kernel if kernel != "onednn" or (_onednn_here() and _reorder is not None) else None
    weight, bias = _stack(layers, dtype, layout)
    sources = [t.detach() for layer in layers for t in (layer.weight, layer.bias) if t is not None]
    cache[layers[0]] = (ids, dtype, stamp, sources, weight, bias)
    return weight, bias


def forget(module: nn.Module) -> None:
    """Drop the packed weights of every layer in ``module``."""
    for m in module.modules():
        _drop(m)


def _drop(layer: nn.Module) -> None:
    """Drop the packed copies of ``layer``'s weights, in every layout."""
    for cache in _PACKED.values():
        cache.pop(layer, None)


def _stack(
    layers: tuple[nn.Linear, ...], dtype: torch.dtype, layout: str | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layers' weights stacked by rows in ``dtype``, in oneDNN's packed layout ("onednn"),
    MKL's ("mkl") or as they are (None), and their biases stacked."""
    with torch.no_grad():
        weight = layers[0].weight if len(layers) == 1 else torch.cat([lin.weight for lin in layers])
        bias = _biases(layers, dtype)
        weight = weight.detach().to(dtype)
        if layout == "onednn":
            weight = _reorder(weight, PACK_ROWS)
        elif layout == "mkl":
            weight = _mkl_pack(weight.contiguous(), MKL_PACK_ROWS)
        elif layout == "sgemm":
            weight = avx2.pack(weight)
        return weight, bias


def _biases(layers: tuple[nn.Module, ...], dtype: torch.dtype) -> torch.Tensor | None:
    if all(lin.bias is None for lin in layers):
        return None
    if len(layers) == 1:
        return layers[0].bias.detach().to(dtype)
    zeros = [torch.zeros(lin.out_features, dtype=dtype) for lin in layers]
    parts = [z if lin.bias is None else lin.bias for lin, z in zip(layers, zeros, strict=True)]
    return torch.cat(parts).detach().to(dtype)


def _one_input(layers: tuple[Int8Linear, ...]) -> bool:
    """int8 layers that can run as one product: the input is divided by one smoothing before it
    is rounded. Layers quantize_int8 smoothed as one group (``smoothing_group``), or equal
    smoothings compared by value, except while tracing (a traced graph cannot depend on
    values)."""
    group = layers[0].smoothing_group
    if group is not None and all(lin.smoothing_group == group for lin in layers):
        return True
    first = layers[0].unsmooth
    if first is None:
        return all(lin.unsmooth is None for lin in layers)
    if tracing():
        return False
    return all(lin.unsmooth is not None and torch.equal(lin.unsmooth, first) for lin in layers)


# ============================================================================ batch shapes
def row_rounding(weight: torch.Tensor) -> Callable[[int], int] | None:
    """packing.round_rows where a packed batch's products run as oneDNN kernels built and cached
    per matrix shape (CPU float32 or bfloat16 weights, no gradient recorded, not traced, float32
    not on sgemm-avx2), else None. ``weight``: the model's word embeddings."""
    if (
        weight.device.type != "cpu"
        or not onednn_dtype(weight.dtype)
        or torch.is_grad_enabled()
        or tracing()
        or _sgemm_here()  # (float32 products on sgemm-avx2, which builds nothing per shape)
    ):
        return None
    return round_rows


FFN_CHUNK_ABOVE = 32 << 20  # bytes: glibc's largest block served from its heap (64-bit)
FFN_CHUNK_BYTES = 24 << 20  # bytes of intermediate per chunk, at most


def in_row_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, width: int, *watched: nn.Module
) -> torch.Tensor:
    """``fn(x)`` for a row-wise ``fn`` (..., H) -> (..., H) whose intermediate is ``width``
    values a row: in inference, when that intermediate would pass FFN_CHUNK_ABOVE bytes, the
    rows go through in chunks. Each row's arithmetic is its own, so the results are those of
    one call (up to how the math library splits a product). glibc hands out a block that large
    as fresh pages on every call, each costing a fault when first written; chunked, the
    intermediate is reused and peak memory drops. Whole when a gradient is recorded, a hook
    watches one of the ``watched`` modules, or the model is traced."""
    rows = x.numel() // x.size(-1)
    bytes_per_row = width * x.element_size()
    if (
        rows * bytes_per_row <= FFN_CHUNK_ABOVE
        or (torch.is_grad_enabled() and x.requires_grad)
        or tracing()
        or any(_watched(m) for w in watched for m in w.modules())
    ):
        return fn(x)
    chunk = 1 << ((FFN_CHUNK_BYTES // bytes_per_row).bit_length() - 1)  # a power of two
    flat = x.reshape(rows, x.size(-1))
    out = torch.empty_like(flat)
    for s in range(0, rows, chunk):
        out[s : s + chunk] = fn(flat[s : s + chunk])
    return out.view_as(x)

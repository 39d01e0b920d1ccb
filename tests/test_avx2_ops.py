"""bertlab's AVX2 kernels as PyTorch operators (avx2.ops, avx2_ops.cpp): the form in which a
program that bertlab compiles itself (nn/compiled.py) calls them from C++. Each operator gives
its ctypes call's bits (the attention at real tokens); bad arguments are refused by name; the
graph traced for bertlab's own program calls them where the policy's products run on the
kernels, and no other traced graph does (exports for other runtimes keep the plain equation);
and where they cannot be built, Compiled runs the model itself, saying why."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import small_encoder

from bertlab.nn import avx2, cpu, precision, products
from bertlab.nn.compiled import Compiled
from bertlab.nn.packing import aligned_export
from bertlab.nn.precision import quantize_int8


@pytest.fixture(scope="module")
def built():
    """The operators, built (once a machine: seconds) when the first test needs them, not while
    the suite is collected; a test skips, saying why, where they cannot be."""
    why = avx2.ops()
    if why is not None:
        pytest.skip(f"the operators cannot be built: {why}")


needs_ops = pytest.mark.usefixtures("built")


def on_kernels(monkeypatch):
    """The policy of AMD's avx2 class: float32 on sgemm-avx2, int8 on u8-avx2."""
    policy = dataclasses.replace(
        cpu.current(), float32_kernel="sgemm-avx2", few_rows="onednn", int8_kernel="u8-avx2",
        int8_levels=63, float32_kernel_why="test", int8_why="test",
    )  # fmt: skip
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    monkeypatch.setattr(products, "_SGEMM", [])
    monkeypatch.setattr(precision, "_KERNEL", [])


# why u8-vnni (VPDPBUSD) cannot run on this CPU, or None: the policy's own test (cpu.NEEDS)
NO_VNNI = cpu.policy(cpu.features(), {"BERTLAB_INT8_KERNEL": "u8-vnni"}).int8_why


@needs_ops
@pytest.mark.parametrize("shape", [(21, 384), (2, 5, 64), (1, 8)])
@pytest.mark.parametrize(
    ("vnni", "levels"),
    [(False, 63), pytest.param(True, 127, marks=pytest.mark.skipif(
        NO_VNNI is not None, reason=str(NO_VNNI)))],
)  # fmt: skip
def test_each_operator_gives_its_kernels_bits(shape, vnni, levels):
    g = torch.Generator().manual_seed(0)
    k, n = shape[-1], 48
    x = torch.randn(*shape, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    b, add = torch.randn(n, generator=g), torch.randn(*shape[:-1], n, generator=g)
    norm = avx2.Norm(torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g), 1e-12)
    panels = avx2.pack(w)
    layer = avx2.pack_int8(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
                           torch.rand(n, generator=g) / 100, b, levels,
                           torch.rand(k, generator=g) + 0.5, vnni=vnni)  # fmt: skip
    sgemm, qgemm = torch.ops.bertlab.sgemm, torch.ops.bertlab.qgemm
    for plus, gelu, ln in [(None, False, None), (add, False, norm), (None, True, None),
                           (None, True, norm), (add, False, None)]:  # fmt: skip
        lnw, lnb, eps = (None, None, 0.0) if ln is None else ln
        want = avx2.product(x, panels, b, n, plus, gelu, ln)
        assert torch.equal(sgemm(x, panels, b, n, plus, gelu, lnw, lnb, eps), want)
        want = avx2.qproduct(x, layer, plus, gelu, ln)
        got = qgemm(x, layer.panels, layer.corr, layer.scale, layer.bias, layer.unsmooth,
                    layer.levels, layer.vnni, layer.inputs, plus, gelu, lnw, lnb, eps)  # fmt: skip
        assert torch.equal(got, want) and got.shape == (*shape[:-1], n)


@needs_ops
def test_bad_arguments_are_refused_by_name():
    x, w = torch.randn(3, 32), torch.randn(40, 32)
    panels = avx2.pack(w)
    bad = r"bertlab::sgemm: panels \[3, 32, 16\] do not fit "
    with pytest.raises(RuntimeError, match=bad + "16 inputs and 40 outputs"):
        torch.ops.bertlab.sgemm(x[:, :16], panels, None, 40, None, False, None, None, 0.0)
    with pytest.raises(RuntimeError, match=bad + "32 inputs and 64 outputs"):
        torch.ops.bertlab.sgemm(x, panels, None, 64, None, False, None, None, 0.0)
    with pytest.raises(RuntimeError, match=r"bertlab::sgemm: input \[3, 32\] Double does not fit"):
        torch.ops.bertlab.sgemm(x.double(), panels, None, 40, None, False, None, None, 0.0)
    with pytest.raises(RuntimeError, match="bias must be contiguous, of 40 values of Float"):
        torch.ops.bertlab.sgemm(x, panels, torch.zeros(39), 40, None, False, None, None, 0.0)
    layer = avx2.pack_int8(torch.zeros(40, 32, dtype=torch.int8), torch.ones(40), None, 63)
    with pytest.raises(RuntimeError, match="bertlab::qgemm: levels 64 outside 1..63"):
        torch.ops.bertlab.qgemm(x, layer.panels, layer.corr, layer.scale, None, None, 64, False,
                                32, None, False, None, None, 0.0)  # fmt: skip
    with pytest.raises(RuntimeError, match="bertlab::qgemm: levels 128 outside 1..127"):
        torch.ops.bertlab.qgemm(x, layer.panels, layer.corr, layer.scale, None, None, 128, True,
                                32, None, False, None, None, 0.0)  # fmt: skip


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, H) -> (B, A, T, D), as the padded layout splits them (packing.Padded)."""
    B, T, H = t.shape
    return t.view(B, T, heads, H // heads).transpose(1, 2)


@needs_ops
def test_the_attention_operator_gives_the_kernels_bits_at_real_tokens():
    """On views of one (B, T, 3H) projection, as the graph has them: at each row's real tokens
    the operator gives ``avx2.attention``'s bits on the packed real tokens; a mask with real
    tokens after padding, and rows longer than the limit, take PyTorch's attention, which it
    equals at every position; the output is laid out as (B, T, A, D) rows, as its shape form
    (fake) says."""
    g = torch.Generator().manual_seed(0)
    B, T, A, D = 3, 21, 4, 16
    qkv = torch.randn(B, T, 3 * A * D, generator=g)
    q, k, v = (_heads(t, A) for t in qkv.split(A * D, dim=-1))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 13:] = False
    mask[2, 1:] = False  # (a row of one token)
    got = torch.ops.bertlab.attention(q, k, v, mask, 64)
    assert got.shape == (B, A, T, D) and got.transpose(1, 2).is_contiguous()
    real = mask.flatten()
    packed = [t.transpose(1, 2).reshape(B * T, A, D)[real] for t in (q, k, v)]
    lengths = mask.sum(1).tolist()
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    want = avx2.attention(*packed, starts, max(lengths))
    assert torch.equal(got.transpose(1, 2).reshape(B * T, A, D)[real], want)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    keep = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(got[keep], sdpa[keep], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()
    # no mask: every position real
    full = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(torch.ops.bertlab.attention(q, k, v, None, 64), full,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # real tokens after padding, or rows past the limit: PyTorch's attention, every position
    holes = mask.clone()
    holes[1, 5] = False
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=holes[:, None, None, :])
    torch.testing.assert_close(torch.ops.bertlab.attention(q, k, v, holes, 64), want)
    torch.testing.assert_close(torch.ops.bertlab.attention(q, k, v, mask, 16), sdpa)


@needs_ops
def test_the_attention_operator_refuses_bad_arguments_by_name():
    q = torch.randn(2, 4, 8, 16)
    with pytest.raises(RuntimeError, match=r"attention: q \[2, 4, 8, 12\] .* D a multiple"):
        torch.ops.bertlab.attention(q[..., :12], q[..., :12], q[..., :12], None, 64)
    with pytest.raises(RuntimeError, match=r"must be float32 \(B, A, T, D\) of one shape"):
        torch.ops.bertlab.attention(q, q[:1], q, None, 64)
    with pytest.raises(RuntimeError, match=r"bertlab::attention: mask must be bool \(2, 8\)"):
        torch.ops.bertlab.attention(q, q, q, torch.ones(2, 7, dtype=torch.bool), 64)
    with pytest.raises(RuntimeError, match=r"mask must be bool"):
        torch.ops.bertlab.attention(q, q, q, torch.ones(2, 8), 64)


def _operators(program: torch.export.ExportedProgram) -> list[str]:
    return [str(node.target) for node in program.graph.nodes if "bertlab" in str(node.target)]


@needs_ops
def test_bertlabs_own_program_calls_them_and_other_exports_do_not(monkeypatch):
    """Traced for bertlab's own program (inside aligned_export), each layer's four float32
    products are sgemm operators (query, key and value as one), the residual sums, GELU and
    layer norms inside them, and so is the pooler's; the graph run gives the eager model's
    numbers. A plain export (for ONNX and other runtimes) has none. The int8 model's products
    become qgemm operators."""
    on_kernels(monkeypatch)
    model, ids, mask = small_encoder(torch.float32, kernel="sdpa")
    ids, mask = ids[1:], mask[1:]  # (the rows without padding)
    with torch.inference_mode():
        want = model(ids, mask).last_hidden_state
    with aligned_export(), torch.no_grad():  # (as Compiled builds it: no gradient)
        program = torch.export.export(model, (ids, mask))
    assert _operators(program) == ["bertlab.sgemm.default"] * (4 * 3 + 1)
    with torch.inference_mode():
        got = program.module()(ids, mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        assert _operators(torch.export.export(model, (ids, mask))) == []
    q = quantize_int8(model)
    with torch.inference_mode():
        want = q(ids, mask).last_hidden_state
    with aligned_export(), torch.no_grad():
        program = torch.export.export(q, (ids, mask))
    assert _operators(program) == ["bertlab.qgemm.default"] * (4 * 3 + 1)
    with torch.inference_mode():
        got = program.module()(ids, mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # (the same kernel, the same bits)
    with torch.no_grad():
        assert _operators(torch.export.export(q, (ids, mask))) == []


@needs_ops
def test_bertlabs_own_program_runs_the_attention_operator_too(monkeypatch):
    """A packed model traced for bertlab's own program: each layer's attention is the
    attention operator beside its sgemm products (then the pooler's product), and the graph
    gives the eager model's numbers at real tokens, padded rows included. A plain export keeps
    PyTorch's attention."""
    on_kernels(monkeypatch)
    model, ids, mask = small_encoder(torch.float32)
    with torch.inference_mode():
        want = model(ids, mask).last_hidden_state
    with aligned_export(), torch.no_grad():
        program = torch.export.export(model, (ids, mask))
    layer = ["bertlab.sgemm.default", "bertlab.attention.default"] + ["bertlab.sgemm.default"] * 3
    assert _operators(program) == layer * 3 + ["bertlab.sgemm.default"]
    with torch.inference_mode():
        got = program.module()(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        plain = torch.export.export(model, (ids, mask))
    assert "bertlab.attention.default" not in _operators(plain)


def test_without_the_operators_compiled_runs_the_model_saying_why(monkeypatch):
    if (why := avx2.load()) is not None:
        pytest.skip(f"bertlab's AVX2 kernels cannot run here: {why}")
    on_kernels(monkeypatch)
    # the compiled precisions of the avx2 class, whatever this CPU's class compiles
    policy = dataclasses.replace(
        cpu.current(), compiled=frozenset({"float32", "int8"}), not_compiled={"bfloat16": "test"},
        compiled_tokens=dict(cpu.COMPILED_TOKENS_AVX2["avx2"]),
    )  # fmt: skip
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    monkeypatch.setattr(avx2, "_OPS", ["no C++ compiler was found (set CXX, or install one)"])
    monkeypatch.setattr(Compiled, "available", staticmethod(lambda: None))
    model, ids, mask = small_encoder(torch.float32)
    with pytest.warns(UserWarning, match="Compiled runs the float32 model itself: the float32 "
                                         "products run on bertlab's AVX2 kernels"):  # fmt: skip
        fast = Compiled(model)
    assert "no C++ compiler was found" in fast.why_eager
    with torch.inference_mode():
        out = fast(input_ids=ids[1:2, :8]).last_hidden_state
    assert fast.calls == {"compiled": 0, "eager": 1} and out.shape == (1, 8, 64)
    assert F.cosine_similarity(out, model(input_ids=ids[1:2, :8]).last_hidden_state).min() > 0.99

"""The linear-product seam (bertlab/nn/products.py): each route computes the layer's own
function (in bfloat16 rounding once instead of twice), on weights packed once and packed again
whenever a weight changes; the module route runs whenever a gradient is recorded, a hook must
see the call, an adapter wraps the layer or the input is not CPU float32 or bfloat16. Also the
batch shapes beside it: spare rows (packing.round_rows) and the feed-forward network in row
chunks. float32 products of few rows take MKL's packed product where the policy says so, on one
packed copy that serves every row count."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import needs_int8, small_encoder
from torch import nn

from bertlab import BertConfig, BertForMaskedLM, BertModel
from bertlab.nn import avx2, cpu, products
from bertlab.nn.model import BertLayer
from bertlab.nn.packing import round_rows
from bertlab.nn.precision import quantize_int8

# oneDNN computes the products of float32 and bfloat16 layers on x86 CPUs from AVX2 up (bfloat16
# natively with AVX512-BF16 or AMX, else in float32: the "float32" route)
needs_onednn = pytest.mark.skipif(
    not products._onednn_here(),
    reason=f"oneDNN's products do not run on this CPU (class {cpu.current().cpu_class})",
)
needs_mkl = pytest.mark.skipif(
    not (products._onednn_here() and cpu.features().mkl),
    reason="MKL's packed product does not run here: "
    + (cpu.current().few_rows_why or "no oneDNN route"),
)
BF16_STEP = 2**-8  # bfloat16 keeps 8 significant bits: one rounding is off by <= 2**-9 relative
ACTS = [
    (nn.GELU(), F.gelu),
    (nn.ReLU(), F.relu),
    (nn.SiLU(), F.silu),
    (nn.GELU(approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
]


def layer_and_input(n_in=48, n_out=80, shape=(3, 7), seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=g) / n_in**0.5)
        layer.bias.copy_(torch.randn(n_out, generator=g))
    x = torch.randn(*shape, n_in, generator=g)
    return layer.to(dtype).eval(), x.to(dtype)


def exact(layer, x):
    """The layer computed in float32 on the very same bfloat16 numbers: the value to round."""
    return F.linear(x.float(), layer.weight.float(), layer.bias.float())


def within_one_rounding(got, want):
    assert got.dtype == torch.bfloat16
    err = (got.float() - want).abs()
    assert (err <= BF16_STEP * want.abs() + 1e-6).all(), f"off by {err.max():.3g}"


def spy_onednn(monkeypatch):
    calls = []
    real = products._onednn
    monkeypatch.setattr(products, "_onednn", lambda *a: calls.append(a) or real(*a))
    return calls


def spy_mkl(monkeypatch):
    calls = []
    real = products._mkl_linear
    monkeypatch.setattr(products, "_mkl_linear", lambda *a: calls.append(a) or real(*a))
    return calls


def spy_sgemm(monkeypatch):
    calls = []
    real = avx2.product
    monkeypatch.setattr(avx2, "product", lambda *a: calls.append(a) or real(*a))
    return calls


def few_rows_on(monkeypatch, kernel):
    """The policy's kernel for float32 products, for this test: "onednn" (every row count),
    "mkl" (few rows on MKL's, more on oneDNN's) or "sgemm-avx2" (every row count)."""
    policy = cpu.current()
    if kernel == "sgemm-avx2":
        policy = dataclasses.replace(policy, float32_kernel=kernel, few_rows="onednn")
    else:
        policy = dataclasses.replace(policy, float32_kernel="onednn", few_rows=kernel)
    monkeypatch.setattr(cpu, "_CURRENT", [policy])


def spy_kernel(monkeypatch, kernel):
    spy = {"mkl": spy_mkl, "onednn": spy_onednn, "sgemm-avx2": spy_sgemm}[kernel]
    return spy(monkeypatch)


needs_sgemm = pytest.mark.skipif(
    not products._onednn_here() or avx2.load() is not None,
    reason=f"the sgemm-avx2 kernel does not run here: {avx2.load() or 'no oneDNN route'}",
)
FEW_ROWS = [
    "onednn",
    pytest.param("mkl", marks=needs_mkl),
    pytest.param("sgemm-avx2", marks=needs_sgemm),
]


@needs_onednn
def test_each_fused_form_is_the_exact_result_rounded_once(monkeypatch):
    layer, x = layer_and_input()
    other = torch.randn(3, 7, 80).to(torch.bfloat16)
    # (without bfloat16 instructions these run in float32, where few rows may take MKL's product)
    few_rows_on(monkeypatch, "onednn")
    calls = spy_onednn(monkeypatch)
    with torch.inference_mode():
        within_one_rounding(products.linear(layer, x), exact(layer, x))
        got = products.linear(layer, x, residual=other)
        within_one_rounding(got, exact(layer, x) + other.float())
        for act, fn in ACTS:
            within_one_rounding(products.linear(layer, x, act=act), fn(exact(layer, x)))
    assert len(calls) == 2 + len(ACTS)  # each one oneDNN call, the epilogue inside it


@needs_onednn
def test_fused_is_at_least_as_close_as_the_module_route():
    """The module route rounds the product, then rounds again after the sum; the fused one
    rounds once. Over a whole layer its error is no larger."""
    layer, x = layer_and_input(n_in=256, n_out=512, shape=(64,))
    other = torch.randn(64, 512).to(torch.bfloat16)
    want = exact(layer, x) + other.float()
    with torch.inference_mode():
        fused_err = (products.linear(layer, x, residual=other).float() - want).abs().mean()
        plain_err = ((layer(x) + other).float() - want).abs().mean()
    assert fused_err <= plain_err


@needs_onednn
@pytest.mark.parametrize("few_rows", FEW_ROWS)
def test_float32_routes_compute_the_layer_to_float32_rounding(few_rows, monkeypatch):
    """In float32 oneDNN and MKL order the sums of a product differently from PyTorch's BLAS:
    the same function, within float32 tolerance (with the activation and the sum too)."""
    layer, x = layer_and_input(n_in=384, n_out=512, shape=(5, 9), dtype=torch.float32)
    other = torch.randn(5, 9, 512)
    few_rows_on(monkeypatch, few_rows)
    calls = spy_kernel(monkeypatch, few_rows)
    with torch.inference_mode():
        for got, want in [
            (products.linear(layer, x), layer(x)),
            (products.linear(layer, x, residual=other), layer(x) + other),
            (products.linear(layer, x, act=nn.GELU()), F.gelu(layer(x))),
        ]:
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(calls) == 3


def test_the_module_route_runs_for_gradients_other_dtypes_hooks_and_adapters(monkeypatch):
    def refuse(*a):
        raise AssertionError("the fused operator ran")

    monkeypatch.setattr(products, "_onednn", refuse)
    layer, x = layer_and_input(dtype=torch.float32)
    assert products.route(layer, x) == "module"  # gradients recorded: the weight needs one
    out = products.linear(layer, x, act=nn.GELU())
    out.sum().backward()
    assert layer.weight.grad is not None
    layer64, x64 = layer.double(), x.double()  # oneDNN computes float32 and bfloat16 only
    with torch.inference_mode():
        assert products.route(layer64, x64) == "module"
        other = torch.randn(3, 7, 80, dtype=torch.float64)
        assert torch.equal(products.linear(layer64, x64, residual=other), layer64(x64) + other)

    class Adapter(nn.Module):  # what LoRA does: a module around the linear layer
        def __init__(self, base):
            super().__init__()
            self.base, self.calls = base, 0

        def forward(self, x):
            self.calls += 1
            return self.base(x)

    wrapped = Adapter(nn.Linear(48, 80))
    seen = []
    layer32 = nn.Linear(48, 80)
    layer32.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    with torch.inference_mode():
        x32 = torch.randn(3, 48)
        assert products.route(wrapped, x32) == products.route(layer32, x32) == "module"
        products.linear(wrapped, x32, act=nn.ReLU())
        products.projections((layer32, layer32), x32)
        products.linear(layer32, x32, residual=torch.zeros(3, 80))
    assert wrapped.calls == 1 and seen == [(3, 80)] * 3  # the hook saw every call


@needs_onednn
def test_a_hook_on_every_module_sees_every_product(monkeypatch):
    model, ids, mask = small_encoder(torch.float32)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, i, o: seen.append(m) if isinstance(m, nn.Linear) else None
    )
    try:
        with torch.inference_mode():
            model(ids, mask)
    finally:
        handle.remove()
    assert len(seen) == 6 * 3 + 1  # six products a layer, and the pooler


@needs_onednn
@pytest.mark.parametrize("kernel", ["packed", "sdpa"])
def test_a_bfloat16_model_with_fused_products_is_as_close_to_float32_as_without(kernel):
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    ).replace(attn_implementation=kernel)
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).eval()
    ids = torch.randint(1, 99, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.inference_mode():
        want = model(ids, mask).logits
        model.to(torch.bfloat16)
        got = model(ids, mask).logits.float()
        model.set_fast_inference(False)
        plain = model(ids, mask).logits.float()
    real = mask.bool()
    fused_err = (got - want)[real].abs()
    plain_err = (plain - want)[real].abs()
    assert not torch.equal(got, plain)  # the two routes really differ
    assert fused_err.max() < 0.1 and fused_err.mean() <= 1.2 * plain_err.mean()


def test_round_rows_adds_at_most_a_sixteenth_or_7_rows_and_makes_few_shapes():
    for n in [1, 7, 8, 9, 31, 130, 255, 256, 257, 5005, 8191, 100_000]:
        r = round_rows(n)
        assert 0 <= r - n < max(8, n / 16), (n, r)
        assert r % 8 == 0
        assert round_rows(r) == r  # a rounded count stays put
    assert len({round_rows(n) for n in range(4097, 8193)}) == 16  # 16 shapes per doubling


@needs_onednn
def test_spare_rows_never_reach_an_output(monkeypatch):
    """A packed bfloat16 batch runs with spare rows past its last token (oneDNN meets fewer
    shapes); the outputs, hidden states and [CLS] vectors are those of the run without."""
    few_rows_on(monkeypatch, "onednn")
    model, ids, mask = _ffn_model(torch.bfloat16)  # 33 + 40 + 5 = 78 tokens, as 80 rows
    assert round_rows(78) > 78
    seen = []
    monkeypatch.setattr(torch.nn.functional, "layer_norm", _spy(F.layer_norm, seen))
    with torch.inference_mode():
        got = model(ids, mask, output_hidden_states=True)
        rows = [t.shape[0] for t in seen]
        monkeypatch.setattr(products, "row_rounding", lambda weight: None)
        want = model(ids, mask, output_hidden_states=True)
    assert rows == [78] + [80] * 4  # the embeddings' LayerNorm, then two per layer
    assert got.last_hidden_state.shape == want.last_hidden_state.shape == (3, 40, 64)
    pad = ~mask.bool()
    assert (got.last_hidden_state[pad] == 0).all()
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=0)
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@needs_sgemm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_spare_rows_where_the_products_run_on_sgemm(dtype, monkeypatch):
    """sgemm-avx2 builds nothing per shape, so a packed batch runs its own rows only (a spare
    row would be arithmetic for nothing), in float32 and in bfloat16's float32 route: the
    products' inputs and the layer norms' (in float32 each layer's two run inside the
    products and the embeddings' inside their kernel, avx2.embed; in bfloat16 all five as
    modules). bfloat16's float32 route is set where this CPU computes bfloat16 natively."""
    few_rows_on(monkeypatch, "sgemm-avx2")
    if dtype == torch.bfloat16:
        policy = cpu.current()
        products_ = {**policy.products, torch.bfloat16: "float32"}
        monkeypatch.setattr(cpu, "_CURRENT", [dataclasses.replace(policy, products=products_)])
    calls = spy_sgemm(monkeypatch)
    model, ids, mask = _ffn_model(dtype)
    seen, embedded = [], []
    monkeypatch.setattr(torch.nn.functional, "layer_norm", _spy(F.layer_norm, seen))
    monkeypatch.setattr(avx2, "embed", _spy(avx2.embed, embedded))
    with torch.inference_mode():
        model(ids, mask)
    inside = 4 if dtype == torch.float32 else 0
    assert [t.shape[0] for t in embedded] == [78] * (dtype == torch.float32)
    assert [t.shape[0] for t in seen] == [78] * (5 - inside - len(embedded))
    assert len(calls) == 4 * 2 + 1
    assert all(c[0].shape[0] == 78 for c in calls[:-1])
    assert calls[-1][0].shape[0] == ids.shape[0]  # the pooler's: a row per sequence
    assert sum(len(c) > 6 and c[6] is not None for c in calls) == inside


def _spy(fn, seen):
    def wrapped(x, *args, **kwargs):
        seen.append(x)
        return fn(x, *args, **kwargs)

    return wrapped


# ======================================================= the feed-forward network in row chunks
def _ffn_model(dtype):
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = BertModel(cfg).eval().to(dtype)
    ids = torch.randint(1, 99, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, 33:] = 0
    mask[2, 5:] = 0  # 78 tokens
    return model, ids, mask


def _chunk_rows(monkeypatch, rows, dtype):
    """Make every intermediate count as large, chunked ``rows`` rows at a time; returns the
    row counts each feed-forward call saw."""
    width = 128 * torch.tensor([], dtype=dtype).element_size()
    monkeypatch.setattr(products, "FFN_CHUNK_ABOVE", 0)
    monkeypatch.setattr(products, "FFN_CHUNK_BYTES", rows * width)
    seen = []
    forward = BertLayer.feed_forward

    def spy(self, a):
        seen.append(a.shape[0])
        return forward(self, a)

    monkeypatch.setattr(BertLayer, "feed_forward", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feed_forward_in_row_chunks_gives_the_same_outputs(dtype, monkeypatch):
    model, ids, mask = _ffn_model(dtype)
    with torch.inference_mode():
        want = model(ids, mask, output_hidden_states=True)
        spare = products.row_rounding(model.embeddings.word_embeddings.weight)
        rows = spare(78) if spare is not None else 78
        seen = _chunk_rows(monkeypatch, 16, dtype)
        got = model(ids, mask, output_hidden_states=True)
    per_layer = [16] * (rows // 16) + ([rows % 16] if rows % 16 else [])
    assert seen == per_layer * 2  # two layers, each through its chunks
    # Each row's arithmetic is its own: the same up to how the library splits a product.
    tol = 1e-6 if dtype == torch.float32 else BF16_STEP
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(
        got.pooler_output.float(), want.pooler_output.float(), rtol=tol, atol=tol
    )


def test_feed_forward_runs_whole_under_autograd_or_a_hook(monkeypatch):
    model, ids, mask = _ffn_model(torch.float32)
    seen = _chunk_rows(monkeypatch, 16, torch.float32)
    model(ids, mask).last_hidden_state.sum().backward()  # gradients recorded: no chunks
    assert seen == [78, 78]
    assert model.encoder.layer[0].intermediate.dense.weight.grad is not None
    seen.clear()
    calls = []
    hook = model.encoder.layer[1].output.register_forward_hook(lambda m, i, o: calls.append(o))
    with torch.inference_mode():
        model(ids, mask)
    hook.remove()
    with torch.inference_mode():  # float32 products run on oneDNN too: spare rows
        spare = products.row_rounding(model.embeddings.word_embeddings.weight)
    rows = 78 if spare is None else spare(78)
    chunks = [16] * (rows // 16) + ([rows % 16] if rows % 16 else [])
    assert seen == chunks + [rows]  # layer 0 in chunks; layer 1, hooked, whole
    assert [c.shape[0] for c in calls] == [rows]  # the hook saw every row in one call


# ============================================= packed weights


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["packed", "sdpa", "eager"])
def test_the_fused_products_equal_pytorchs_own(dtype, kernel, monkeypatch):
    model, ids, mask = small_encoder(dtype, kernel)
    few_rows_on(monkeypatch, "onednn")  # (few rows in float32 may take MKL's product: below)
    calls = spy_onednn(monkeypatch)
    with torch.inference_mode():
        got = model(ids, mask, output_hidden_states=True)
        # per layer: query+key+value as one, the attention's output, the two feed-forward
        # and the pooler's (a row per sequence)
        assert len(calls) == 4 * 3 + 1
        model.set_fast_inference(False)  # every product through PyTorch's nn.Linear
        want = model(ids, mask, output_hidden_states=True)
    assert len(calls) == 4 * 3 + 1
    real = mask.bool()
    tol = 1e-5 if dtype == torch.float32 else 4 * BF16_STEP
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g[real].float(), w[real].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(
        got.pooler_output.float(), want.pooler_output.float(), rtol=tol, atol=tol
    )


@needs_onednn
@pytest.mark.parametrize("few_rows", FEW_ROWS)
def test_packed_weights_follow_every_change_of_the_weights(few_rows, monkeypatch):
    """A weight written in place, a state dict loaded, a cast there and back, an optimizer step
    (a fused one moves no version counter): the next call computes with the weights as they
    are now, never a stale packed copy (oneDNN's, or MKL's for few rows)."""
    few_rows_on(monkeypatch, few_rows)
    calls = spy_kernel(monkeypatch, few_rows)
    model, ids, mask = small_encoder(torch.float32)
    plain, _, _ = small_encoder(torch.float32)
    plain.set_fast_inference(False)

    def check():
        plain.load_state_dict(model.state_dict())
        with torch.inference_mode():
            got, want = model(ids, mask).last_hidden_state, plain(ids, mask).last_hidden_state
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        return got

    first = check()
    with torch.no_grad():
        model.encoder.layer[1].attention.self.value.weight.mul_(2)  # in place
        model.encoder.layer[2].intermediate.dense.bias.add_(1)
    assert not torch.allclose(check(), first)
    other, _, _ = small_encoder(torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    model.load_state_dict(other.state_dict())
    check()
    model.to(torch.bfloat16).float()  # rounded through bfloat16: new values, new storage
    check()
    for optimizer in (
        torch.optim.SGD(model.parameters(), lr=0.1),
        torch.optim.AdamW(model.parameters(), lr=0.1, fused=True),  # moves no version counter
    ):
        model(ids, mask).last_hidden_state.sum().backward()  # in eval mode: no dropout
        optimizer.step()
        check()
    assert calls  # (the packed route ran)


@needs_mkl
@pytest.mark.parametrize(("n_in", "n_out"), [(384, 1152), (1536, 384)])
def test_one_mkl_packed_copy_serves_every_row_count(n_in, n_out):
    """MKL packs a weight for MKL_PACK_ROWS rows; told the actual count, the product on that one
    copy is the layer's at every count from 1 to 200 (a kernel packed for other counts would
    give wrong numbers, not an error: this is what makes one copy enough)."""
    layer, _ = layer_and_input(n_in=n_in, n_out=n_out, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in range(1, 201):
            x = torch.randn(rows, n_in, generator=g)
            got = products._few_rows((layer,), x)
            torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5, msg=f"{rows} rows")
    assert len(products._PACKED["mkl"]) >= 1 and layer in products._PACKED["mkl"]


@needs_mkl
def test_few_rows_take_mkls_product_and_more_rows_take_onednns(monkeypatch):
    """At most FEW_ROWS rows: MKL's packed product (then the epilogue in place); one more row:
    oneDNN's fused one. Both are the layer's function; with the policy on oneDNN, no MKL copy
    is made."""
    layer, _ = layer_and_input(n_in=64, n_out=96, dtype=torch.float32)
    few_rows_on(monkeypatch, "mkl")
    mkl, onednn = spy_mkl(monkeypatch), spy_onednn(monkeypatch)
    rows = products.FEW_ROWS
    with torch.inference_mode():
        for shape in [(1, rows), (rows + 1,)]:
            x = torch.randn(*shape, 64)
            other = torch.randn(*shape, 96)
            got = products.linear(layer, x, act=nn.GELU(), residual=other)
            torch.testing.assert_close(got, F.gelu(layer(x)) + other, rtol=1e-5, atol=1e-5)
    assert (len(mkl), len(onednn)) == (1, 1)
    assert mkl[0][-1] == rows  # the product is told the actual row count
    fresh, _ = layer_and_input(n_in=64, n_out=96, dtype=torch.float32)
    few_rows_on(monkeypatch, "onednn")
    with torch.inference_mode():
        products.linear(fresh, torch.randn(3, 64))
    assert fresh not in products._PACKED["mkl"] and len(mkl) == 1


@needs_mkl
def test_inference_tensor_weights_take_pytorchs_product_on_few_rows(monkeypatch):
    """Weights made under inference_mode keep no version counter, so nothing is packed for
    them: few rows are computed by F.linear, with the same numbers."""
    few_rows_on(monkeypatch, "mkl")
    mkl = spy_mkl(monkeypatch)
    with torch.inference_mode():
        layer, x = layer_and_input(n_in=64, n_out=96, dtype=torch.float32)
        got = products.linear(layer, x)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    assert not mkl and layer not in products._PACKED["mkl"]


def test_set_fast_inference_refuses_anything_but_a_bool():
    model, _, _ = small_encoder(torch.float32)
    with pytest.raises(TypeError, match="True or False, got 'no'"):
        model.set_fast_inference("no")


@needs_int8
def test_int8_projections_that_share_their_smoothing_run_as_one_product(monkeypatch):
    model, ids, mask = small_encoder(torch.float32)
    q = quantize_int8(model, calibrate=[{"input_ids": ids, "attention_mask": mask}])
    calls = []
    real = products.int8_product
    monkeypatch.setattr(
        products, "int8_product", lambda x, w, b: calls.append(w.int8.shape) or real(x, w, b)
    )
    with torch.inference_mode():
        got = q(ids, mask).last_hidden_state
        assert calls.count((64, 3 * 64)) == 3  # query, key and value: one product a layer
        monkeypatch.setattr(products, "route", lambda *a, **k: "module")
        want = q(ids, mask).last_hidden_state  # every Int8Linear called as a module
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

"""The oneDNN linear layers of CPU inference (bertlab/fused.py): they compute the same function
as the plain layers (in bfloat16 rounding once instead of twice), on weights packed once and
packed again whenever a weight changes, and step aside whenever a gradient is recorded or the
input is not CPU float32 or bfloat16. Also the other inference-only paths: the encoder run from
packed weights (fast.layer_inference), spare rows (packing.round_rows) and the feed-forward
network in row chunks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertlab import BertConfig, BertForMaskedLM, BertModel
from bertlab.nn import fast, fused
from bertlab.nn.packing import round_rows

needs_bf16 = pytest.mark.skipif(
    not fused._BF16, reason="this PyTorch or CPU has no oneDNN bfloat16 fused linear"
)
needs_onednn = pytest.mark.skipif(not fused._AVAILABLE, reason="this PyTorch has no oneDNN")
BF16_STEP = 2**-8  # bfloat16 keeps 8 significant bits: one rounding is off by <= 2**-9 relative


def layer_and_input(n_in=48, n_out=80, shape=(3, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    layer = nn.Linear(n_in, n_out)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n_out, n_in, generator=g) / n_in**0.5)
        layer.bias.copy_(torch.randn(n_out, generator=g))
    x = torch.randn(*shape, n_in, generator=g)
    return layer.to(torch.bfloat16).eval(), x.to(torch.bfloat16)


def exact(layer, x):
    """The layer computed in float32 on the very same bfloat16 numbers: the value to round."""
    return F.linear(x.float(), layer.weight.float(), layer.bias.float())


def within_one_rounding(got, want):
    assert got.dtype == torch.bfloat16
    err = (got.float() - want).abs()
    assert (err <= BF16_STEP * want.abs() + 1e-6).all(), f"off by {err.max():.3g}"


@needs_bf16
def test_each_fused_form_is_the_exact_result_rounded_once():
    layer, x = layer_and_input()
    other = torch.randn(3, 7, 80).to(torch.bfloat16)
    with torch.inference_mode():
        within_one_rounding(fused.linear(layer, x), exact(layer, x))
        within_one_rounding(fused.linear_add(layer, x, other), exact(layer, x) + other.float())
        for act, fn in [
            ("gelu", F.gelu),
            ("relu", F.relu),
            ("silu", F.silu),
            ("gelu_new", lambda t: F.gelu(t, approximate="tanh")),
        ]:
            got = fused.linear_act(layer, x, act, plain=None)  # plain is never called
            within_one_rounding(got, fn(exact(layer, x)))


@needs_bf16
def test_fused_is_at_least_as_close_as_the_plain_layers():
    """The plain forms round the product, then round again after the activation or the sum;
    the fused ones round once. Over a whole layer their error is no larger."""
    layer, x = layer_and_input(n_in=256, n_out=512, shape=(64,))
    other = torch.randn(64, 512).to(torch.bfloat16)
    want = exact(layer, x) + other.float()
    with torch.inference_mode():
        fused_err = (fused.linear_add(layer, x, other).float() - want).abs().mean()
        plain_err = ((layer(x) + other).float() - want).abs().mean()
    assert fused_err <= plain_err


@needs_bf16
def test_the_fused_operator_really_runs(monkeypatch):
    layer, x = layer_and_input()
    calls = []
    real = fused._linear_pointwise
    monkeypatch.setattr(fused, "_linear_pointwise", lambda *a: calls.append(a) or real(*a))
    with torch.inference_mode():
        fused.linear(layer, x)
    assert len(calls) == 1


def test_plain_layers_run_when_a_gradient_is_recorded_or_the_dtype_is_not_onednns(monkeypatch):
    def refuse(*a):
        raise AssertionError("the fused operator ran")

    monkeypatch.setattr(fused, "_linear_pointwise", refuse)
    layer, x = layer_and_input()
    out = fused.linear_act(layer, x, "gelu", F.gelu)  # gradients recorded: the weight needs one
    out.float().sum().backward()
    assert layer.weight.grad is not None
    layer64, x64 = layer.double(), x.double()  # oneDNN computes float32 and bfloat16 only
    with torch.inference_mode():
        assert torch.equal(fused.linear(layer64, x64), layer64(x64))
        other = torch.randn(3, 7, 80, dtype=torch.float64)
        assert torch.equal(fused.linear_add(layer64, x64, other), layer64(x64) + other)


@needs_onednn
def test_float32_products_equal_the_plain_layers_to_float32_rounding():
    """In float32 oneDNN orders the sums of a product differently from PyTorch's BLAS: the
    same function, within float32 tolerance (and the fused activation and sum too)."""
    layer, x = layer_and_input(n_in=384, n_out=512, shape=(5, 9))
    layer, x = layer.float(), x.float()
    other = torch.randn(5, 9, 512)
    with torch.inference_mode():
        for got, want in [
            (fused.linear(layer, x), layer(x)),
            (fused.linear_add(layer, x, other), layer(x) + other),
            (fused.linear_act(layer, x, "gelu", F.gelu), F.gelu(layer(x))),
        ]:
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_hook_on_a_layer_still_sees_every_call(monkeypatch):
    monkeypatch.setattr(fused, "_linear_pointwise", None)  # would fail if called
    layer, x = layer_and_input()
    seen = []
    layer.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    with torch.inference_mode():
        fused.linear(layer, x)
        fused.linear_act(layer, x, "gelu", F.gelu)
        fused.linear_add(layer, x, torch.zeros(3, 7, 80, dtype=torch.bfloat16))
    assert seen == [(3, 7, 80)] * 3


@needs_bf16
@pytest.mark.parametrize("kernel", ["packed", "sdpa"])
def test_a_bfloat16_model_with_fused_layers_is_as_close_to_float32_as_without(kernel, monkeypatch):
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    cfg = cfg.replace(attn_implementation=kernel)
    torch.manual_seed(0)
    model = BertForMaskedLM(cfg).eval()
    ids = torch.randint(1, 99, (4, 20))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    with torch.inference_mode():
        want = model(ids, mask).logits
        model.to(torch.bfloat16)
        got = model(ids, mask).logits.float()
        monkeypatch.setattr(fused, "_AVAILABLE", False)
        plain = model(ids, mask).logits.float()
    real = mask.bool()
    fused_err = (got - want)[real].abs()
    plain_err = (plain - want)[real].abs()
    assert not torch.equal(got, plain)  # the two paths really differ
    assert fused_err.max() < 0.1 and fused_err.mean() <= 1.2 * plain_err.mean()


def test_round_rows_adds_at_most_a_sixteenth_or_7_rows_and_makes_few_shapes():
    for n in [1, 7, 8, 9, 31, 130, 255, 256, 257, 5005, 8191, 100_000]:
        r = round_rows(n)
        assert 0 <= r - n < max(8, n / 16), (n, r)
        assert r % 8 == 0
        assert round_rows(r) == r  # a rounded count stays put
    assert len({round_rows(n) for n in range(4097, 8193)}) == 16  # 16 shapes per doubling


@needs_bf16
def test_spare_rows_never_reach_an_output(monkeypatch):
    """A packed bfloat16 batch runs with spare rows past its last token (oneDNN meets fewer
    shapes); the outputs, hidden states and [CLS] vectors are those of the plain run."""
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = BertModel(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(1, 99, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, 33:] = 0
    mask[2, 5:] = 0  # 33 + 40 + 5 = 78 tokens, run as round_rows(78) = 80 rows
    assert round_rows(78) > 78
    seen = []
    monkeypatch.setattr(torch.nn.functional, "layer_norm", _spy(F.layer_norm, seen))
    with torch.inference_mode():
        got = model(ids, mask, output_hidden_states=True)
        rows = [t.shape[0] for t in seen]
        monkeypatch.setattr(model, "spare_rows", None)  # no spare rows
        want = model(ids, mask, output_hidden_states=True)
    assert rows == [78] + [80] * 4  # the embeddings' LayerNorm, then two per layer
    assert got.last_hidden_state.shape == want.last_hidden_state.shape == (3, 40, 64)
    pad = ~mask.bool()
    assert (got.last_hidden_state[pad] == 0).all()
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=0, atol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=0)
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


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
    """Make every intermediate count as large, chunked ``rows`` rows at a time, on the module
    path (the encoder run from packed weights chunks the same way: see the test below)."""
    monkeypatch.setattr(fast.FastEncoder, "direct", lambda self, x: False)
    width = 128 * torch.tensor([], dtype=dtype).element_size()
    monkeypatch.setattr(fast, "FFN_CHUNK_ABOVE", 0)
    monkeypatch.setattr(fast, "FFN_CHUNK_BYTES", rows * width)
    seen = []
    forward = fast.FastIntermediate.forward

    def spy(self, x):
        seen.append(x.shape[0])
        return forward(self, x)

    monkeypatch.setattr(fast.FastIntermediate, "forward", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feed_forward_in_row_chunks_gives_the_same_outputs(dtype, monkeypatch):
    model, ids, mask = _ffn_model(dtype)
    with torch.inference_mode():
        want = model(ids, mask, output_hidden_states=True)
        rows = round_rows(78) if fused.shape_cached(want.last_hidden_state) else 78
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
    rows = round_rows(78)  # float32 products run on oneDNN too: spare rows
    chunks = [16] * (rows // 16) + ([rows % 16] if rows % 16 else [])
    assert seen == chunks + [rows]  # layer 0 in chunks; layer 1, hooked, whole
    assert [c.shape[0] for c in calls] == [rows]  # the hook saw every row in one call


@needs_onednn
def test_the_encoder_from_packed_weights_chunks_its_feed_forward_the_same_way(monkeypatch):
    model, ids, mask = _ffn_model(torch.float32)
    with torch.inference_mode():
        want = model(ids, mask, output_hidden_states=True)
        monkeypatch.setattr(fast, "FFN_CHUNK_ABOVE", 0)
        monkeypatch.setattr(fast, "FFN_CHUNK_BYTES", 16 * 128 * 4)
        seen = []
        product = fused.product
        monkeypatch.setattr(
            fused, "product", lambda x, *a, **k: seen.append((x.shape[0], k)) or product(x, *a, **k)
        )
        got = model(ids, mask, output_hidden_states=True)
    first = [n for n, k in seen if k.get("act")]  # the first product of each chunk
    rows = round_rows(78)
    assert first == ([16] * (rows // 16) + ([rows % 16] if rows % 16 else [])) * 2
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


# ============================================= the encoder computed from packed weights
def _encoder_model(dtype, kernel="packed", head=BertModel):
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    ).replace(attn_implementation=kernel)
    torch.manual_seed(0)
    model = head(cfg).eval().to(dtype)
    ids = torch.randint(1, 99, (3, 30))
    mask = torch.ones_like(ids)
    mask[0, 21:] = 0
    mask[2, 4:] = 0
    return model, ids, mask


def _spy_layers(monkeypatch):
    calls = []
    real = fast.layer_inference
    monkeypatch.setattr(fast, "layer_inference", lambda *a: calls.append(1) or real(*a))
    return calls


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["packed", "sdpa", "eager"])
@pytest.mark.parametrize("padded", [True, False])
def test_the_encoder_from_packed_weights_equals_the_paper_modules(
    dtype, kernel, padded, monkeypatch
):
    if dtype == torch.bfloat16 and not fused._BF16:
        pytest.skip("this CPU has no oneDNN bfloat16")
    model, ids, mask = _encoder_model(dtype, kernel)
    if not padded:
        mask = torch.ones_like(mask)
    calls = _spy_layers(monkeypatch)
    with torch.inference_mode():
        got = model(ids, mask, output_hidden_states=True)
        assert len(calls) == 3, "every layer should run from packed weights"
        model.set_fast_inference(False)  # the paper's modules, PyTorch's own products
        want = model(ids, mask, output_hidden_states=True)
    assert len(calls) == 3
    real = mask.bool()
    tol = 1e-5 if dtype == torch.float32 else 4 * BF16_STEP
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g[real].float(), w[real].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(
        got.pooler_output.float(), want.pooler_output.float(), rtol=tol, atol=tol
    )


@needs_onednn
def test_a_hook_attention_probabilities_or_a_gradient_take_the_module_path(monkeypatch):
    model, ids, mask = _encoder_model(torch.float32)
    calls = _spy_layers(monkeypatch)
    with torch.inference_mode():
        want = model(ids, mask).last_hidden_state
        assert len(calls) == 3
        seen = []
        hook = model.encoder.layer[1].attention.self.key.register_forward_hook(
            lambda m, i, o: seen.append(o.shape)
        )
        hooked = model(ids, mask).last_hidden_state
        hook.remove()
        assert len(calls) == 3 and len(seen) == 1 and seen[0][-1] == 64
        model(ids, mask, output_attentions=True)
        assert len(calls) == 3
    # The hooked run computed the very same numbers: its projections ran one by one
    # (FusedLinear) on the same packed rows as the stacked product.
    assert torch.equal(hooked, want)
    model(ids, mask).last_hidden_state.sum().backward()  # gradients: the module path
    assert len(calls) == 3 and model.encoder.layer[0].output.dense.weight.grad is not None


@needs_onednn
def test_packed_weights_follow_every_change_of_the_weights():
    """A weight written in place, a state dict loaded, a cast there and back: the next call
    computes with the weights as they are now, never a stale packed copy."""
    model, ids, mask = _encoder_model(torch.float32)
    plain, _, _ = _encoder_model(torch.float32)
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
    other, _, _ = _encoder_model(torch.float32)
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
        model.train()
        model(ids, mask).last_hidden_state.sum().backward()
        optimizer.step()
        model.eval()  # drops the packed weights
        check()


def test_set_fast_inference_refuses_anything_but_a_bool():
    model, _, _ = _encoder_model(torch.float32)
    with pytest.raises(TypeError, match="True or False, got 'no'"):
        model.set_fast_inference("no")

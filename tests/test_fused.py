"""The fused oneDNN linear layers of bfloat16 CPU inference (bertlab/fused.py): they compute
the same function as the plain layers, round once instead of twice, and step aside whenever a
gradient is recorded or the input is not CPU bfloat16. Also the other inference-only paths:
spare rows (packing.round_rows) and the feed-forward network in row chunks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertlab import BertConfig, BertForMaskedLM, BertModel
from bertlab.nn import fast, fused
from bertlab.nn.packing import round_rows

needs_onednn = pytest.mark.skipif(
    not fused._AVAILABLE, reason="this PyTorch or CPU has no oneDNN bfloat16 fused linear"
)
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


@needs_onednn
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


@needs_onednn
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


@needs_onednn
def test_the_fused_operator_really_runs(monkeypatch):
    layer, x = layer_and_input()
    calls = []
    real = fused._linear_pointwise
    monkeypatch.setattr(fused, "_linear_pointwise", lambda *a: calls.append(a) or real(*a))
    with torch.inference_mode():
        fused.linear(layer, x)
    assert len(calls) == 1


def test_plain_layers_run_when_a_gradient_is_recorded_or_the_dtype_is_not_bfloat16(monkeypatch):
    def refuse(*a):
        raise AssertionError("the fused operator ran")

    monkeypatch.setattr(fused, "_linear_pointwise", refuse)
    layer, x = layer_and_input()
    out = fused.linear_act(layer, x, "gelu", F.gelu)  # gradients recorded: the weight needs one
    out.float().sum().backward()
    assert layer.weight.grad is not None
    layer32, x32 = layer.float(), x.float()
    with torch.inference_mode():
        assert torch.equal(fused.linear(layer32, x32), layer32(x32))
        other = torch.randn(3, 7, 80)
        assert torch.equal(fused.linear_add(layer32, x32, other), layer32(x32) + other)


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


@needs_onednn
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


@needs_onednn
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
    """Make every intermediate count as large, chunked ``rows`` rows at a time."""
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
    assert seen == [16] * 4 + [14] + [78]  # layer 0 in chunks; layer 1, hooked, whole
    assert [c.shape[0] for c in calls] == [78]  # the hook saw every row in one call

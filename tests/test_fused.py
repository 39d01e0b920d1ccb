"""The fused oneDNN linear layers of bfloat16 CPU inference (bertlab/fused.py): they compute
the same function as the plain layers, round once instead of twice, and step aside whenever a
gradient is recorded or the input is not CPU bfloat16."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bertlab import BertConfig, BertForMaskedLM, fused

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
        for act, fn in [("gelu", F.gelu), ("relu", F.relu), ("silu", F.silu),
                        ("gelu_new", lambda t: F.gelu(t, approximate="tanh"))]:  # fmt: skip
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


@needs_onednn
@pytest.mark.parametrize("kernel", ["packed", "sdpa"])
def test_a_bfloat16_model_with_fused_layers_is_as_close_to_float32_as_without(kernel, monkeypatch):
    cfg = BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=32)  # fmt: skip
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

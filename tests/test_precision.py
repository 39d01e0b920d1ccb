"""bfloat16, torch.compile and int8: each changes results only within its dtype's tolerance."""

import operator
from dataclasses import replace

import pytest
import torch
from helpers import bundled_model_in_int8, needs_int8
from torch._inductor import config as inductor_config

from bertlab import BertConfig, BertForSequenceClassification, BertModel
from bertlab.nn import cpu
from bertlab.nn.precision import Int8Linear, layer_errors, quantize_int8

CFG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    return ids * mask, mask


@pytest.mark.parametrize("kernel", ["sdpa", "packed"])
def test_torch_compile_matches_eager_execution(kernel):
    torch.manual_seed(0)
    model = BertModel(CFG.replace(attn_implementation=kernel)).eval()
    ids, mask = batch()
    with torch.no_grad(), inductor_config.patch(cpu.inductor_options()):
        want = model(ids, mask).last_hidden_state
        got = torch.compile(model)(ids, mask).last_hidden_state
    real = mask.bool()
    assert (got[real] - want[real]).abs().max() < 1e-5


def test_bfloat16_inference_stays_close_to_float32():
    torch.manual_seed(0)
    model = BertModel(CFG.replace(attn_implementation="packed")).eval()
    ids, mask = batch()
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        got = model.to(torch.bfloat16)(ids, mask).last_hidden_state.float()
    real = mask.bool()
    # bfloat16 keeps 8 bits of mantissa: LayerNormed values of size ~1 agree to ~1e-2.
    assert (got[real] - want[real]).abs().max() < 0.1
    assert torch.nn.functional.cosine_similarity(got[real], want[real]).min() > 0.999


@needs_int8
def test_int8_quantisation_keeps_the_original_and_stays_close():
    torch.manual_seed(0)
    model = BertForSequenceClassification(CFG).eval()
    quantized = quantize_int8(model)
    assert isinstance(model.classifier, torch.nn.Linear)  # the original is untouched
    assert isinstance(quantized.classifier, Int8Linear)
    report = quantized.int8_report
    assert len(report["int8"]) == 2 * 6 + 2 and report["kept_float32"] == {}  # + pooler, classifier
    assert any("LayerNorm" in s for s in report["always_float32"])
    ids, mask = batch()
    with torch.no_grad():
        want, got = model(ids, mask).logits, quantized(ids, mask).logits
    assert not torch.equal(want, got)  # it really is quantised
    assert (want - got).abs().max() < 0.05 * want.abs().max() + 1e-3


@needs_int8
def test_int8_layer_is_the_int8_product_of_per_token_and_per_channel_scales():
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16, generator=g) * torch.tensor([1.0, 10, 0.1, 3, 100])[:, None]
    q = Int8Linear(lin)
    sw = lin.weight.detach().abs().amax(1) / 127
    wq = torch.round(lin.weight.detach() / sw[:, None])
    levels = cpu.current().int8_levels  # 127, or 63 on the u8 kernels without VNNI
    sx = x.abs().amax(1, keepdim=True) / levels
    xq = torch.round(x / sx)
    want = (xq @ wq.T) * sw * sx + lin.bias.detach()
    with torch.no_grad():
        torch.testing.assert_close(q(x), want, rtol=1e-5, atol=1e-5)
        # each token's scale is its own: a row's result does not see the other rows
        torch.testing.assert_close(q(x[2:3]), q(x)[2:3], rtol=0, atol=0)


@needs_int8
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_the_int8_kernel_sums_the_largest_values_at_its_levels_exactly(rows):
    # Every activation at +-levels and every weight at +-127, in runs of one sign, so that a
    # kernel adding two u8 x s8 products in 16 bits (VPMADDUBSW) would saturate at 127 levels
    # (cpu.int8_levels): the class's kernel sums them all exactly, whichever it is.
    K, N = 384, 96
    g = torch.Generator().manual_seed(rows)
    x = torch.ones(rows, K)
    x[1:] = torch.randint(0, 2, (rows - 1, K), generator=g).float() * 2 - 1
    w = torch.ones(N, K)
    w[1::3] = -1
    w[2::3] = torch.tensor([1.0, 1.0, -1.0, -1.0]).repeat(K // 4)
    lin = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
        got = Int8Linear(lin)(x)
    torch.testing.assert_close(got, x @ w.T, rtol=1e-5, atol=1e-4)


@needs_int8
def test_the_bundled_model_in_int8_on_this_cpus_kernel_keeps_its_embeddings():
    """Real SST-2 sentences through the bundled model, calibrated, on the int8 kernel the CPU's
    class takes (whichever it is, Arm's included): the mean embedding cosine to float32 meets
    the 0.995 of int8's quality rule."""
    from bertlab.nn.precision import int8_kernel

    reference, got, q = bundled_model_in_int8()
    assert len(q.int8_report["int8"]) > 0 and int8_kernel() in q.int8_report["kernel"]
    cos = torch.nn.functional.cosine_similarity(got, reference)
    assert cos.mean() >= 0.995 and (got - reference).abs().max() > 1e-4  # int8, not float32


@needs_int8
@pytest.mark.parametrize("kernel", ["packed", "sdpa"])
def test_int8_results_never_depend_on_the_rest_of_the_batch(kernel):
    torch.manual_seed(0)
    model = quantize_int8(BertModel(CFG.replace(attn_implementation=kernel)).eval())
    ids, mask = batch()
    with torch.no_grad():
        together = model(ids, mask).last_hidden_state
        for row in range(3):
            n = int(mask[row].sum())
            alone = model(ids[row : row + 1, :n]).last_hidden_state[0]
            torch.testing.assert_close(alone, together[row, :n], rtol=1e-5, atol=1e-5)


PREPACKED = cpu.current().int8_prepacked
NOT_PREPACKED = (
    f"onednn-s8's prepacked kernel runs where the CPU has AMX; this one is of class "
    f"{cpu.current().cpu_class}, int8 kernel {cpu.current().int8_kernel}"
)


@pytest.mark.skipif(not PREPACKED, reason=NOT_PREPACKED)
def test_onednn_s8_takes_the_prepacked_kernel_above_few_rows_with_the_same_sums(monkeypatch):
    from bertlab.nn import precision

    g = torch.Generator().manual_seed(0)
    q = Int8Linear(torch.nn.Linear(48, 40))
    calls = []
    qlinear = precision._QLINEAR
    monkeypatch.setattr(precision, "_QLINEAR", lambda *a: calls.append(len(a[0])) or qlinear(*a))
    few = precision.S8_FEW_ROWS
    with torch.no_grad():
        for rows in (1, few, few + 1, 3 * few + 5):
            x = torch.randn(rows, 48, generator=g) * torch.linspace(0.1, 30, rows)[:, None]
            got = q(x)
            monkeypatch.setattr(precision, "S8_FEW_ROWS", 1 << 62)  # every product on _int_mm
            want = q(x)
            monkeypatch.setattr(precision, "S8_FEW_ROWS", few)
            assert torch.equal(got, want), rows  # int32 sums, then the same float32 roundings
    assert calls == [few + 1, 3 * few + 5]  # the prepacked kernel ran above few rows only


@needs_int8
def test_int8_sequences_alone_equal_a_batch_past_few_rows():
    from bertlab.nn import precision

    torch.manual_seed(0)
    model = quantize_int8(BertModel(CFG).eval())
    ids = torch.randint(1, 99, (4, 30), generator=torch.Generator().manual_seed(2))
    assert ids.numel() > precision.S8_FEW_ROWS >= 30  # together past few rows, alone within
    with torch.no_grad():
        together = model(ids).last_hidden_state
        for row in range(4):
            alone = model(ids[row : row + 1]).last_hidden_state[0]
            torch.testing.assert_close(alone, together[row], rtol=1e-5, atol=1e-5)


@needs_int8
def test_int8_products_of_the_seam_equal_its_modules(monkeypatch):
    from bertlab.nn import products

    torch.manual_seed(0)
    model = quantize_int8(BertModel(CFG).eval())
    ids, mask = batch()
    x = torch.zeros(1, CFG.hidden_size)
    with torch.no_grad():
        assert products.route(model.encoder.layer[0].attention.self.query, x) == "int8"
        lean = model(ids, mask).last_hidden_state
        monkeypatch.setattr(products, "route", lambda *a, **k: "module")
        modules = model(ids, mask).last_hidden_state
    torch.testing.assert_close(lean, modules, rtol=1e-5, atol=1e-5)


@needs_int8
def test_int8_calibration_keeps_the_layers_past_the_tolerance():
    torch.manual_seed(0)
    model = BertModel(CFG).eval()
    ids, mask = batch()
    calib = [{"input_ids": ids, "attention_mask": mask}]
    errors = layer_errors(model, calib)
    assert set(errors) == {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    middle = sorted(errors.values())[len(errors) // 2]
    q = quantize_int8(
        model, calibrate=calib, tolerance=middle, keep=[r"pooler\..*"], smoothing_strength=None
    )
    kept = q.int8_report["kept_float32"]
    assert kept["pooler.dense"] == "asked (keep=)"
    past = {n for n, e in errors.items() if e > middle and n != "pooler.dense"}
    assert past and past <= set(kept) and all("tolerance" in kept[n] for n in past)
    assert all(isinstance(q.get_submodule(n), torch.nn.Linear) for n in kept)
    assert all(isinstance(q.get_submodule(n), Int8Linear) for n in q.int8_report["int8"])


@needs_int8
def test_smoothed_int8_layer_computes_x_over_s_times_w_s():
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16, generator=g)
    x[:, 3] *= 40  # an outlier channel
    s = torch.rand(16, generator=g) + 0.5
    q = Int8Linear(lin, smooth=s)
    w = lin.weight.detach() * s
    sw = w.abs().amax(1) / 127
    wq = torch.round(w / sw[:, None])
    xs = x / s
    sx = xs.abs().amax(1, keepdim=True) / cpu.current().int8_levels
    want = (torch.round(xs / sx) @ wq.T) * sw * sx + lin.bias.detach()
    with torch.no_grad():
        torch.testing.assert_close(q(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="smooth must be 16 positive factors"):
        Int8Linear(lin, smooth=torch.ones(15))
    with pytest.raises(ValueError, match="smooth must be 16 positive factors"):
        Int8Linear(lin, smooth=torch.zeros(16))


def outlier_model():
    """The test network with one LayerNorm channel 30x the others, as real BERTs have: it
    feeds every layer's attention projections and feed-forward input."""
    torch.manual_seed(0)
    model = BertModel(CFG).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p[5] = 30.0
    return model


@needs_int8
def test_calibrated_smoothing_lowers_the_int8_error_and_keeps_the_projections_one_product():
    model = outlier_model()
    ids, mask = batch()
    calib = [{"input_ids": ids, "attention_mask": mask}]
    plain = layer_errors(model, calib)
    q = quantize_int8(model, calibrate=calib)
    smoothed = q.int8_report["smoothed"]
    names = [f"encoder.layer.0.attention.self.{p}" for p in ("query", "key", "value")]
    assert set(names) <= set(smoothed)  # the projections read the outlier channel
    assert len({smoothed[n] for n in names}) == 1  # one strength, one s: still one product
    s = q.encoder.layer[0].attention.self
    assert torch.equal(s.query.unsmooth, s.value.unsmooth)
    assert s.query.smoothing_group == s.value.smoothing_group == names[0]
    for n in smoothed:  # chosen only where the calibration error drops
        assert q.int8_report["errors"][n] < plain[n]
    with torch.no_grad():
        want = model(ids, mask).last_hidden_state
        got = q(ids, mask).last_hidden_state
        unsmoothed = quantize_int8(model, calibrate=calib, smoothing_strength=None)
        worse = unsmoothed(ids, mask).last_hidden_state
    real = mask.bool()
    assert (got[real] - want[real]).norm() < (worse[real] - want[real]).norm()


@needs_int8
def test_a_traced_int8_model_runs_its_attention_projections_as_one_product(tmp_path):
    """torch.compile (and torch.export) trace the module path, not the packed one: there the
    three projections sharing one smoothing are still one int8 product, and the traced graph's
    numbers are the eager model's."""
    model = outlier_model()
    ids, mask = batch()
    q = quantize_int8(model, calibrate=[{"input_ids": ids, "attention_mask": mask}])
    products = []

    # torch._int_mm traced on oneDNN's s8 kernel; on the u8 kernels, which a graph cannot call,
    # the same sums as a float32 product of the rounded values
    op = torch._int_mm if cpu.current().int8_kernel == "onednn-s8" else operator.matmul

    def count(graph, example_inputs):  # a torch.compile backend: runs the graph as traced
        products.append(sum(n.target is op for n in graph.graph.nodes))
        return graph.forward

    with torch.no_grad():
        traced = torch.compile(q, backend=count, fullgraph=True)(ids, mask).last_hidden_state
        eager = q(ids, mask).last_hidden_state
    pooler = q.pooler is not None
    assert products == [4 * CFG.num_hidden_layers + pooler]  # not 6 per layer
    real = mask.bool()
    # (to float32 rounding: the eager model's layer norms may run inside bertlab's AVX2 kernels)
    torch.testing.assert_close(traced[real], eager[real], rtol=1e-5, atol=1e-5)
    q.save_pretrained(tmp_path)  # nothing shared between the layers' tensors
    # projections smoothed apart (built by hand, not by quantize_int8) stay three products
    s = q.encoder.layer[0].attention.self
    s.key = Int8Linear(
        model.encoder.layer[0].attention.self.key, torch.full((CFG.hidden_size,), 2.0)
    )
    products.clear()
    with torch.no_grad():
        torch.compile(q, backend=count, fullgraph=True)(ids, mask)
    assert products == [4 * CFG.num_hidden_layers + pooler + 2]


@needs_int8
def test_smoothed_int8_products_of_the_seam_equal_its_modules_and_ignore_the_batch(monkeypatch):
    from bertlab.nn import products

    model = outlier_model()
    ids, mask = batch()
    q = quantize_int8(model, calibrate=[{"input_ids": ids, "attention_mask": mask}])
    assert q.int8_report["smoothed"]
    with torch.no_grad():
        lean = q(ids, mask).last_hidden_state
        alone = q(ids[1:2, :7]).last_hidden_state[0]
        monkeypatch.setattr(products, "route", lambda *a, **k: "module")
        modules = q(ids, mask).last_hidden_state
    torch.testing.assert_close(lean, modules, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone, lean[1, :7], rtol=1e-5, atol=1e-5)


def test_int8_refuses_what_it_cannot_run(monkeypatch):
    model = BertModel(CFG).eval()
    with pytest.raises(ValueError, match="tolerance must be > 0, got 0"):
        quantize_int8(model, tolerance=0)
    with pytest.raises(ValueError, match=r"smoothing_strength must be in \(0, 1\), got 1.5"):
        quantize_int8(model, smoothing_strength=(0.5, 1.5))
    with pytest.raises(ValueError, match="smoothing_strength=0.5 needs calibrate= batches"):
        quantize_int8(model, smoothing_strength=0.5)
    # a CPU without AVX2 (the least any int8 kernel here needs), as bertlab.nn.cpu sees it
    old = cpu.features()
    sse = replace(old, arch="x86_64", flags=frozenset({"sse4_1"}))
    monkeypatch.setattr(cpu, "_CURRENT", [cpu.policy(sse)])
    with pytest.raises(RuntimeError, match="int8 inference is not available: .*needs AVX2"):
        quantize_int8(model)

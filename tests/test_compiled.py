"""Compiled inference (bertlab.nn.compiled): batches with little padding run as one compiled graph
and give the eager model's results within the dtype's tolerance; everything else runs the model
itself; bad input gets the eager model's errors; stale weights are refused, never used."""

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import needs_int8

from bertlab import (
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from bertlab.nn import attention, cpu
from bertlab.nn.compiled import PADDING_LIMIT, Compiled
from bertlab.nn.precision import bf16_supported, quantize_int8

pytestmark = pytest.mark.skipif(
    Compiled.available() is not None,
    reason=f"torch.compile cannot build CPU kernels here: {Compiled.available()}",
)


@pytest.fixture(scope="module", autouse=True)
def compiled_on_any_cpu():
    """Compiled runs its program in every precision and at every size whatever this CPU's
    class: the program's results are under test here; where Compiled uses it is the policy's
    (tests/test_cpu.py)."""
    everything = frozenset(("float32", "bfloat16", "int8"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            cpu,
            "_CURRENT",
            [replace(cpu.current(), compiled=everything, not_compiled={}, compiled_tokens={})],
        )
        yield


CFG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
    num_labels=3,
)


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 99, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    model = BertModel(CFG.replace(attn_implementation="packed")).eval()
    return model, Compiled(model)


def test_unpadded_inputs_run_compiled_and_match_eager_at_every_length(base):
    model, fast = base
    # every call here gives the same inputs (ids, mask, token types), so one program answers
    # them all, as it does test_compiled_graphs_run_aligned_attention_and_exported_ones_sdpa's
    with torch.no_grad():
        for length in (5, 9, 17):  # one graph for every length (dynamic shapes)
            x = ids(1, length, seed=length)
            types = (torch.arange(length) >= length // 2).long()[None]
            mask = torch.ones_like(x)
            want = model(input_ids=x, token_type_ids=types).last_hidden_state
            got = fast(input_ids=x, attention_mask=mask, token_type_ids=types).last_hidden_state
            assert got.shape == want.shape
            assert (got - want).abs().max() < 1e-5
        x = ids(3, 7)  # a batch without padding is compiled too
        got = fast(x, torch.ones_like(x), torch.zeros_like(x)).last_hidden_state  # (positional)
        assert (got - model(x).last_hidden_state).abs().max() < 1e-5
    assert fast.calls["compiled"] == 4 and fast.calls["eager"] == 0 and len(fast._programs) == 1


def test_padded_batches_training_and_extra_outputs_run_the_model_itself(base):
    model, fast = base
    assert fast.precision == "float32" and PADDING_LIMIT["float32"] < 3 / 16
    x = ids(2, 8)
    mask = torch.ones_like(x)
    mask[1, 5:] = 0  # 3 of 16 positions padding: more than float32's limit
    before = dict(fast.calls)
    with torch.no_grad():
        assert torch.equal(fast(x, mask).last_hidden_state, model(x, mask).last_hidden_state)
        out = fast(input_ids=x[:1], output_hidden_states=True)
        assert len(out.hidden_states) == CFG.num_hidden_layers + 1
    grad = fast(input_ids=x[:1]).last_hidden_state  # gradient recorded: the model itself
    assert grad.requires_grad
    assert fast.calls["eager"] == before["eager"] + 3
    assert fast.calls["compiled"] == before["compiled"]


def test_batches_past_the_classes_positions_run_the_model_itself(base):
    """Where the CPU's class has the program win on short inputs only (cpu.COMPILED_TOKENS: on
    AVX2, float32 batches of at most 48 positions), a batch of more positions, rows times
    length, runs the model; either way the results agree."""
    model, fast = base
    fast.max_tokens = 12
    try:
        with torch.no_grad():
            for x, path in (
                (ids(1, 12), "compiled"),
                (ids(2, 6, seed=1), "compiled"),
                (ids(1, 13), "eager"),
                (ids(2, 7), "eager"),
            ):
                before = dict(fast.calls)
                ones, zeros = torch.ones_like(x), torch.zeros_like(x)  # (the program's inputs)
                got = fast(input_ids=x, attention_mask=ones, token_type_ids=zeros)
                assert (got.last_hidden_state - model(x).last_hidden_state).abs().max() < 1e-5
                assert fast.calls[path] == before[path] + 1, (tuple(x.shape), path)
    finally:
        fast.max_tokens = None
    assert len(fast._programs) == 1


def test_bad_input_gets_the_eager_models_errors(base):
    model, fast = base
    with torch.no_grad():
        for bad in (torch.tensor([[5, 99, 7]]), torch.tensor([[5, -1, 7]])):
            with pytest.raises(ValueError) as eager:
                model(input_ids=bad)
            with pytest.raises(ValueError) as compiled:
                fast(input_ids=bad)
            assert str(compiled.value) == str(eager.value)
            assert "outside the vocabulary (size 99)" in str(compiled.value)
        with pytest.raises(ValueError, match="longer than max_position_embeddings"):
            fast(input_ids=ids(1, 33))
        with pytest.raises(ValueError, match="token type id 2"):
            fast(input_ids=ids(1, 4), token_type_ids=torch.tensor([[0, 1, 2, 0]]))


def test_a_head_of_two_outputs_per_token_compiles_to_the_eager_results():
    """The question-answering head: a logit pair for every token, split in two outputs. The
    other heads' outputs are of shapes this test and the others compile: one vector per text
    (BertForSequenceClassification, in test_stale_weights_and_config_are_refused_..., at four
    shapes) and one per token (BertModel, through `base`); BertForTokenClassification is a
    linear layer over the tokens as this head is. Each compile costs 10-20 s on a 2-core CPU."""
    torch.manual_seed(1)
    model = BertForQuestionAnswering(CFG).eval()
    fast = Compiled(model)
    x = ids(1, 11, seed=3)
    with torch.no_grad():
        want, got = model(input_ids=x), fast(input_ids=x)
    for name in ("start_logits", "end_logits"):
        assert (getattr(got, name) - getattr(want, name)).abs().max() < 1e-5
    assert fast.calls["compiled"] == 1


def test_aligned_attention_pads_the_keys_to_16_and_equals_sdpa(monkeypatch):
    g = torch.Generator().manual_seed(4)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((k.shape[-2], v.shape[-2], None if attn_mask is None else attn_mask.shape))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    for length in (1, 9, 16, 17, 33):
        q, k, v = (torch.randn(3, 4, length, 8, generator=g) for _ in range(3))
        mask = torch.ones(3, length, dtype=torch.bool)
        mask[1, (length + 1) // 2 :] = False  # a padded row
        for m in (mask, None):
            want = attention.sdpa_attention(q, k, v, m, 0.0, False)[0]
            with monkeypatch.context() as patch:
                patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
                got, probs = attention.aligned_attention(q, k, v, m, 0.0, False)
            keys = -(-length // 16) * 16
            assert seen.pop() == (keys, keys, (3 if m is not None else 1, 1, 1, keys))
            assert probs is None and got.shape == want.shape
            assert (got - want).abs().max() < 1e-6, (length, m is None)
        # asked for the probabilities, it runs the written-out equation, on the keys given
        got, probs = attention.aligned_attention(q, k, v, mask, 0.0, True)
        assert probs.shape == (3, 4, length, length) and not seen


def test_compiled_graphs_run_aligned_attention_and_exported_ones_sdpa(base, monkeypatch):
    model, fast = base
    kernels = []
    for name in ("sdpa", "aligned"):
        kernel = attention.BACKENDS[name]
        monkeypatch.setitem(
            attention.BACKENDS, name, lambda *a, _k=kernel, _n=name: kernels.append(_n) or _k(*a)
        )
    x = ids(2, 17, seed=5)
    mask = torch.ones_like(x)
    mask[1, 15:] = 0  # 2 of 34 positions padding: under float32's limit, so compiled
    assert 2 / 34 <= PADDING_LIMIT["float32"]
    with torch.no_grad():
        got = torch.compile(model, dynamic=True, backend="eager")(x, mask).last_hidden_state
        assert set(kernels) == {"aligned"}
        want = model(x, mask).last_hidden_state
        real = mask.bool()
        assert (got[real] - want[real]).abs().max() < 1e-5
        before = fast.calls["compiled"]
        got = fast(x, mask, torch.zeros_like(x)).last_hidden_state  # (the program built above)
        assert (got[real] - want[real]).abs().max() < 1e-5
        assert fast.calls["compiled"] == before + 1
        kernels.clear()
        torch.export.export(model, (x, mask))  # exported graphs keep the plain equation
    assert set(kernels) == {"sdpa"}


def test_stale_weights_and_config_are_refused_and_one_program_serves_every_shape(
    monkeypatch, tmp_path
):
    # a temporary folder of the test's own: other processes compiling on the machine write theirs
    # into the shared one
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    torch.manual_seed(3)
    model = BertForSequenceClassification(CFG).eval()
    fast = Compiled(model)
    folders = set(Path(tempfile.gettempdir()).glob("bertlab-compiled-*"))
    assert Path(tempfile.gettempdir()) == tmp_path and not folders
    with torch.no_grad():
        for shape in ((1, 1), (1, 13), (4, 2), (5, 20)):  # built on the first, for all
            x = ids(*shape, seed=sum(shape))
            want, got = model(input_ids=x).logits, fast(input_ids=x).logits
            assert got.shape == want.shape and (got - want).abs().max() < 1e-5
        assert len(fast._programs) == 1 and fast.calls["compiled"] == 4
        model.config.output_hidden_states = True  # the program returns no hidden states
        with pytest.raises(RuntimeError, match=r"config changed .*\(output_hidden_states\)"):
            fast(input_ids=x)
        model.config.output_hidden_states = False  # as it was built: answered again
        assert (fast(input_ids=x).logits - want).abs().max() < 1e-5
        # the package it was compiled into is gone once loaded; close() frees the program,
        # and a later call compiles it again, on the weights as they are then (one compile
        # shows both: each costs about 10 s on a 2-core CPU)
        assert set(Path(tempfile.gettempdir()).glob("bertlab-compiled-*")) == folders
        fast.close()
        assert not fast._programs
        model.bert.encoder.layer[0].output.dense.weight.mul_(2)
        want = model(input_ids=x).logits
        assert (fast(input_ids=x).logits - want).abs().max() < 1e-5
        assert len(fast._programs) == 1
        # weights written in place while a program holds them: refused, never used
        model.bert.encoder.layer[1].output.dense.weight.mul_(2)
        with pytest.raises(RuntimeError, match="weights changed after it was compiled"):
            fast(input_ids=x)
        assert fast.calls["compiled"] == 6


@needs_int8
def test_int8_models_compile_within_int8_tolerance_of_their_eager_run():
    torch.manual_seed(3)
    model = BertModel(CFG).eval()
    calibration = [{"input_ids": ids(4, 10, seed=s)} for s in range(3)]
    int8 = quantize_int8(model, calibrate=calibration)
    fast = Compiled(int8)
    assert fast.precision == "int8"
    # the encoder of a quantized head model is int8 too: its padding limit is int8's
    from bertlab.nn.heads import HEADS

    mlm = quantize_int8(HEADS["masked-lm"](CFG).eval(), calibrate=calibration)
    assert Compiled(mlm.bert).precision == "int8" and not hasattr(mlm.bert, "int8_report")
    assert Compiled(model).precision == "float32"
    x = ids(1, 12, seed=9)
    with torch.no_grad():
        # (every call gives ids and mask: one program answers them all)
        want = int8(input_ids=x).last_hidden_state
        got = fast(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
        # the compiled graph fuses the activation quantisation: a value on a rounding boundary
        # may round the other way, one int8 step of that activation
        assert torch.nn.functional.cosine_similarity(got[0], want[0]).min() > 0.999
        # a batch with a little padding (2 of 12 positions, under int8's limit) runs compiled,
        # and a text's result does not depend on the padding beside it
        batch = torch.cat([x[:, :6], ids(1, 6, seed=10)])
        mask = torch.ones_like(batch)
        mask[0, 4:] = 0
        assert 2 / 12 <= PADDING_LIMIT["int8"]
        padded = fast(batch, mask).last_hidden_state
        alone = fast(input_ids=x[:, :4], attention_mask=mask[:1, :4]).last_hidden_state
        eager = int8(batch, mask).last_hidden_state
    assert fast.calls["compiled"] == 3 and fast.calls["eager"] == 0 and len(fast._programs) == 1
    real = mask.bool()
    assert torch.nn.functional.cosine_similarity(padded[real], eager[real]).min() > 0.999
    assert torch.nn.functional.cosine_similarity(padded[0, :4], alone[0]).min() > 0.999


@pytest.mark.skipif(bf16_supported() is not None, reason=f"bfloat16: {bf16_supported()}")
def test_bfloat16_models_compile_within_bfloat16_tolerance():
    torch.manual_seed(4)
    model = BertModel(CFG).eval().to(torch.bfloat16)
    fast = Compiled(model)
    x = ids(1, 12, seed=5)
    with torch.no_grad():
        want = model(input_ids=x).last_hidden_state.float()
        got = fast(input_ids=x).last_hidden_state.float()
    assert torch.nn.functional.cosine_similarity(got[0], want[0]).min() > 0.999


def test_what_compiling_needs_is_named_when_missing(monkeypatch, tmp_path):
    import sysconfig

    from bertlab.nn import compiled

    real = sysconfig.get_paths

    def no_headers(*args, **kwargs):
        return {**real(*args, **kwargs), "include": str(tmp_path)}

    monkeypatch.setattr(sysconfig, "get_paths", no_headers)
    why = Compiled.available()
    assert why is not None and str(tmp_path / "Python.h") in why and "python3-dev" in why
    with pytest.raises(RuntimeError, match="needs Python's C headers"):
        Compiled(BertModel(CFG).eval())
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    assert "C++ compiler" in Compiled.available() and "is not installed" in Compiled.available()


def test_compiled_takes_only_a_bertlab_model():
    with pytest.raises(TypeError, match="takes a bertlab model, got Linear"):
        Compiled(torch.nn.Linear(2, 2))


def test_pipelines_refuse_a_compile_that_is_not_a_bool():
    """(pipeline(..., compile=True) itself runs in tests/test_pipeline_compile.py)"""
    from bertlab import pipeline

    with pytest.raises(TypeError, match="compile must be True or False, got 'yes'"):
        pipeline("embed", compile="yes")


def test_length_groups_cut_sorted_lengths_under_the_padding_limit_and_row_cap():
    from bertlab.nn.compiled import length_groups

    lengths = [12, 3, 40, 11, 10, 39, 3, 25, 12, 4]
    for limit, cap in ((0.0, None), (0.1, None), (0.3, 3), (0.9, None)):
        groups = length_groups(lengths, limit, cap)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        flat = [lengths[i] for g in groups for i in g]
        assert flat == sorted(lengths)  # shortest first, each group a run of the sorted order
        for g in groups:
            longest = max(lengths[i] for i in g)
            assert 1 - sum(lengths[i] for i in g) / (longest * len(g)) <= limit + 1e-9
            assert cap is None or len(g) <= cap
    assert [len(g) for g in length_groups(lengths, 0.0)] == [2, 1, 1, 1, 2, 1, 1, 1]
    assert len(length_groups(lengths, 0.9)) == 1
    with pytest.raises(ValueError, match="limit must be a share of positions in \\[0, 1\\), got 1"):
        length_groups(lengths, 1)
    with pytest.raises(ValueError, match="lengths\\[1\\] is 0; a sequence has at least one token"):
        length_groups([4, 0], 0.1)

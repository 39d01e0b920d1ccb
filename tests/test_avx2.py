"""bertlab's AVX2 float32 kernels (bertlab/nn/avx2.py, sgemm_avx2.c, attention_avx2.c,
embeddings_avx2.c): products and attention against a float64 reference at every shape their
blocks meet, the embeddings against PyTorch's operations, the same bits on any thread count,
the whole model on them equal to PyTorch's own kernels, bad shapes refused by
name, and where they cannot be built (no compiler, a failed build) a warning and oneDNN's
products, or, where forced, an error saying why. The policy that chooses them is tested with
each CPU class simulated (test_cpu.py)."""

import ctypes
import dataclasses
import os
import stat
import tempfile
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import small_encoder

from bertlab.nn import avx2, cpu, products
from bertlab.nn.packing import Packing

WHY = avx2.load()
needs_kernel = pytest.mark.skipif(WHY is not None, reason=f"sgemm-avx2 cannot run here: {WHY}")


def weights(rows, k, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    return x, w, torch.randn(n, generator=g), torch.randn(rows, n, generator=g)


@needs_kernel
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [
        (1, 384, 384),  # one row: a block of 1
        (5, 384, 1152),  # blocks of 1 to 6 rows, below
        (6, 384, 384),
        (7, 64, 48),  # blocks of 3 and 4 (the rows shared evenly: sgemm_avx2.c's ROWS)
        (2, 64, 40),  # a block of 2
        (21, 384, 1536),  # a short sentence at the model's widths: 5, 5, 5 and 6
        (203, 1536, 384),  # many blocks, the feed-forward's long sums
        (13, 37, 2),  # one partial panel (a classifier's two labels)
        (9, 50, 17),  # a full panel and a partial one
        (4, 1, 33),  # a single input
        (10, 384, 384),  # sgemm-avx512's widest block, 10 rows
        (31, 64, 100),  # its blocks of 7 and 8; a partial panel's rows in blocks of up to 6
    ],
)
def test_products_equal_a_float64_reference_at_every_block_and_panel_shape(rows, k, n):
    x, w, b, add = weights(rows, k, n)
    panels = avx2.pack(w)
    assert panels.shape == (-(-n // 16), k, 16)
    want = F.linear(x.double(), w.double(), b.double())
    for bias, plus in [(b, None), (None, None), (b, add), (None, add)]:
        got = avx2.product(x, panels, bias, n, plus)
        ref = want - (0 if bias is not None else b.double()) + (0 if plus is None else plus)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        # float32 sums of k terms of size ~1: within a few units of float32's last place
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=2e-6 * k**0.5)
        if plus is None:  # GELU inside the product, before any sum
            got = avx2.product(x, panels, bias, n, None, True)
            torch.testing.assert_close(got.double(), F.gelu(ref), rtol=1e-5, atol=2e-6 * k**0.5)


AVX512F = "avx512_f" in cpu.features().flags  # (the instructions the wide blocks are built for)


@needs_kernel
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [(1, 384, 384), (10, 64, 48), (11, 384, 1152), (21, 384, 1536), (64, 1536, 384), (31, 37, 104)],
)
def test_the_wide_blocks_give_the_avx2_blocks_bits_or_are_refused_without_avx512f(rows, k, n):
    """sgemm-avx512 (``wide``) sums the same terms in the same order as sgemm-avx2, in blocks of
    up to 10 rows of 512-bit registers: the same bits, with every epilogue, on any thread count.
    On a CPU without AVX-512F it refuses by name and writes nothing (the kernel checks the CPU,
    never trying an instruction)."""
    x, w, b, add = weights(rows, k, n, seed=rows)
    panels = avx2.pack(w)
    g = torch.Generator().manual_seed(1)
    norm = avx2.Norm(torch.randn(n, generator=g), torch.randn(n, generator=g), 1e-12)
    threads = torch.get_num_threads()
    for epilogue in ({}, {"gelu": True}, {"add": add}, {"add": add, "norm": norm}):
        narrow = avx2.product(x, panels, b, n, wide=False, **epilogue)
        if not AVX512F:
            with pytest.raises(RuntimeError, match="sgemm-avx512.* need AVX-512F, which this CPU"):
                avx2.product(x, panels, b, n, wide=True, **epilogue)
            continue
        for t in (1, 2):
            torch.set_num_threads(t)
            try:
                wide = avx2.product(x, panels, b, n, wide=True, **epilogue)
            finally:
                torch.set_num_threads(threads)
            assert torch.equal(wide, narrow), (epilogue.keys(), t)


@needs_kernel
def test_gelu_inside_the_product_is_as_close_to_exact_gelu_as_pytorchs():
    """The kernel's GELU (erf by a rational fit, avx2_math.h) on every float32 from -12 to 12 in
    steps of 2.4e-4 and at the extremes, through a product with the identity: within 1e-6 of the
    float64 value, plus a unit of the last place. 1e-6 is what PyTorch's own float32 GELU keeps
    on an AVX2 CPU; its AVX-512 code reaches 1.2e-6, and gives inf at 3e38, so the bar is fixed
    rather than read from the PyTorch at hand."""
    z = torch.cat([torch.linspace(-12, 12, 100_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30,
                   50.0, -50.0, 1e4, -1e4, 3e38, -3e38])])  # fmt: skip
    rows = torch.cat([z, z.new_zeros(-z.numel() % 16)]).view(-1, 16)
    got = avx2.product(rows, avx2.pack(torch.eye(16)), None, 16, None, True).flatten()[: z.numel()]
    exact = F.gelu(z.double())
    err = (got.double() - exact).abs()
    assert (err <= 1e-6 + 1.2e-7 * exact.abs()).all(), z[err.argmax()]
    assert torch.isfinite(got).all()
    # NaN stays NaN, each value alone in its row (NaN times the identity's zeros is NaN too)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0] + [1.0] * 12)
    got = avx2.product(torch.diag(special), avx2.pack(torch.eye(16)), None, 16, None, True)
    assert got[0, 0].isnan() and got[1, 1] == float("inf") and got[2, 2] == 0 == got[3, 3]


@needs_kernel
def test_leading_dimensions_no_rows_and_a_view_as_input():
    x, w, b, _ = weights(12, 64, 40)
    panels = avx2.pack(w)
    batch = x.view(3, 4, 64)
    got = avx2.product(batch, panels, b, 40)
    assert got.shape == (3, 4, 40)
    torch.testing.assert_close(got, F.linear(batch, w, b), rtol=1e-5, atol=1e-5)
    strided = x.t().contiguous().t()  # the same numbers, not row-major
    torch.testing.assert_close(avx2.product(strided, panels, b, 40), F.linear(x, w, b),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert avx2.product(x[:0], panels, b, 40).shape == (0, 40)


@needs_kernel
def test_panels_and_inputs_at_any_address_give_the_same_bits():
    """Tensors whose data start a float past an aligned address (a view at an offset, a
    compiled program's constants): the kernel's loads need no alignment."""
    x, w, b, add = weights(9, 64, 40)
    panels = avx2.pack(w)
    want = avx2.product(x, panels, b, 40, add)

    def shifted(t):
        return torch.empty(t.numel() + 1)[1:].view(t.shape).copy_(t)

    got = avx2.product(shifted(x), shifted(panels), shifted(b), 40, shifted(add))
    assert shifted(panels).data_ptr() % 32 != 0 and torch.equal(got, want)


@needs_kernel
def test_every_thread_count_gives_the_same_bits():
    """Each output is one thread's sum, in input order, whatever the split."""
    x, w, b, add = weights(50, 384, 1152)
    panels = avx2.pack(w)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(avx2.product(x, panels, b, 1152, add))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@needs_kernel
def test_shapes_that_do_not_fit_are_refused_naming_them():
    x, w, b, add = weights(4, 64, 40)
    panels = avx2.pack(w)
    for bad in [
        lambda: avx2.product(x[:, :32], panels, b, 40),  # inputs
        lambda: avx2.product(x, panels, b, 48),  # outputs
        lambda: avx2.product(x, panels, b[:8], 40),
        lambda: avx2.product(x, panels, b, 40, add[:2]),
        lambda: avx2.product(x.double(), panels, b, 40),
        lambda: avx2.product(x, panels.transpose(0, 1).contiguous().transpose(0, 1), b, 40),
    ]:
        with pytest.raises(ValueError, match=r"avx2.product: input \(4, (64|32)\)"):
            bad()


def on_sgemm(monkeypatch, why="bertlab's AVX2 kernel, measured faster"):
    policy = dataclasses.replace(cpu.current(), float32_kernel="sgemm-avx2", few_rows="onednn",
                                 float32_kernel_why=why)  # fmt: skip
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    monkeypatch.setattr(products, "_SGEMM", [])


@needs_kernel
@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_model_on_sgemm_equals_pytorchs_own_products(dtype, monkeypatch):
    """Every layer's four products (query-key-value as one, the attention's output, the two of
    the feed-forward network) and the pooler's on the kernel, with the residual summed and the
    layer norm applied inside it; the hidden states equal those of nn.Linear within the dtype's
    tolerance."""
    on_sgemm(monkeypatch)
    calls = []
    real = avx2.product
    monkeypatch.setattr(avx2, "product", lambda *a: calls.append(a) or real(*a))
    model, ids, mask = small_encoder(dtype)
    if dtype == torch.bfloat16 and cpu.current().products[dtype] != "float32":
        pytest.skip("bfloat16 runs natively here, not by the float32 route")
    with torch.inference_mode():
        got = model(ids, mask, output_hidden_states=True)
        assert len(calls) == 4 * 3 + 1  # (and the pooler's)
        assert sum(len(c) > 4 and c[4] is not None for c in calls) == 2 * 3  # two sums a layer
        assert sum(len(c) > 5 and c[5] for c in calls) == 3  # GELU inside the product
        # and the layer norms in float32 (a bfloat16 model's run as its modules, in bfloat16)
        norms = sum(len(c) > 6 and c[6] is not None for c in calls)
        assert norms == (2 * 3 if dtype == torch.float32 else 0)
        model.set_fast_inference(False)
        want = model(ids, mask, output_hidden_states=True)
    assert len(calls) == 4 * 3 + 1
    real_tokens = mask.bool()
    tol = 1e-5 if dtype == torch.float32 else 2**-6
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(g[real_tokens].float(), w[real_tokens].float(), rtol=tol,
                                   atol=tol)  # fmt: skip


def _without_compiler(monkeypatch, tmp_path, compiler):
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(avx2, "_LOADED", [])


@pytest.mark.skipif(avx2.why_not() is not None, reason=f"{avx2.why_not()}")
def test_a_failed_build_says_why_and_leaves_nothing_half_written(monkeypatch, tmp_path):
    script = tmp_path / "cc"
    script.write_text("#!/bin/sh\necho 'error: this compiler builds nothing' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    _without_compiler(monkeypatch, tmp_path, script)
    why = avx2.load()
    assert why is not None and "could not build sgemm_avx2.c, attention_avx2.c" in why
    assert "this compiler builds nothing" in why
    kernels = tmp_path / "cache" / "bertlab" / "kernels"
    assert not list(kernels.iterdir())  # no half-written library to load next time
    with pytest.raises(RuntimeError, match="bertlab's AVX2 kernels cannot run here: .*could not"):
        avx2.product(torch.ones(1, 4), torch.ones(1, 4, 16), None, 16)


@pytest.mark.skipif(avx2.why_not() is not None, reason=f"{avx2.why_not()}")
def test_a_build_lands_in_the_cache_folder_under_its_final_name_only(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(avx2, "_LOADED", [])
    runtimes = avx2._gomp_paths()  # (other libraries may have brought their own libgomp)
    assert avx2.load() is None
    files = os.listdir(tmp_path / "cache" / "bertlab" / "kernels")
    assert len(files) == 1 and files[0].startswith("bertlab-avx2-")
    assert files[0].endswith(".so")
    # the kernel took PyTorch's OpenMP runtime, already loaded, and brought no other
    assert avx2._gomp_paths() == runtimes
    assert any(path.startswith(os.path.dirname(torch.__file__)) for path in runtimes)


@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_without_a_compiler_products_stay_on_onednn_saying_so_once(monkeypatch, tmp_path):
    _without_compiler(monkeypatch, tmp_path, tmp_path / "no-such-cc")
    on_sgemm(monkeypatch)
    model, ids, mask = small_encoder(torch.float32)
    with torch.inference_mode():
        with pytest.warns(UserWarning, match="float32 products run on oneDNN, not on bertlab's "
                                             "sgemm-avx2 kernel: no C compiler"):  # fmt: skip
            got = model(ids, mask).last_hidden_state
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the second call says nothing
            model(ids, mask)
        model.set_fast_inference(False)
        want = model(ids, mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_a_forced_kernel_that_cannot_be_built_is_an_error_naming_why(monkeypatch, tmp_path):
    _without_compiler(monkeypatch, tmp_path, tmp_path / "no-such-cc")
    on_sgemm(monkeypatch, why="forced by BERTLAB_FLOAT32_KERNEL=sgemm-avx2")
    model, ids, mask = small_encoder(torch.float32)
    with (
        torch.inference_mode(),
        pytest.raises(
            RuntimeError, match="BERTLAB_FLOAT32_KERNEL=sgemm-avx2, but it cannot run here: no C"
        ),
    ):
        model(ids, mask)


@needs_kernel
@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_inference_tensor_weights_take_pytorchs_product(monkeypatch):
    """Weights made under inference_mode keep no version counter, so no panels are packed for
    them (a stale copy could not be told apart): F.linear computes, with the same numbers."""
    on_sgemm(monkeypatch)
    calls = []
    real = avx2.product
    monkeypatch.setattr(avx2, "product", lambda *a: calls.append(a) or real(*a))
    with torch.inference_mode():
        layer = torch.nn.Linear(64, 40)
        x = torch.randn(5, 64)
        got = products.linear(layer, x)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    assert not calls and layer not in products._PACKED["sgemm"]


@pytest.mark.skipif(avx2.why_not() is not None, reason=f"{avx2.why_not()}")
def test_an_unwritable_cache_folder_builds_in_a_fresh_private_one(monkeypatch, tmp_path):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")  # mkdir beneath it fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read TMPDIR again)
    monkeypatch.setattr(avx2, "_LOADED", [])
    assert avx2.load() is None
    (private,) = (tmp_path / "tmp").iterdir()
    assert (
        private.name.startswith("bertlab-kernels-")
        and stat.S_IMODE(private.stat().st_mode) == 0o700
    )
    assert [f.name.startswith("bertlab-avx2-") for f in private.iterdir()] == [True]


# ============================================================================ attention
def packed_qkv(lengths, heads, d, seed=0):
    """q, k, v (N, heads, d) as views of one (N, 3 * heads * d) product output, as the model
    makes them, and the packing of sequences of ``lengths``."""
    g = torch.Generator().manual_seed(seed)
    n, width = sum(lengths), heads * d
    qkv = torch.randn(n, 3 * width, generator=g)
    q, k, v = (t.view(n, heads, d) for t in qkv.split(width, -1))
    longest = max(lengths)
    mask = torch.arange(longest)[None] < torch.tensor(lengths)[:, None]
    return q, k, v, Packing.from_mask(mask, len(lengths), longest, torch.device("cpu"))


def reference_attention(q, k, v, lengths):
    """softmax(q k^T / sqrt(d)) v of each sequence alone, in float64."""
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start : start + n].double().transpose(0, 1) for t in (q, k, v))
        p = (qs @ ks.transpose(1, 2) * q.shape[-1] ** -0.5).softmax(-1)
        out.append((p @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


@needs_kernel
@pytest.mark.parametrize(
    ("lengths", "heads", "d"),
    [
        ((21,), 12, 32),  # a short sentence at the bundled model's shape
        ((1,), 2, 32),  # one token: its own value
        ((9, 30, 1, 33, 17), 4, 64),  # mixed lengths, past a multiple of 32 keys, 1-4 registers
        ((96,), 2, 8),  # past the longest the policy gives it, the narrowest head
        ((7, 40), 3, 24),  # a head of 24: a partial block of outputs
    ],
)
def test_attention_equals_a_float64_reference_for_every_sequence_on_its_own(lengths, heads, d):
    q, k, v, packing = packed_qkv(lengths, heads, d)
    got = avx2.attention(q, k, v, packing.cu_seqlens, packing.max_seqlen)
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference_attention(q, k, v, lengths), rtol=1e-5,
                               atol=2e-6)  # fmt: skip


@needs_kernel
def test_attention_keeps_large_scores_exact_and_gives_the_same_bits_on_every_thread_count():
    """Scores of hundreds (the largest subtracted before e^x, none overflowing; the smallest
    weights vanish), and each (sequence, head) computed by one thread, whatever the split."""
    lengths = (50, 3, 64, 20)
    q, k, v, packing = packed_qkv(lengths, 6, 32, seed=1)
    q = q * 40  # scores up to a few hundred
    want = reference_attention(q, k, v, lengths)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(avx2.attention(q, k, v, packing.cu_seqlens, packing.max_seqlen))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert torch.isfinite(outs[0]).all()
    # float32 scores of hundreds carry rounding of about 1e-5 in any kernel: as close to the
    # float64 reference as PyTorch's own float32 attention
    start, pieces = 0, []
    for n in lengths:
        qs, ks, vs = (t[start : start + n].transpose(0, 1) for t in (q, k, v))
        pieces.append(F.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1))
        start += n
    theirs = (torch.cat(pieces).double() - want).abs().max()
    ours = (outs[0].double() - want).abs().max()
    assert ours <= 2 * theirs + 1e-6, (ours, theirs)


@needs_kernel
def test_attention_refuses_what_it_cannot_read_naming_it():
    q, k, v, packing = packed_qkv((5, 6), 2, 32)
    starts, longest = packing.cu_seqlens, packing.max_seqlen
    narrow = torch.randn(11, 2, 12)
    for bad in [
        lambda: avx2.attention(q.double(), k, v, starts, longest),
        lambda: avx2.attention(narrow, narrow, narrow, starts, longest),  # head of 12
        lambda: avx2.attention(q, k[:10], v, starts, longest),
        lambda: avx2.attention(
            q.transpose(1, 2).contiguous().transpose(1, 2), k, v, starts, longest
        ),  # fmt: skip
        lambda: avx2.attention(q, k, v, starts.long(), longest),
    ]:
        with pytest.raises(ValueError, match=r"avx2.attention: q \(11, 2, (32|12)\)"):
            bad()
    # starts that would send the kernel past the tensors or its scratch: refused
    for wrong, most in [([0, 5, 12], 7), ([0, 5, 10], 6), ([1, 5, 11], 6), ([0, 6, 5, 11], 6),
                        ([0, 5, 11], 5)]:  # fmt: skip
        with pytest.raises(ValueError, match=r"avx2.attention: starts \[.*\] must rise from 0 "
                                             r"to the 11 rows"):  # fmt: skip
            avx2.attention(q, k, v, torch.tensor(wrong, dtype=torch.int32), most)


def spy_attention(monkeypatch):
    calls = []
    real = avx2.attention
    monkeypatch.setattr(avx2, "attention", lambda *a: calls.append(a) or real(*a))
    return calls


@needs_kernel
@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_the_model_runs_attention_on_the_kernel_where_the_policy_says_and_only_then(monkeypatch):
    """Float32 inference on sgemm-avx2's policy: every layer's attention is one call of the
    kernel, and the hidden states equal those of PyTorch's attention kernel. Not under
    another float32 kernel, not where a gradient is recorded, not past ATTENTION_TOKENS."""
    on_sgemm(monkeypatch)
    calls = spy_attention(monkeypatch)
    model, ids, mask = small_encoder(torch.float32)
    with torch.inference_mode():
        got = model(ids, mask).last_hidden_state
    assert len(calls) == 3
    monkeypatch.setattr(avx2, "ATTENTION_TOKENS", 29)  # the longest row has 30 tokens
    with torch.inference_mode():
        want = model(ids, mask).last_hidden_state
    assert len(calls) == 3
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(avx2, "ATTENTION_TOKENS", 64)
    model(ids, mask).last_hidden_state.sum().backward()  # a gradient recorded
    assert len(calls) == 3
    policy = dataclasses.replace(cpu.current(), float32_kernel="onednn")
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    with torch.inference_mode():
        model(ids, mask)
    assert len(calls) == 3


@needs_kernel
@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_the_layer_norm_runs_inside_the_product_only_where_nothing_must_see_it(monkeypatch):
    """``norm=``: inside the kernel in inference; called as its module where a hook watches it
    or a gradient is recorded for it, with the same numbers up to rounding."""
    on_sgemm(monkeypatch)
    calls = []
    real = avx2.product
    monkeypatch.setattr(avx2, "product", lambda *a: calls.append(a) or real(*a))
    torch.manual_seed(0)
    layer, norm = torch.nn.Linear(48, 64), torch.nn.LayerNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    x, residual = torch.randn(7, 48), torch.randn(7, 64)
    want = F.layer_norm(F.linear(x, layer.weight, layer.bias) + residual, (64,), norm.weight,
                        norm.bias, norm.eps)  # fmt: skip
    with torch.no_grad():
        got = products.linear(layer, x, residual=residual, norm=norm)
    assert calls[-1][6] is not None  # inside
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seen = []
    handle = norm.register_forward_hook(lambda m, args, out: seen.append(out))
    with torch.no_grad():
        hooked = products.linear(layer, x, residual=residual, norm=norm)
    handle.remove()
    assert calls[-1][6] is None and len(seen) == 1 and seen[0] is hooked  # the module ran
    torch.testing.assert_close(hooked, want, rtol=1e-5, atol=1e-5)
    layer.requires_grad_(False)  # the product without a gradient, the norm with one
    trained = products.linear(layer, x, residual=residual, norm=norm)
    assert calls[-1][6] is None and trained.grad_fn is not None
    trained.sum().backward()
    assert norm.weight.grad is not None
    bare = torch.nn.LayerNorm(64, elementwise_affine=False)  # no weight: its module
    with torch.no_grad():
        products.linear(layer, x, residual=residual, norm=bare)
    assert calls[-1][6] is None


@needs_kernel
@pytest.mark.parametrize("levels", [127, 63])
def test_the_one_pass_rounding_gives_precision_pys_int8_rows_bit_for_bit(levels):
    """avx2.quantize (onednn-s8's rounding in eager mode) against precision._quantize_rows: the
    same int8 rows and scales, with and without smoothing, at input widths off the 8-float
    step, a row of zeros, halves (rounded to even) and rows enough to run on every thread."""
    from bertlab.nn import precision

    g = torch.Generator().manual_seed(0)
    for rows, k in ((21, 384), (1, 37), (700, 1536), (3, 5)):
        x = torch.randn(rows, k, generator=g) * 3
        x[0] = 0
        if k >= 8:
            x[-1, :8] = torch.tensor([0.5, -0.5, 1.5, -2.5, 127.0, -127.0, 63.0, 2.5])
        unsmooth = torch.rand(k, generator=g) + 0.5
        for smooth in (None, unsmooth):
            q, scale = avx2.quantize(x, smooth, levels)
            want_q, want_scale = precision._quantize_rows(
                x * smooth if smooth is not None else x.clone(), levels=levels
            )
            assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
            assert q.dtype == torch.int8 and int(q.abs().max()) <= levels
    with pytest.raises(ValueError, match=r"avx2.quantize: .* levels 128: float32 \(R, K\)"):
        avx2.quantize(x, None, 128)
    with pytest.raises(ValueError, match=r"avx2.quantize: x \(3, 5\) torch.float64"):
        avx2.quantize(x.double(), None, levels)
    with pytest.raises(ValueError, match=r"unsmooth \(\(4,\), torch.float32\)"):
        avx2.quantize(x, unsmooth[:4], levels)


def _onednn_s8_model(monkeypatch):
    """The small int8 model and its batch, on onednn-s8 (forced, as BERTLAB_INT8_KERNEL would:
    the test skips, saying why, where this CPU cannot run it)."""
    from bertlab.nn import precision

    policy = cpu.policy(cpu.features(), {"BERTLAB_INT8_KERNEL": "onednn-s8"})
    if policy.int8_kernel is None:
        pytest.skip(policy.int8_why)
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    monkeypatch.setattr(precision, "_KERNEL", [])
    model, ids, mask = small_encoder(torch.float32)
    return precision.quantize_int8(model), ids, mask


@needs_kernel
def test_eager_onednn_s8_products_round_in_one_pass_and_keep_their_numbers(monkeypatch):
    """Where the int8 kernel is onednn-s8 and bertlab's kernels load, an eager int8 model rounds
    each product's activations with avx2.quantize, and its outputs equal those of the same
    model rounding with PyTorch's operations (the same int8 rows, the same sums)."""
    from bertlab.nn import precision

    q, ids, mask = _onednn_s8_model(monkeypatch)
    calls = []
    real = avx2.quantize
    monkeypatch.setattr(avx2, "quantize", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        got = q(ids, mask).last_hidden_state
    assert len(calls) == 3 * 4 + 1  # (each layer: the projections as one, three more; the pooler)

    def by_pytorch(x, unsmooth, levels):  # (the operations it replaced)
        return precision._quantize_rows(x * unsmooth if unsmooth is not None else x.clone(),
                                        levels=levels)  # fmt: skip

    monkeypatch.setattr(avx2, "quantize", by_pytorch)
    with torch.inference_mode():
        want = q(ids, mask).last_hidden_state
    assert torch.equal(got, want)


@needs_kernel
def test_the_one_pass_scaling_back_equals_pytorchs_with_its_epilogue():
    """avx2.dequantize against the same arithmetic in PyTorch: int32 sums times the weight's
    and the rows' scales plus the bias, a residual and a layer norm, at widths off the
    8-float step and rows enough to run on every thread; bad shapes are refused by name."""
    g = torch.Generator().manual_seed(0)
    for rows, n in ((21, 384), (3, 37), (700, 64)):
        acc = torch.randint(-3000, 3000, (rows, n), generator=g, dtype=torch.int32)
        ascale, wscale = torch.rand(rows, 1, generator=g) / 500, torch.rand(n, generator=g)
        bias, add = torch.randn(n, generator=g), torch.randn(rows, n, generator=g)
        y = torch.addcmul(bias, acc * wscale, ascale)
        close = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(avx2.dequantize(acc, ascale, wscale, bias), y, **close)
        torch.testing.assert_close(avx2.dequantize(acc, ascale, wscale, None, add),
                                   y - bias + add, **close)  # fmt: skip
        torch.testing.assert_close(avx2.dequantize(acc, ascale, wscale, bias, add), y + add,
                                   **close)  # fmt: skip
        if n % 8 == 0:
            norm = avx2.Norm(torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g), 1e-12)
            got = avx2.dequantize(acc, ascale, wscale, bias, add, norm)
            torch.testing.assert_close(got, F.layer_norm(y + add, (n,), *norm), **close)
    with pytest.raises(ValueError, match=r"avx2.dequantize: acc \(700, 64\) torch.float32"):
        avx2.dequantize(acc.float(), ascale, wscale)
    with pytest.raises(ValueError, match=r"wscale \(63,\)"):
        avx2.dequantize(acc, ascale, wscale[:63])


@needs_kernel
def test_eager_onednn_s8_layers_run_in_three_calls_with_the_unfused_numbers(monkeypatch):
    """Where the int8 kernel is onednn-s8, each eager product runs as precision.s8_product (the
    rounding, oneDNN's sums, the scaling with its epilogue), and the model's outputs equal
    those of the operations it replaced within float32 rounding."""
    from bertlab.nn import precision

    q, ids, mask = _onednn_s8_model(monkeypatch)
    calls = []
    real = precision.s8_product
    monkeypatch.setattr(products, "s8_product", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(precision, "s8_product", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        got = q(ids, mask).last_hidden_state
    assert len(calls) == 3 * 4 + 1
    for module in (products, precision):
        monkeypatch.setattr(module, "s8_in_one_pass", lambda weight, rows: False)
    with torch.inference_mode():
        want = q(ids, mask).last_hidden_state
    real_rows = mask.bool()
    torch.testing.assert_close(got[real_rows], want[real_rows], rtol=1e-4, atol=1e-4)


def tables(h, seed=0):
    g = torch.Generator().manual_seed(seed)
    word, types, pos = (torch.randn(rows, h, generator=g) for rows in (50, 2, 40))
    norm = avx2.Norm(torch.rand(h, generator=g) + 0.5, torch.randn(h, generator=g), 1e-12)
    return word, types, pos, norm


@needs_kernel
@pytest.mark.parametrize(("n", "h"), [(1, 8), (21, 384), (300, 384)])  # 300 x 384: on 2 threads
def test_embed_gives_the_tables_rows_summed_and_normalized(n, h):
    """avx2.embed: (word[ids] + type[types]) + pos[positions], normalized, against PyTorch's
    operations (the layer norm's rounding apart), types None as all 0; the same bits on any
    thread count."""
    word, types, pos, norm = tables(h)
    g = torch.Generator().manual_seed(n)
    ids, kinds = torch.randint(0, 50, (n,), generator=g), torch.randint(0, 2, (n,), generator=g)
    positions = torch.randint(0, 40, (n,), generator=g)
    for given in (kinds, None):
        got = avx2.embed(ids, given, positions, word, types, pos, norm)
        chosen = kinds if given is not None else torch.zeros_like(kinds)
        want = F.layer_norm((word[ids] + types[chosen]) + pos[positions], (h,), norm.weight,
                            norm.bias, norm.eps)  # fmt: skip
        assert got.shape == (n, h) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = avx2.embed(ids, kinds, positions, word, types, pos, norm)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, avx2.embed(ids, kinds, positions, word, types, pos, norm))


@needs_kernel
def test_embed_refuses_what_it_cannot_read_naming_it():
    word, types, pos, norm = tables(16)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"ids \(3,\) torch.int32.*int64 \(n,\) indices"):
        avx2.embed(ids.int(), None, ids, word, types, pos, norm)
    with pytest.raises(ValueError, match="H a multiple of 8"):
        odd = word[:, :12].contiguous()
        avx2.embed(ids, None, ids, odd, types[:, :12].contiguous(), pos[:, :12].contiguous(),
                   norm)  # fmt: skip
    with pytest.raises(ValueError, match=r"outside its table \(ids < 50, types < 2"):
        avx2.embed(torch.tensor([1, 50, 3]), None, ids, word, types, pos, norm)
    with pytest.raises(ValueError, match="outside its table"):
        avx2.embed(ids, torch.tensor([0, 2, 0]), ids, word, types, pos, norm)


@needs_kernel
@pytest.mark.skipif(not products._onednn_here(), reason="float32 takes PyTorch's kernels here")
def test_the_embeddings_run_on_the_kernel_where_the_policy_says_and_only_then(monkeypatch):
    """Float32 inference on sgemm-avx2's policy: the embeddings are one call of the kernel a
    forward, and the hidden states equal those of their modules. Not where a gradient is
    recorded, a hook watches a table, dropout is on, the ids are int32 (the kernel reads int64),
    set_fast_inference(False) sends everything through the modules, or the float32 kernel is
    another."""
    on_sgemm(monkeypatch)
    calls = []
    real = avx2.embed
    monkeypatch.setattr(avx2, "embed", lambda *a: calls.append(a) or real(*a))
    model, ids, mask = small_encoder(torch.float32)
    types = (torch.arange(30) >= 12).long().expand(3, 30)
    with torch.inference_mode():
        got = model(ids, mask, types)
    assert len(calls) == 1 and calls[0][0].shape == (int(mask.sum()),)  # the real tokens only
    model.set_fast_inference(False)
    with torch.inference_mode():
        want = model(ids, mask, types)
    assert len(calls) == 1
    real_tokens = mask.bool()
    got, want = got.last_hidden_state[real_tokens], want.last_hidden_state[real_tokens]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model.set_fast_inference(True)
    with torch.inference_mode():
        model(ids, mask, types)
        narrow = model(ids.int(), mask, types.int()).last_hidden_state  # int32: the modules
    assert len(calls) == 2
    torch.testing.assert_close(narrow[real_tokens], want, rtol=1e-5, atol=1e-5)
    model(ids, mask).last_hidden_state.sum().backward()  # a gradient recorded
    handle = model.embeddings.word_embeddings.register_forward_hook(lambda *a: None)
    with torch.inference_mode():
        model(ids, mask)
    handle.remove()
    model.train()  # dropout on
    with torch.no_grad():
        model(ids, mask)
    model.eval()
    policy = dataclasses.replace(cpu.current(), float32_kernel="onednn")
    monkeypatch.setattr(cpu, "_CURRENT", [policy])
    with torch.inference_mode():
        model(ids, mask)
    assert len(calls) == 2


# ============================================================================ the team (team.c)
LATE_NS = 300_000  # team.c's LATE
CALL_NS = 1_000_000  # a call of 1 ms: LATE is more than a quarter of it (team.c's SHARE)
SHORT_CALL = 21  # rows: a short sentence (team.c's SHORT: 64)


def _waited(*ns):
    return (ctypes.c_int64 * len(ns))(*ns)


@needs_kernel
def test_a_call_kept_waiting_by_a_thread_off_its_core_holds_the_team_back_then_tries_again():
    """team.c: after two calls in a row where a thread waited LATE or more at a barrier (and a
    quarter of the call), the next short calls take as many threads as waited (the others were
    off their cores), for 16 calls, then 32 after the next late call; a call whose team arrived
    in time ends that. A call of more than 64 rows (a batch's) always takes the whole team."""
    f = avx2._kernels()
    avx2.adaptive_team(True)  # (clears any hold the tests before left)
    try:
        assert f.team(2, SHORT_CALL) == 2 and f.team(1, SHORT_CALL) == 1
        f.team_waited(_waited(LATE_NS - 1, 0), 2, CALL_NS)  # in time: nothing changes
        assert f.team(2, SHORT_CALL) == 2
        f.team_waited(_waited(2_000_000, 0), 2, 10_000_000)  # a fifth of a long call: in time
        assert f.team(2, SHORT_CALL) == 2
        f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)  # thread 0 waited for thread 1
        # (once may be the host's interruption of a virtual machine)
        assert f.team(2, SHORT_CALL) == 2
        f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)  # twice in a row: held back
        assert [f.team(2, SHORT_CALL) for _ in range(16)] == [1] * 16
        assert f.team(2, SHORT_CALL) == 2  # tried again
        f.team_waited(_waited(0, LATE_NS * 3), 2, CALL_NS)  # late again: twice as long
        assert [f.team(2, SHORT_CALL) for _ in range(32)] == [1] * 32 and f.team(2, SHORT_CALL) == 2
        f.team_waited(_waited(5_000, 20_000), 2, CALL_NS)  # in time: the next hold is 16 again
        for _ in range(2):
            f.team_waited(_waited(LATE_NS, LATE_NS, LATE_NS, 0), 4, CALL_NS)  # 3 waited for a 4th
        assert [f.team(4, SHORT_CALL) for _ in range(16)] == [3] * 16 and f.team(4, SHORT_CALL) == 4
        assert f.team(2, SHORT_CALL) == 2
        f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)
        for _ in range(2):
            f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)
        assert f.team(2, 65) == 2  # a batch's rows: never held back
        assert f.team(2, SHORT_CALL) == 1
        assert avx2.adaptive_team(False) is True  # off: every call takes its threads
        for _ in range(2):
            f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)
        assert [f.team(2, SHORT_CALL) for _ in range(20)] == [2] * 20
        assert avx2.adaptive_team(False) is False
    finally:
        avx2.adaptive_team(True)


@needs_kernel
def test_a_held_back_team_gives_the_same_bits():
    """Whatever team a call takes, each output is one thread's sum in one order."""
    x, w, b, add = weights(50, 384, 1152)
    panels = avx2.pack(w)
    norm = avx2.Norm(torch.randn(1152), torch.randn(1152), 1e-12)
    scale = w.abs().amax(1) / 127
    layer = avx2.pack_int8((w / scale[:, None]).round().to(torch.int8), scale, b, 63)
    f = avx2._kernels()
    threads = torch.get_num_threads()
    avx2.adaptive_team(True)
    try:
        torch.set_num_threads(2)
        whole = avx2.product(x, panels, b, 1152, add, norm=norm), avx2.qproduct(x, layer)
        for _ in range(2):  # the next 16 calls on one thread
            f.team_waited(_waited(LATE_NS, 0), 2, CALL_NS)
        held = avx2.product(x, panels, b, 1152, add, norm=norm), avx2.qproduct(x, layer)
        assert f.team(2, SHORT_CALL) == 1  # (still held: the two calls above ran on one thread)
    finally:
        avx2.adaptive_team(True)
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(whole, held, strict=True))


def test_the_activation_after_a_kernel_runs_with_mkls_threads_at_one_then_as_before():
    """avx2.vector_math_alone: MKL's thread-local count (which torch.set_num_threads sets) is 1
    while the operation runs, and what it was afterwards (also when the operation raises)."""
    local = avx2._mkl_local()
    if local is None:
        pytest.skip("this PyTorch has no MKL inside libtorch_cpu (MKL_Set_Num_Threads_Local)")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    was = local(5)  # a count to find again (MKL_Set_Num_Threads_Local returns the one before)
    try:
        seen = []
        y = avx2.vector_math_alone(torch.zeros(3), lambda t: seen.append(local(1)) or t.tanh())
        assert seen == [1] and torch.equal(y, torch.zeros(3))
        assert local(5) == 5  # set back
        with pytest.raises(ZeroDivisionError):
            avx2.vector_math_alone(torch.zeros(1), lambda t: 1 / 0)
        assert local(5) == 5
    finally:
        local(was)
        torch.set_num_threads(threads)

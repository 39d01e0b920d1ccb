"""Shared by the parity, packed-path, product-seam and int8 tests."""

from dataclasses import replace

import pytest
import torch

from bertlab import BertConfig, BertModel
from bertlab.nn import cpu
from bertlab.nn.precision import int8_supported

# int8 runs where this machine has a kernel for it (bertlab.nn.cpu: x86 from AVX2 up, and Arm).
# Elsewhere (x86 without AVX2) a test that needs it skips, naming what the CPU lacks; the
# refusal itself is tested on simulated feature sets.
needs_int8 = pytest.mark.skipif(
    int8_supported() is not None, reason=f"int8 does not run here: {int8_supported()}"
)


def skylake_x(here: cpu.Features) -> cpu.Features:
    """The CPU at hand as an Intel Skylake-X: class avx512 (AVX-512 without VNNI), where
    ``Compiled`` was not measured and runs the model itself. An Intel CPU, because on an AMD one
    of family 25 these flags are a Zen 4, whose policy takes bertlab's AVX-512F kernel, which the
    CPU running the test may not have."""
    flags = frozenset({"avx512_f", "avx512_bw", "avx512_vl", "avx2", "fma3"})
    return replace(here, arch="x86_64", flags=flags, vendor="GenuineIntel", family=6)


def scramble(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Give every parameter a random value (LayerNorm weights around 1, not BERT's 1/0 init and
    zero biases), so a swapped or ignored weight shows up far above any tolerance."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.2 * noise)
    return model


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def small_encoder(dtype, kernel="packed", head=None):
    """A 3-layer model of width 64 (``head``: BertModel by default) in ``dtype`` with the
    attention kernel ``kernel``, and a batch of 3 rows of 30 ids, two of them padded."""
    cfg = BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    ).replace(attn_implementation=kernel)
    torch.manual_seed(0)
    model = (head or BertModel)(cfg).eval().to(dtype)
    ids = torch.randint(1, 99, (3, 30))
    mask = torch.ones_like(ids)
    mask[0, 21:] = 0
    mask[2, 4:] = 0
    return model, ids, mask


def bundled_model_in_int8() -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """The bundled model's sentence embeddings of 100 real SST-2 sentences in float32 and in
    int8 (calibrated on 64 others, on the int8 kernel the policy names now), and the int8 copy."""
    import bertlab
    from bertlab.data import sample_sentences
    from bertlab.files import resolve_model_dir
    from bertlab.nn.precision import quantize_int8, text_batches
    from bertlab.pipelines import pipeline

    path = resolve_model_dir("default")
    tokenizer = bertlab.BertTokenizer.from_pretrained(path)
    model = bertlab.BertModel.from_pretrained(path).eval()
    texts = sample_sentences(100, "sst2_dev.tsv")
    reference = torch.as_tensor(pipeline("embed", model, tokenizer=tokenizer)(texts))
    calibration = text_batches(tokenizer, sample_sentences(64, "sst2_train.tsv"))
    q = quantize_int8(model, calibrate=calibration)
    return reference, torch.as_tensor(pipeline("embed", q, tokenizer=tokenizer)(texts)), q

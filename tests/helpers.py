"""Shared by the parity, packed-path, product-seam and int8 tests."""

import pytest
import torch

from bertlab import BertConfig, BertModel
from bertlab.nn.precision import int8_supported

# int8 runs where this machine has a kernel for it (bertlab.nn.cpu: x86 from AVX2 up). Elsewhere
# (Arm, x86 without AVX2) a test that needs it skips, naming what the CPU lacks; the refusal
# itself is tested on simulated feature sets.
needs_int8 = pytest.mark.skipif(
    int8_supported() is not None, reason=f"int8 does not run here: {int8_supported()}"
)


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

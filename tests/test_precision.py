"""bfloat16, torch.compile and int8: each changes results only within its dtype's tolerance."""

import pytest
import torch

from bertlab import BertConfig, BertForSequenceClassification, BertModel
from bertlab.nn.precision import quantize_int8

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
    with torch.no_grad():
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


def test_int8_quantisation_keeps_the_original_and_stays_close():
    torch.manual_seed(0)
    model = BertForSequenceClassification(CFG).eval()
    quantized = quantize_int8(model)
    assert isinstance(model.classifier, torch.nn.Linear)  # the original is untouched
    assert type(quantized.classifier) is not torch.nn.Linear
    ids, mask = batch()
    with torch.no_grad():
        want, got = model(ids, mask).logits, quantized(ids, mask).logits
    assert not torch.equal(want, got)  # it really is quantised
    assert (want - got).abs().max() < 0.05 * want.abs().max() + 1e-3

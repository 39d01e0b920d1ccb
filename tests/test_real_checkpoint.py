"""The real bundled checkpoint (all-MiniLM-L6-v2: 6 layers, hidden 384, uncased vocabulary)
against transformers and sentence-transformers on real sentences. Nothing is downloaded."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.nn.functional as F

import bertlab

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers / huggingface_hub read it

import transformers  # noqa: E402

ATOL = 1e-5
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "BERT reads the whole sentence at once, left and right context together, which lets it "
    "represent each word by everything around it.",
    "Hello!",
]
PAIR = ("How old is the universe?", "About 13.8 billion years, according to the Planck data.")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Fail any attempt to open an internet connection (nothing may be downloaded)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    real_connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access attempted: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(scope="module")
def model_dir():
    d = bertlab.bundled_model_dir()
    assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()
    return d


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def hf_models(model_dir):
    """transformers with each attention kernel: bertlab is compared kernel for kernel (eager and
    sdpa round differently, by up to ~5e-5 on the hidden states of padding positions)."""
    return {
        attn: transformers.BertModel.from_pretrained(
            str(model_dir), attn_implementation=attn
        ).eval()
        for attn in ("eager", "sdpa")
    }


@pytest.fixture(scope="module")
def ours(model_dir):
    model, info = bertlab.BertModel.from_pretrained(model_dir, output_loading_info=True)
    return model, info


def assert_close(got: torch.Tensor, ref: torch.Tensor, what: str, atol: float = ATOL) -> None:
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: {tuple(got.shape)} != {ref.shape}"
    diff = (got.double() - ref.double()).abs().max().item()
    assert diff <= atol, f"{what}: max abs difference {diff:.3g} > {atol}"


def test_loads_with_strict_key_accounting(ours, model_dir):
    model, info = ours
    assert info.missing_keys == []
    assert info.unexpected_keys == []
    assert info.mismatched_keys == []
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (6, 384, 12)
    assert (c.vocab_size, c.intermediate_size, c.hidden_act) == (30522, 1536, "gelu")
    # strict=True accepts it as well (nothing missing, nothing unused).
    bertlab.BertModel.from_pretrained(model_dir, strict=True)
    # Every weight is the one in the file.
    state = bertlab.read_state_dict(model_dir)
    own = model.state_dict()
    for key, tensor in state.items():
        key = bertlab.io.checkpoint.canonical_key(key)
        if key in own:
            assert torch.equal(own[key], tensor), key


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_batch_matches_transformers(attn, ours, hf_models, tokenizer):
    model = ours[0]
    model.set_attn_implementation(attn)
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert enc["attention_mask"].eq(0).any(), "the batch should contain padding"
    with torch.no_grad():
        ref = hf_models[attn](**enc, output_hidden_states=True)
        got = model(**enc, output_hidden_states=True)
    assert len(got.hidden_states) == len(ref.hidden_states) == 7
    # bertlab's inference products run on the CPU class's kernels (oneDNN, or bertlab's AVX2
    # ones), their sums ordered differently from the BLAS transformers calls: within 1e-5 at
    # the real tokens. Padding positions mean nothing (each layer sends them a little further
    # from the real ones' values, which reach 9 in size there); they stay within 3e-4 (within
    # 1e-4 on oneDNN's products, up to 1.4e-4 on an AVX2-only EPYC's kernels).
    # With fast inference off, every position is equal bit for bit (the test below).
    real = enc["attention_mask"].bool()
    for i, (g, r) in enumerate(zip(got.hidden_states, ref.hidden_states, strict=True)):
        assert_close(g[real], r[real], f"hidden_states[{i}]")
        assert_close(g[~real], r[~real], f"hidden_states[{i}] at padding", atol=3e-4)
    assert_close(got.last_hidden_state[real], ref.last_hidden_state[real], "last_hidden_state")
    assert_close(got.pooler_output, ref.pooler_output, "pooler_output")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_without_fast_inference_every_hidden_state_is_transformers_bit_for_bit(
    attn, model_dir, hf_models, tokenizer
):
    model = bertlab.BertModel.from_pretrained(model_dir, attn_implementation=attn)
    model.set_fast_inference(False)
    enc = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = hf_models[attn](**enc, output_hidden_states=True)
        got = model(**enc, output_hidden_states=True)
    for i, (g, r) in enumerate(zip(got.hidden_states, ref.hidden_states, strict=True)):
        assert torch.equal(g, r), f"hidden_states[{i}]: max abs difference {(g - r).abs().max()}"
    assert torch.equal(got.pooler_output, ref.pooler_output)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_sentence_pair_matches_transformers(attn, ours, hf_models, tokenizer):
    model = ours[0]
    model.set_attn_implementation(attn)
    enc = tokenizer(*PAIR, return_tensors="pt")
    assert enc["token_type_ids"].eq(1).any() and enc["token_type_ids"].eq(0).any()
    with torch.no_grad():
        ref = hf_models[attn](**enc, output_hidden_states=True)
        got = model(**enc, output_hidden_states=True)
        # Segment ids matter: without them the output is different.
        no_types = model(enc["input_ids"], enc["attention_mask"]).last_hidden_state
    for i, (g, r) in enumerate(zip(got.hidden_states, ref.hidden_states, strict=True)):
        assert_close(g, r, f"hidden_states[{i}]")
    assert_close(got.pooler_output, ref.pooler_output, "pooler_output")
    assert (no_types - got.last_hidden_state).abs().max() > 1e-3


def test_mean_pooled_embeddings_match_sentence_transformers(ours, model_dir, tokenizer):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    ref = torch.as_tensor(st.encode(SENTENCES, convert_to_numpy=True))
    # The reference is normalised (its Normalize module): check that, so the comparison is fair.
    assert_close(ref.norm(dim=-1), torch.ones(len(SENTENCES)), "reference norms")

    model = ours[0]
    model.set_attn_implementation("sdpa")
    enc = tokenizer(SENTENCES, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state  # (B, T, H)
    mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
    mean = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    got = F.normalize(mean, p=2, dim=-1)
    assert_close(got, ref, "sentence embeddings")
    # Different sentences give clearly different vectors (the check is not vacuous).
    assert (got[0] - got[1]).abs().max() > 1e-2

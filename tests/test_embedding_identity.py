"""Reference 002: BERT's input embedding is LayerNorm(word + position + token type).

The notebook's code is run as written, with `bertlab` in place of `transformers` and the bundled
uncased checkpoint in place of the hub name (it shares bert-base-uncased's vocabulary)."""

import torch

import bertlab
from bertlab.explore.dissect import dissect_embeddings

CHECKPOINT = str(bertlab.bundled_model_dir())


def test_reference_002_runs_against_bertlab():
    from bertlab import BertModel, BertTokenizer

    model = BertModel.from_pretrained(CHECKPOINT)
    tokenizer = BertTokenizer.from_pretrained(CHECKPOINT)
    example_phrase = "I am Sinan"
    ids = tokenizer.encode(example_phrase, return_tensors="pt")
    assert ids.tolist() == [[101, 1045, 2572, 8254, 2319, 102]]  # as printed in reference 002

    words = model.embeddings.word_embeddings(ids)
    other = model.embeddings.word_embeddings(tokenizer.encode("She is Zoe", return_tensors="pt"))
    assert torch.equal(words[0, 0], other[0, 0]) and torch.equal(words[0, -1], other[0, -1])

    manual = model.embeddings.LayerNorm(
        model.embeddings.word_embeddings(tokenizer.encode(example_phrase, return_tensors="pt"))
        + model.embeddings.position_embeddings(torch.LongTensor(range(6)))
        + model.embeddings.token_type_embeddings(torch.zeros(6, dtype=torch.long))
    )
    direct = model.embeddings(tokenizer.encode(example_phrase, return_tensors="pt"))
    assert (manual - direct).abs().max() < 1e-6
    assert not torch.allclose(manual, words)  # the identity is not trivially true


def test_dissection_on_a_pair_uses_segment_one():
    model = bertlab.BertModel.from_pretrained(CHECKPOINT)
    tok = bertlab.BertTokenizer.from_pretrained(CHECKPOINT)
    enc = tok("I am Sinan", "She is Zoe", return_tensors="pt")
    d = dissect_embeddings(model.embeddings, enc["input_ids"][0], enc["token_type_ids"][0])
    assert d.max_abs_diff < 1e-5
    types = model.embeddings.token_type_embeddings.weight
    assert torch.equal(d.token_type[0], types[0]) and torch.equal(d.token_type[-1], types[1])
    assert model.training is False

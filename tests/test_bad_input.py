"""Bad input gets a ValueError naming the value and the limit, before any computation."""

import pytest
import torch

from bertlab import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

CFG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=16,
    type_vocab_size=2,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BertModel(CFG).eval()


def ids(*shape):
    return torch.randint(1, CFG.vocab_size, shape)


def test_token_id_outside_vocabulary(model):
    x = ids(2, 8)
    x[1, 7] = 99
    with pytest.raises(
        ValueError, match=r"token id 99 at position \(1, 7\) is outside the vocabulary \(size 99\)"
    ):
        model(x)
    x[1, 7] = -1
    with pytest.raises(ValueError, match="token id -1"):
        model(x)


def test_sequence_longer_than_positions(model):
    with pytest.raises(ValueError, match=r"sequence length 17 .* max_position_embeddings \(16\)"):
        model(ids(1, 17))


def test_token_type_outside_type_vocab(model):
    x = ids(2, 5)
    tt = torch.zeros_like(x)
    tt[0, 3] = 2
    with pytest.raises(
        ValueError, match=r"token type id 2 at position \(0, 3\) .*type_vocab_size \(2\)"
    ):
        model(x, token_type_ids=tt)


@pytest.mark.parametrize("name", ["attention_mask", "token_type_ids"])
def test_mask_or_types_of_another_shape(model, name):
    with pytest.raises(
        ValueError, match=rf"{name} has shape \(2, 4\), but the input ids have \(2, 5\)"
    ):
        model(ids(2, 5), **{name: torch.ones(2, 4, dtype=torch.long)})


@pytest.mark.parametrize("shape", [(0, 5), (3, 0)])
def test_empty_batch(model, shape):
    with pytest.raises(ValueError, match="empty batch"):
        model(torch.zeros(shape, dtype=torch.long))


def test_wrong_rank_and_dtype(model):
    with pytest.raises(ValueError, match=r"shape \(batch, seq_len\), got \(5,\)"):
        model(ids(5))
    with pytest.raises(ValueError, match="integer token ids"):
        model(torch.rand(2, 5))
    with pytest.raises(TypeError, match="torch.Tensor"):
        model([[1, 2, 3]])
    with pytest.raises(ValueError, match="exactly one"):
        model()


def test_position_ids_outside_table(model):
    with pytest.raises(ValueError, match=r"position id 16 .* max_position_embeddings \(16\)"):
        model(ids(1, 3), position_ids=torch.tensor([0, 1, 16]))


def test_labels_outside_the_classes():
    torch.manual_seed(0)
    clf = BertForSequenceClassification(CFG.replace(num_labels=3)).eval()
    with pytest.raises(ValueError, match=r"label 3 at position \(1,\) is outside \[0, 3\)"):
        clf(ids(2, 5), labels=torch.tensor([0, 3]))
    tag = BertForTokenClassification(CFG.replace(num_labels=3)).eval()
    labels = torch.full((2, 5), -100)
    labels[0, 1] = 7
    with pytest.raises(ValueError, match="label 7"):
        tag(ids(2, 5), labels=labels)
    pre = BertForPreTraining(CFG).eval()
    with pytest.raises(ValueError, match="next_sentence_label"):
        pre(ids(2, 5), labels=torch.full((2, 5), -100))


def test_multiple_choice_needs_three_dims():
    mc = BertForMultipleChoice(CFG).eval()
    with pytest.raises(ValueError, match=r"\(batch, choices, seq_len\), got \(2, 5\)"):
        mc(ids(2, 5))

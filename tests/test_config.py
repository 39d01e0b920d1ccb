"""BertConfig: defaults, presets, config.json both ways, validation."""

import json

import pytest
import torch
import transformers

from bertlab import BertConfig, BertModel
from bertlab.nn.model import sinusoidal_positions

SHARED_FIELDS = [
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
    "classifier_dropout",
    "tie_word_embeddings",
    "num_labels",
    "problem_type",
]


def test_defaults_equal_bert_base_uncased_as_transformers_defines_it():
    ours, ref = BertConfig(), transformers.BertConfig()
    for name in SHARED_FIELDS:
        assert getattr(ours, name) == getattr(ref, name), name


@pytest.mark.parametrize(
    "name,layers,hidden,heads",
    [
        ("tiny", 2, 128, 2),
        ("mini", 4, 256, 4),
        ("small", 4, 512, 8),
        ("medium", 8, 512, 8),
        ("base", 12, 768, 12),
        ("large", 24, 1024, 16),
    ],
)
def test_presets_have_the_published_sizes(name, layers, hidden, heads):
    c = BertConfig.preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden
    assert BertConfig.preset(name, vocab_size=1000).vocab_size == 1000


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="'huge'"):
        BertConfig.preset("huge")


def test_config_is_mutable_like_transformers_and_checked_before_use(tmp_path):
    c, ref = BertConfig(), transformers.BertConfig()
    for config in (c, ref):
        config.num_labels = 5
        config.use_cache = False
        config.my_option = "kept"
    assert c.id2label == ref.id2label and c.label2id == ref.label2id
    assert c.num_labels == 5 and c.use_cache is False and c.extra == {"my_option": "kept"}
    c.save_pretrained(tmp_path)
    back = BertConfig.from_pretrained(tmp_path)
    assert back == c and back.my_option == "kept" and back.use_cache is False
    assert BertConfig().replace(hidden_size=64, num_attention_heads=4).hidden_size == 64
    # a bad value set after construction is refused before saving and before a forward
    c.hidden_act = "tanh"
    with pytest.raises(ValueError, match="hidden_act 'tanh'"):
        c.save_pretrained(tmp_path / "again")
    assert not (tmp_path / "again" / "config.json").exists()
    small = BertConfig.preset("tiny", vocab_size=50)
    from bertlab import BertModel

    model = BertModel(small)
    small.attn_implementation = "flash"
    with pytest.raises(ValueError, match="attn_implementation 'flash'"):
        model(torch.tensor([[1, 2]]))


def test_json_round_trip_and_transformers_reads_it(tmp_path):
    c = BertConfig.preset(
        "mini",
        vocab_size=1234,
        id2label={0: "neg", 1: "neu", 2: "pos"},
        hidden_act="gelu_new",
        extra={"my_key": [1, 2]},
    )
    c.save_pretrained(tmp_path)
    back = BertConfig.from_pretrained(tmp_path)
    assert back == c and back.extra == {"my_key": [1, 2]} and back.num_labels == 3
    ref = transformers.BertConfig.from_pretrained(tmp_path)
    for name in SHARED_FIELDS:
        assert getattr(ref, name) == getattr(c, name), name
    assert ref.id2label == {0: "neg", 1: "neu", 2: "pos"}


def test_reads_a_transformers_config_with_unknown_keys(tmp_path):
    ref = transformers.BertConfig(
        vocab_size=500, hidden_size=64, num_attention_heads=4, num_labels=5, something_new="kept"
    )
    ref.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["future_option"] = {"nested": True}
    (tmp_path / "config.json").write_text(json.dumps(data))
    c = BertConfig.from_pretrained(tmp_path)
    assert (c.vocab_size, c.hidden_size, c.num_labels) == (500, 64, 5)
    assert c.extra["future_option"] == {"nested": True} and c.extra["something_new"] == "kept"
    assert "transformers_version" not in c.extra


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"hidden_size": 100}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"vocab_size": -3}, "vocab_size"),
        ({"hidden_act": "tanh"}, "hidden_act"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"attn_implementation": "flash"}, "attn_implementation"),
        ({"pad_token_id": 40000}, "pad_token_id"),
        ({"intermediate_size": 2.5}, "intermediate_size"),
    ],
)
def test_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BertConfig(**kwargs)


def test_other_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(ValueError, match="roberta"):
        BertConfig.from_pretrained(tmp_path)


def test_sinusoidal_position_init_is_the_vaswani_table_and_stays_learned():
    torch.manual_seed(0)
    c = BertConfig.preset(
        "tiny", vocab_size=50, max_position_embeddings=64, position_init="sinusoidal"
    )
    table = BertModel(c).embeddings.position_embeddings.weight
    assert table.requires_grad
    pos, i = 5, 6  # even dimension 2k = 6: sin(pos / 10000^(6/128))
    assert table[pos, i].item() == pytest.approx(
        torch.sin(torch.tensor(pos / 10000 ** (i / 128))).item(), abs=1e-6
    )
    assert table[pos, i + 1].item() == pytest.approx(
        torch.cos(torch.tensor(pos / 10000 ** (i / 128))).item(), abs=1e-6
    )
    assert torch.equal(table.detach(), sinusoidal_positions(64, 128))
    normal = BertModel(c.replace(position_init="normal")).embeddings.position_embeddings.weight
    assert not torch.allclose(normal, table)

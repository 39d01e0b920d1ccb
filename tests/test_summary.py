"""Parameter accounting (bertlab/summary.py) against published figures.

Every model is built on the meta device, so even bert-large costs no memory or time.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertlab import BertConfig
from bertlab.explore.summary import (
    HEADS,
    TIED,
    build_for_summary,
    evaluate,
    format_table,
    parameter_table,
    symbols,
)

# Golden figures from reference 004 (the keras_bert summary of BERT-base pre-training with a
# 30,000-token vocabulary: T=30000, H=768, L=12, A=12, FFD=3072, P=512). Copied from the printed
# table, not produced by bertlab.
REF004_VOCAB = 30000
REF004_TOTAL = 109_705_010  # "Total params: 109,705,010"
REF004_WORD = 23_040_000  # Embedding-Token
REF004_TOKEN_TYPE = 1_536  # Embedding-Segment
REF004_POSITION = 393_216  # Embedding-Position
REF004_ATTENTION = 2_362_368  # Encoder-N-MultiHeadSelfAttention, each of the 12 layers
REF004_FEED_FORWARD = 4_722_432  # Encoder-N-FeedForward
REF004_LAYER_NORM = 1_536  # Embedding-Norm, Encoder-N-...-Norm, MLM-Norm
REF004_MLM_DENSE = 590_592  # MLM-Dense
REF004_MLM_BIAS = 30_000  # MLM-Sim (the output bias; the weight is the tied embedding)
REF004_NSP_DENSE = 590_592  # NSP-Dense: our pooler.dense
REF004_NSP = 1_538  # NSP

# Reference 001: bert-base-uncased "has 199 different named parameters".
REF001_NAMED_PARAMETERS = 199
# Published totals of the encoder alone (BertModel with pooler), as transformers counts them.
BERT_BASE_TOTAL = 109_482_240
BERT_LARGE_TOTAL = 335_141_888


def rows_by_name(model: nn.Module) -> dict[str, int]:
    return {r.name: r.params for r in parameter_table(model)}


@pytest.fixture(scope="module")
def pretraining():
    return build_for_summary(BertConfig(vocab_size=REF004_VOCAB), "pretraining")


def test_pretraining_matches_reference_004(pretraining):
    rows = parameter_table(pretraining)
    params = {r.name: r.params for r in rows}
    assert sum(r.params for r in rows) == REF004_TOTAL
    assert pretraining.num_parameters() == REF004_TOTAL
    assert params["embeddings.word_embeddings"] == REF004_WORD
    assert params["embeddings.token_type_embeddings"] == REF004_TOKEN_TYPE
    assert params["embeddings.position_embeddings"] == REF004_POSITION
    for n in range(12):
        assert params[f"encoder.layer.{n}.attention"] == REF004_ATTENTION
        assert params[f"encoder.layer.{n}.feed_forward"] == REF004_FEED_FORWARD
    layer_norms = [r for r in rows if r.kind == "LayerNorm"]
    assert len(layer_norms) == 1 + 2 * 12 + 1  # embeddings, two per layer, MLM transform
    assert {r.params for r in layer_norms} == {REF004_LAYER_NORM}
    assert params["cls.predictions.transform.dense"] == REF004_MLM_DENSE
    assert params["cls.predictions.bias"] == REF004_MLM_BIAS
    assert params["cls.predictions.decoder"] == 0  # tied: counted once, as word embeddings
    assert params["pooler.dense"] == REF004_NSP_DENSE
    assert params["cls.seq_relationship"] == REF004_NSP


def test_rows_follow_the_network_order_with_shapes_and_formulas(pretraining):
    rows = parameter_table(pretraining)
    names = [r.name for r in rows]
    assert names[:8] == [
        "embeddings.word_embeddings",
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
        "embeddings.LayerNorm",
        "encoder.layer.0.attention",
        "encoder.layer.0.attention.output.LayerNorm",
        "encoder.layer.0.feed_forward",
        "encoder.layer.0.output.LayerNorm",
    ]
    assert names[-6:] == [
        "pooler.dense",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.decoder",
        "cls.predictions.bias",
        "cls.seq_relationship",
    ]
    assert len(rows) == 4 + 4 * 12 + 6
    by_name = {r.name: r for r in rows}
    assert by_name["embeddings.word_embeddings"].output_shape == "(B, T, 768)"
    assert by_name["pooler.dense"].output_shape == "(B, 768)"
    assert by_name["cls.predictions.bias"].output_shape == "(B, T, 30000)"
    assert by_name["cls.seq_relationship"].output_shape == "(B, 2)"
    assert by_name["encoder.layer.0.attention"].formula == "4*H*H + 4*H"
    assert by_name["encoder.layer.0.feed_forward"].formula == "2*H*I + I + H"
    assert by_name["cls.predictions.decoder"].formula == TIED


def test_bert_base_and_large_encoders():
    base = build_for_summary(BertConfig(), "base")
    assert len(list(base.named_parameters())) == REF001_NAMED_PARAMETERS
    assert sum(r.params for r in parameter_table(base)) == BERT_BASE_TOTAL
    large = build_for_summary(BertConfig.preset("large"), "base")
    assert next(large.parameters()).device.type == "meta"
    assert sum(r.params for r in parameter_table(large)) == BERT_LARGE_TOTAL


def test_totals_agree_with_transformers():
    transformers = pytest.importorskip(
        "transformers", reason="transformers (a test dependency) is the reference count"
    )
    for ours in (BertConfig(), BertConfig.preset("large", vocab_size=REF004_VOCAB)):
        with torch.device("meta"):
            theirs = transformers.BertForPreTraining(transformers.BertConfig(**ours.to_dict()))
        rows = parameter_table(build_for_summary(ours, "pretraining"))
        assert sum(r.params for r in rows) == theirs.num_parameters()


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("tied", [True, False])
def test_every_head_sums_to_num_parameters(head, tied):
    config = BertConfig.preset("small", num_labels=3, tie_word_embeddings=tied)
    model = build_for_summary(config, head)
    assert isinstance(model, HEADS[head])
    rows = parameter_table(model)
    assert sum(r.params for r in rows) == model.num_parameters()
    values = symbols(config)
    assert all(evaluate(r.formula, values) == r.params for r in rows)
    text = format_table(rows, head, config)
    assert f"Total params: {model.num_parameters():,}" in text


@pytest.mark.parametrize(
    ("head", "name", "shape", "formula", "params"),
    [
        ("sequence-classification", "classifier", "(B, 3)", "H*K + K", 512 * 3 + 3),
        ("token-classification", "classifier", "(B, T, 3)", "H*K + K", 512 * 3 + 3),
        ("multiple-choice", "classifier", "(B, C)", "H + 1", 512 + 1),
        ("question-answering", "qa_outputs", "(B, T, 2)", "2*H + 2", 2 * 512 + 2),
        ("nsp", "cls.seq_relationship", "(B, 2)", "2*H + 2", 2 * 512 + 2),
    ],
)
def test_task_head_rows(head, name, shape, formula, params):
    rows = parameter_table(build_for_summary(BertConfig.preset("small", num_labels=3), head))
    row = rows[-1]
    assert (row.name, row.output_shape, row.formula, row.params) == (name, shape, formula, params)
    has_pooler = head in ("sequence-classification", "multiple-choice", "nsp")
    assert ("pooler.dense" in [r.name for r in rows]) == has_pooler


def test_untied_decoder_is_counted():
    config = BertConfig.preset("tiny", tie_word_embeddings=False)
    rows = {r.name: r for r in parameter_table(build_for_summary(config, "masked-lm"))}
    assert rows["cls.predictions.decoder"].formula == "V*H"
    assert rows["cls.predictions.decoder"].params == config.vocab_size * config.hidden_size


def test_a_formula_that_drifts_from_the_module_is_caught():
    model = build_for_summary(BertConfig.preset("tiny"), "base")
    with torch.device("meta"):
        model.pooler.dense = nn.Linear(128, 128, bias=False)  # H*H, not H*H + H
    with pytest.raises(AssertionError, match="pooler.dense"):
        parameter_table(model)


def test_a_parameter_in_no_row_is_caught():
    model = build_for_summary(BertConfig.preset("tiny"), "pretraining")
    model.cls.extra = nn.Parameter(torch.empty(5, device="meta"))
    with pytest.raises(AssertionError, match=r"cls\.extra"):
        parameter_table(model)


def test_format_table_full_and_collapsed(pretraining):
    rows = parameter_table(pretraining)
    full = format_table(rows, "BertForPreTraining", pretraining.config)
    assert "Total params: 109,705,010" in full
    assert "Trainable params: 109,705,010" in full
    assert "V=30000 H=768 P=512 Y=2 I=3072 K=2 L=12" in full
    assert "encoder.layer.11.output.LayerNorm" in full
    assert "23,040,000" in full
    collapsed = format_table(rows, "BertForPreTraining", pretraining.config, collapse_layers=True)
    assert "encoder.layer.0.feed_forward" in collapsed
    assert "encoder.layer.1." not in collapsed
    assert "encoder.layer.0-11 (subtotal)" in collapsed
    assert f"{12 * (REF004_ATTENTION + REF004_FEED_FORWARD + 2 * REF004_LAYER_NORM):,}" in collapsed
    assert "Total params: 109,705,010" in collapsed
    # Columns are aligned: every table line puts the output shape in the same column.
    lines = [line for line in collapsed.splitlines() if "(B, " in line]
    assert len({line.index("(B, ") for line in lines}) == 1


def test_trainable_line_counts_frozen_parameters():
    model = build_for_summary(BertConfig.preset("tiny"), "sequence-classification")
    model.bert.embeddings.requires_grad_(False)
    frozen = sum(p.numel() for p in model.bert.embeddings.parameters())
    text = format_table(parameter_table(model), "frozen embeddings")
    assert f"Trainable params: {model.num_parameters() - frozen:,}" in text
    assert f"Non-trainable params: {frozen:,}" in text


def test_unknown_head_and_symbol():
    with pytest.raises(ValueError, match="unknown head 'lm'.*masked-lm.*multiple-choice"):
        build_for_summary(BertConfig.preset("tiny"), "lm")
    with pytest.raises(ValueError, match="unknown symbol 'Z'"):
        evaluate("2*Z", {"H": 1})

"""Parity with Hugging Face transformers (the reference), for every head, both directions.

transformers is a test-only dependency: bertlab never imports it. Every parameter of the models
compared here is drawn at random (not the BERT init, where LayerNorms are 1/0 and biases 0), so a
swapped or ignored weight, a wrong activation or a wrong mask shows up far above the tolerance.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import transformers
from helpers import max_diff, scramble

import bertlab
import bertlab.nn.attention

ATOL = 1e-5
SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
)
B, T = 3, 9  # batch and sequence length of the test inputs
LENGTHS = (9, 6, 3)  # real tokens per row: the rows are padded differently
C = 3  # choices, for multiple choice
MC_LENGTHS = ((8, 5, 3), (4, 9, 6))  # (B=2, C=3) real lengths
ATTN = ["eager", "sdpa"]
INPUT_KINDS = ["explicit_positions", "default_positions", "default_positions_and_types"]


# ================================================================================ helpers


def assert_tensor_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: bertlab gave {type(got).__name__}"
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == torch.float32 and ref.dtype == torch.float32, what
    assert torch.isfinite(ref).all(), f"{what}: reference is not finite"
    diff = max_diff(got, ref)
    assert diff <= ATOL, f"{what}: max abs difference {diff:.3g} > {ATOL}"


def assert_outputs_match(got: Any, ref: Any, expect: set[str]) -> None:
    """Every field the reference computed is in bertlab's output and equal; nothing extra."""
    # transformers fills cross_attentions with () for an encoder: not an output of BERT here.
    ref_fields = {
        k: v
        for k, v in ref.items()
        if v is not None and not (k == "cross_attentions" and isinstance(v, tuple) and not v)
    }
    got_fields = {
        f.name: getattr(got, f.name)
        for f in dataclasses.fields(got)
        if getattr(got, f.name) is not None
    }
    assert set(ref_fields) == expect, f"reference gave {sorted(ref_fields)}, expected {expect}"
    assert set(got_fields) == set(ref_fields), (
        f"bertlab gave {sorted(got_fields)}, transformers {sorted(ref_fields)}"
    )
    for name, ref_value in ref_fields.items():
        got_value = got_fields[name]
        if isinstance(ref_value, torch.Tensor):
            assert_tensor_close(got_value, ref_value, name)
        else:
            assert isinstance(got_value, tuple), f"{name}: {type(got_value).__name__}"
            assert len(got_value) == len(ref_value), (
                f"{name}: {len(got_value)} tensors, transformers {len(ref_value)}"
            )
            for i, (g, r) in enumerate(zip(got_value, ref_value, strict=True)):
                assert_tensor_close(g, r, f"{name}[{i}]")


# ================================================================================ inputs
def _padded_inputs(lengths: tuple[int, ...], seq_len: int, seed: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids (0 then 1 inside the real tokens, 0 on padding)
    and explicit position ids (offset per row, so they differ from the default 0..T-1)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(lengths)
    ids = torch.randint(1, SIZES["vocab_size"], (n, seq_len), generator=gen)
    mask = torch.zeros(n, seq_len, dtype=torch.long)
    types = torch.zeros(n, seq_len, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
        types[i, length // 2 : length] = 1
        ids[i, length:] = 0  # [PAD]
    positions = torch.arange(seq_len).expand(n, seq_len) + 2 * torch.arange(n)[:, None] + 1
    return dict(
        input_ids=ids, attention_mask=mask, token_type_ids=types, position_ids=positions.clone()
    )


def batch_inputs(kind: str, multiple_choice: bool = False) -> dict[str, torch.Tensor]:
    if multiple_choice:
        flat = [n for row in MC_LENGTHS for n in row]
        inputs = _padded_inputs(tuple(flat), T, seed=11)
        inputs = {k: v.view(len(MC_LENGTHS), C, T) for k, v in inputs.items()}
    else:
        inputs = _padded_inputs(LENGTHS, T, seed=7)
    assert inputs["attention_mask"].eq(0).any() and inputs["token_type_ids"].eq(1).any()
    if kind in ("default_positions", "default_positions_and_types"):
        del inputs["position_ids"]
    if kind == "default_positions_and_types":
        del inputs["token_type_ids"]
    return inputs


def mlm_labels() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    labels = torch.full((B, T), -100)
    labels[0, [1, 4, 8]] = torch.randint(0, SIZES["vocab_size"], (3,), generator=gen)
    labels[1, [0, 5]] = torch.randint(0, SIZES["vocab_size"], (2,), generator=gen)
    labels[2, 2] = 17
    return labels


def token_labels() -> torch.Tensor:
    labels = torch.randint(0, 5, (B, T), generator=torch.Generator().manual_seed(4))
    for i, length in enumerate(LENGTHS):
        labels[i, length:] = -100  # padding
    labels[:, 0] = -100  # [CLS]
    return labels


# ================================================================================ the cases
@dataclass(frozen=True)
class Case:
    id: str
    cls_name: str
    outputs: frozenset[str]  # fields the reference gives (besides hidden_states/attentions)
    config: dict[str, Any] = field(default_factory=dict)
    labels: Callable[[], dict[str, torch.Tensor]] = dict
    multiple_choice: bool = False

    def __repr__(self) -> str:
        return self.id


CASES = [
    Case(
        "BertModel",
        "BertModel",
        frozenset({"last_hidden_state", "pooler_output"}),
        dict(num_hidden_layers=2, hidden_act="gelu"),
    ),
    Case(
        "BertForPreTraining",
        "BertForPreTraining",
        frozenset({"loss", "prediction_logits", "seq_relationship_logits"}),
        dict(num_hidden_layers=3, hidden_act="gelu_new"),
        lambda: dict(labels=mlm_labels(), next_sentence_label=torch.tensor([0, 1, 1])),
    ),
    Case(
        "BertForMaskedLM",
        "BertForMaskedLM",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="relu"),
        lambda: dict(labels=mlm_labels()),
    ),
    Case(
        "BertForNextSentencePrediction",
        "BertForNextSentencePrediction",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="silu"),
        lambda: dict(labels=torch.tensor([1, 0, 1])),
    ),
    Case(
        "SequenceClassification-single_label",
        "BertForSequenceClassification",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="gelu", num_labels=3),
        lambda: dict(labels=torch.tensor([2, 0, 1])),
    ),
    Case(
        "SequenceClassification-multi_label",
        "BertForSequenceClassification",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="silu", num_labels=4),
        lambda: dict(
            labels=torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
        ),
    ),
    Case(
        "SequenceClassification-regression",
        "BertForSequenceClassification",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=3, hidden_act="relu", num_labels=1),
        lambda: dict(labels=torch.tensor([0.5, -1.25, 2.0])),
    ),
    Case(
        "BertForTokenClassification",
        "BertForTokenClassification",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="gelu_new", num_labels=5),
        lambda: dict(labels=token_labels()),
    ),
    Case(
        "BertForQuestionAnswering",
        "BertForQuestionAnswering",
        frozenset({"loss", "start_logits", "end_logits"}),
        dict(num_hidden_layers=2, hidden_act="silu"),
        # 40 and 100 lie outside the sequence: clamped to T and ignored by the loss.
        lambda: dict(
            start_positions=torch.tensor([1, 40, 2]), end_positions=torch.tensor([3, 4, 100])
        ),
    ),
    Case(
        "BertForMultipleChoice",
        "BertForMultipleChoice",
        frozenset({"loss", "logits"}),
        dict(num_hidden_layers=2, hidden_act="gelu"),
        lambda: dict(labels=torch.tensor([2, 0])),
        multiple_choice=True,
    ),
]
CASE_IDS = [c.id for c in CASES]


@dataclass
class Reference:
    directory: Any
    hf: dict[str, torch.nn.Module]  # transformers loaded with each attention kernel


@pytest.fixture(scope="module")
def reference(module_tmp) -> Callable[[Case], Reference]:
    """A transformers checkpoint per case (random weights, fixed seed), saved once, plus the
    transformers models loaded back from that folder."""
    cache: dict[str, Reference] = {}

    def get(case: Case) -> Reference:
        if case.id not in cache:
            torch.manual_seed(0)
            hf_config = transformers.BertConfig(**SIZES, **case.config)
            model = getattr(transformers, case.cls_name)(hf_config)
            scramble(model, seed=zlib.crc32(case.id.encode()))
            directory = module_tmp.mktemp(case.id)
            model.save_pretrained(directory)
            hf = {
                attn: getattr(transformers, case.cls_name)
                .from_pretrained(directory, attn_implementation=attn)
                .eval()
                for attn in ATTN
            }
            cache[case.id] = Reference(directory, hf)
        return cache[case.id]

    return get


def as_bertlab_qa(ref: Any, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """transformers' QA output with bertlab's one deliberate difference applied: padding
    positions score the dtype's lowest value (never an answer, outside the loss; see
    BertForQuestionAnswering). The real positions' scores are compared unchanged, and the loss
    is the reference's formula on transformers' own scores, padding masked the same way."""
    out = dict(ref.items())
    real = inputs["attention_mask"].bool()  # (B, T)
    for name in ("start_logits", "end_logits"):
        out[name] = ref[name].masked_fill(~real, torch.finfo(ref[name].dtype).min)
    if "loss" in out:
        T = real.shape[1]

        def target(positions: torch.Tensor) -> torch.Tensor:  # on padding or past T: ignored
            p = positions.clamp(0, T)
            on_padding = ~real.gather(1, p.clamp(max=T - 1)[:, None]).squeeze(1)
            return p.masked_fill(on_padding, T)

        ce = torch.nn.functional.cross_entropy
        start, end = target(inputs["start_positions"]), target(inputs["end_positions"])
        out["loss"] = (
            ce(out["start_logits"], start, ignore_index=T)
            + ce(out["end_logits"], end, ignore_index=T)
        ) / 2
    return out


def run_both(
    got_model: torch.nn.Module,
    hf: dict[str, torch.nn.Module],
    inputs: dict[str, torch.Tensor],
    case: Case,
) -> None:
    """Compare bertlab with transformers using the same attention kernel (eager and sdpa round
    differently), then with attentions, which both compute eagerly."""
    layers = case.config["num_hidden_layers"]
    with torch.no_grad():
        # Hidden states but no attentions: bertlab's chosen kernel (sdpa included) runs.
        ref = hf[got_model.config.attn_implementation](**inputs, output_hidden_states=True)
        if case.cls_name == "BertForQuestionAnswering":
            ref = as_bertlab_qa(ref, inputs)
        got = got_model(**inputs, output_hidden_states=True)
        assert len(ref["hidden_states"]) == layers + 1
        assert_outputs_match(got, ref, set(case.outputs) | {"hidden_states"})
        # Attentions too (transformers needs its eager path for them).
        ref = hf["eager"](**inputs, output_hidden_states=True, output_attentions=True)
        if case.cls_name == "BertForQuestionAnswering":
            ref = as_bertlab_qa(ref, inputs)
        got = got_model(**inputs, output_hidden_states=True, output_attentions=True)
        assert len(ref["attentions"]) == layers
        assert_outputs_match(got, ref, set(case.outputs) | {"hidden_states", "attentions"})
        # Padding keys get exactly zero attention.
        mask = inputs["attention_mask"].reshape(-1, T).bool()
        for probs in got.attentions:
            assert probs.masked_select(~mask[:, None, None, :]).abs().max() == 0
        # And without the optional outputs, they are not computed.
        plain = got_model(**inputs)
        assert plain.hidden_states is None and plain.attentions is None


# ================================================================================ tests
@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("kind", INPUT_KINDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_transformers_checkpoint_into_bertlab(case, kind, attn, reference):
    ref = reference(case)
    cls = getattr(bertlab, case.cls_name)
    model, info = cls.from_pretrained(
        ref.directory, attn_implementation=attn, output_loading_info=True
    )
    assert type(model) is cls
    assert (info.missing_keys, info.unexpected_keys, info.mismatched_keys) == ([], [], [])
    assert model.config.attn_implementation == attn
    assert model.config.hidden_act == case.config["hidden_act"]
    assert not model.training
    inputs = {**batch_inputs(kind, case.multiple_choice), **case.labels()}
    run_both(model, ref.hf, inputs, case)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_bertlab_checkpoint_into_transformers(case, tmp_path):
    torch.manual_seed(1234)
    cls = getattr(bertlab, case.cls_name)
    model = cls(bertlab.BertConfig(**SIZES, **case.config))
    scramble(model, seed=5678)
    model.eval()
    model.save_pretrained(tmp_path)

    hf_cls = getattr(transformers, case.cls_name)
    hf_default, info = hf_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert not info["error_msgs"], info
    assert type(hf_default) is hf_cls
    assert hf_default.config.hidden_act == case.config["hidden_act"]
    if "num_labels" in case.config:
        assert hf_default.config.num_labels == case.config["num_labels"]
    assert hf_default.config._attn_implementation == "sdpa"
    hf = {
        "sdpa": hf_default.eval(),
        "eager": hf_cls.from_pretrained(tmp_path, attn_implementation="eager").eval(),
    }
    inputs = {**batch_inputs("explicit_positions", case.multiple_choice), **case.labels()}
    for attn in ATTN:
        model.set_attn_implementation(attn)
        run_both(model, hf, inputs, case)


@pytest.mark.parametrize("attn", ATTN)
def test_padded_row_equals_the_sequence_alone(attn, reference):
    case = CASES[0]
    model = bertlab.BertModel.from_pretrained(reference(case).directory, attn_implementation=attn)
    inputs = batch_inputs("explicit_positions")
    with torch.no_grad():
        batch = model(**inputs, output_hidden_states=True)
        for i, n in enumerate(LENGTHS):
            alone = model(
                **{k: v[i : i + 1, :n] for k, v in inputs.items()}, output_hidden_states=True
            )
            pairs = zip(batch.hidden_states, alone.hidden_states, strict=True)
            for layer, (b, a) in enumerate(pairs):
                assert_tensor_close(b[i : i + 1, :n], a, f"row {i} hidden_states[{layer}]")
            assert_tensor_close(batch.pooler_output[i : i + 1], alone.pooler_output, "pooler")
            # More padding on the right changes nothing either.
            wider = {
                k: torch.cat([v[i : i + 1, :n], torch.zeros(1, 5, dtype=v.dtype)], dim=1)
                for k, v in inputs.items()
            }
            padded = model(**wider)
            assert_tensor_close(padded.last_hidden_state[:, :n], alone.last_hidden_state, "wider")


def test_eager_equals_sdpa(reference, monkeypatch):
    case = CASES[0]
    directory = reference(case).directory
    eager = bertlab.BertModel.from_pretrained(directory, attn_implementation="eager")
    sdpa = bertlab.BertModel.from_pretrained(directory, attn_implementation="sdpa")
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(bertlab.nn.attention.F, "scaled_dot_product_attention", spy)
    layers = case.config["num_hidden_layers"]
    for kind in INPUT_KINDS:
        inputs = batch_inputs(kind)
        with torch.no_grad():
            calls.clear()
            a = eager(**inputs, output_hidden_states=True)
            assert calls == [], "the eager model called the fused kernel"
            b = sdpa(**inputs, output_hidden_states=True)
            assert len(calls) == layers, "the sdpa model did not use the fused kernel"
            assert all(m is not None for m in calls), "padding mask not passed to sdpa"
        assert_tensor_close(b.pooler_output, a.pooler_output, "pooler_output")
        for i, (x, y) in enumerate(zip(b.hidden_states, a.hidden_states, strict=True)):
            assert_tensor_close(x, y, f"hidden_states[{i}]")
    # Switching the kernel of a loaded model gives the same numbers too.
    inputs = batch_inputs("explicit_positions")
    with torch.no_grad():
        before = sdpa(**inputs).last_hidden_state
        sdpa.set_attn_implementation("eager")
        assert sdpa.config.attn_implementation == "eager"
        calls.clear()
        after = sdpa(**inputs).last_hidden_state
        assert calls == []
    assert_tensor_close(after, before, "after set_attn_implementation")

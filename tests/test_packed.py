"""The packed (unpadded) execution path: attn_implementation="packed" against the padded kernels.

Packed, the padding is removed once before the embeddings and every layer runs on the real tokens
only (bertlab/packing.py, attention.packed_attention). Its contract, tested here:

* at the real positions every output (logits, losses, hidden states, pooled vectors) equals the
  padded "sdpa" model's, for every head, however the packed model was made;
* nothing depends on the padding: not how much there is, where it is (left or right), nor what
  the padding positions hold;
* padding positions of per-token outputs are zeros (the QA logits: the dtype's minimum);
* gradients equal the padded model's.

Every parameter is drawn at random (``scramble``, as in test_parity.py), so a wrong position id,
a token attending across sequences or a mixed-up row is far above the 1e-5 tolerance.
transformers is not needed: the padded kernels are themselves checked against it elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from helpers import max_diff, scramble

import bertlab
import bertlab.nn.attention
from bertlab.nn.packing import SHARED_ROWS, Packing, window_order

ATOL = 1e-5
SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
)
T = 9  # padded sequence length of the test batch
LENGTHS = (9, 6, 1, 3)  # real tokens per row: one full row, one single-token row
B = len(LENGTHS)
MC_LENGTHS = ((8, 5, 3), (4, 9, 1))  # multiple choice: (B=2, C=3) real lengths
INPUT_KINDS = ["explicit_positions", "default_positions", "default_positions_and_types"]


# ================================================================================ helpers


def make_model(cls: type, seed: int = 0, attn: str = "sdpa", **config: Any) -> torch.nn.Module:
    """A tiny model of ``cls`` with random weights, in eval mode."""
    torch.manual_seed(seed)
    cfg = bertlab.BertConfig(**{**SIZES, "num_hidden_layers": 2, **config})
    return scramble(cls(cfg.replace(attn_implementation=attn)), seed + 1).eval()


def assert_close(got: torch.Tensor, ref: torch.Tensor, what: str, atol: float = ATOL) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: got {type(got).__name__}"
    assert tuple(got.shape) == tuple(ref.shape), f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    assert torch.isfinite(got).all(), f"{what}: not finite"
    diff = max_diff(got, ref)
    assert diff <= atol, f"{what}: max abs difference {diff:.3g} > {atol}"


def per_token(t: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether ``t`` is laid out (B, T, ...) like the flat (B, T) mask."""
    return t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape)


def output_tensors(out: Any) -> dict[str, torch.Tensor]:
    """Every tensor of a model output by name (tuples flattened: hidden_states[0], ...)."""
    found = {}
    for f in dataclasses.fields(out):
        value = getattr(out, f.name)
        if isinstance(value, tuple):
            found.update({f"{f.name}[{i}]": v for i, v in enumerate(value)})
        elif value is not None:
            found[f.name] = value
    return found


def assert_real_positions_match(
    got: Any, ref: Any, mask: torch.Tensor, what: str, skip: frozenset[str] = frozenset()
) -> None:
    """The same fields, equal to ATOL: per-token tensors at the real positions only (mask, the
    flat (B, T) attention mask), everything else (losses, pooled, per-sequence logits) in full."""
    got_t, ref_t = output_tensors(got), output_tensors(ref)
    assert set(got_t) == set(ref_t), f"{what}: fields {sorted(got_t)} != {sorted(ref_t)}"
    for name, r in ref_t.items():
        if name in skip:
            continue
        g = got_t[name]
        if per_token(r, mask):
            assert per_token(g, mask), f"{what}.{name}: shape {g.shape}"
            g, r = g[mask], r[mask]
        assert_close(g, r, f"{what}.{name}")


def padding_values(out: Any, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each per-token output holds at the padding positions."""
    return {n: t[~mask] for n, t in output_tensors(out).items() if per_token(t, mask)}


@pytest.fixture
def packed_calls(monkeypatch) -> list[bool]:
    """Records every call of the packed kernel (True when it ran batched: no padding)."""
    calls: list[bool] = []
    real = bertlab.nn.attention.BACKENDS["packed"]

    def spy(q, k, v, packing, *args, **kwargs):
        assert isinstance(packing, Packing)
        calls.append(packing.dense)
        return real(q, k, v, packing, *args, **kwargs)

    monkeypatch.setitem(bertlab.nn.attention.BACKENDS, "packed", spy)  # the one registry
    return calls


# ================================================================================ inputs
def padded_inputs(
    lengths: tuple[int, ...], seq_len: int = T, seed: int = 7, left: bool = False
) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids (0 then 1 inside the real tokens) and explicit
    position ids (0.. over each row's real tokens, plus a per-row offset so they differ from
    the default; 0 at padding). Right padding, or left padding with ``left``: each row's real
    tokens are the same either way."""
    gen = torch.Generator().manual_seed(seed)
    n = len(lengths)
    ids = torch.zeros(n, seq_len, dtype=torch.long)
    mask = torch.zeros(n, seq_len, dtype=torch.long)
    types = torch.zeros(n, seq_len, dtype=torch.long)
    positions = torch.zeros(n, seq_len, dtype=torch.long)
    for i, length in enumerate(lengths):
        real = slice(seq_len - length, seq_len) if left else slice(0, length)
        ids[i, real] = torch.randint(1, SIZES["vocab_size"], (length,), generator=gen)
        mask[i, real] = 1
        types[i, real] = (torch.arange(length) >= length // 2).long()
        positions[i, real] = torch.arange(length) + (0 if left else 2 * i + 1)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, position_ids=positions)


def batch_inputs(kind: str, multiple_choice: bool = False) -> dict[str, torch.Tensor]:
    if multiple_choice:
        inputs = padded_inputs(tuple(n for row in MC_LENGTHS for n in row), seed=11)
        inputs = {k: v.view(len(MC_LENGTHS), -1, T) for k, v in inputs.items()}
    else:
        inputs = padded_inputs(LENGTHS)
    if kind != "explicit_positions":
        del inputs["position_ids"]
    if kind == "default_positions_and_types":
        del inputs["token_type_ids"]
    return inputs


def mlm_labels(lengths: tuple[int, ...] = LENGTHS, seq_len: int = T) -> torch.Tensor:
    """A label at about half the real tokens (always the first), -100 elsewhere."""
    gen = torch.Generator().manual_seed(3)
    labels = torch.full((len(lengths), seq_len), -100)
    for i, n in enumerate(lengths):
        keep = torch.rand(n, generator=gen) < 0.5
        keep[0] = True
        labels[i, :n] = torch.where(
            keep, torch.randint(0, SIZES["vocab_size"], (n,), generator=gen), -100
        )
    return labels


def token_labels(lengths: tuple[int, ...] = LENGTHS, seq_len: int = T) -> torch.Tensor:
    labels = torch.randint(
        0, 5, (len(lengths), seq_len), generator=torch.Generator().manual_seed(4)
    )
    for i, n in enumerate(lengths):
        labels[i, n:] = -100  # padding
    return labels


def qa_positions() -> dict[str, torch.Tensor]:
    """Answer spans inside each row's real tokens."""
    return dict(
        start_positions=torch.tensor([1, 4, 0, 2]), end_positions=torch.tensor([3, 5, 0, 2])
    )


# ================================================================================ the cases
@dataclass(frozen=True)
class Case:
    id: str
    cls: type
    config: dict[str, Any] = field(default_factory=dict)
    labels: Callable[[], dict[str, torch.Tensor]] = dict
    multiple_choice: bool = False

    def __repr__(self) -> str:
        return self.id


CASES = [
    Case("BertModel", bertlab.BertModel, dict(hidden_act="gelu")),
    Case(
        "BertForPreTraining",
        bertlab.BertForPreTraining,
        dict(num_hidden_layers=3, hidden_act="gelu_new"),
        lambda: dict(labels=mlm_labels(), next_sentence_label=torch.tensor([0, 1, 1, 0])),
    ),
    Case(
        "BertForMaskedLM",
        bertlab.BertForMaskedLM,
        dict(hidden_act="relu"),
        lambda: dict(labels=mlm_labels()),
    ),
    Case(
        "BertForNextSentencePrediction",
        bertlab.BertForNextSentencePrediction,
        dict(hidden_act="silu"),
        lambda: dict(labels=torch.tensor([1, 0, 1, 1])),
    ),
    Case(
        "SequenceClassification-single_label",
        bertlab.BertForSequenceClassification,
        dict(num_labels=3),
        lambda: dict(labels=torch.tensor([2, 0, 1, 1])),
    ),
    Case(
        "SequenceClassification-multi_label",
        bertlab.BertForSequenceClassification,
        dict(num_labels=4, hidden_act="silu"),
        lambda: dict(labels=(torch.arange(16).view(4, 4) % 3 == 0).float()),
    ),
    Case(
        "SequenceClassification-regression",
        bertlab.BertForSequenceClassification,
        dict(num_labels=1, num_hidden_layers=3, hidden_act="relu"),
        lambda: dict(labels=torch.tensor([0.5, -1.25, 2.0, 0.0])),
    ),
    Case(
        "BertForTokenClassification",
        bertlab.BertForTokenClassification,
        dict(num_labels=5, hidden_act="gelu_new"),
        lambda: dict(labels=token_labels()),
    ),
    Case(
        "BertForQuestionAnswering",
        bertlab.BertForQuestionAnswering,
        dict(hidden_act="silu"),
        qa_positions,
    ),
    Case(
        "BertForMultipleChoice",
        bertlab.BertForMultipleChoice,
        dict(),
        lambda: dict(labels=torch.tensor([2, 0])),
        multiple_choice=True,
    ),
]
CASE_IDS = [c.id for c in CASES]
HAS_LOSS = {c.id for c in CASES if c.id != "BertModel"}
MAKE_PACKED = ["set_attn_implementation", "config", "from_pretrained"]


def packed_copy(ref: torch.nn.Module, how: str, tmp_path) -> torch.nn.Module:
    """The same weights in a packed model, made one of the three ways a user can."""
    cls = type(ref)
    if how == "config":
        model = cls(ref.config.replace(attn_implementation="packed"))
        model.load_state_dict(ref.state_dict())
        return model.eval()
    if how == "from_pretrained":
        ref.save_pretrained(tmp_path)
        return cls.from_pretrained(tmp_path, attn_implementation="packed")
    raise AssertionError(how)


# ================================================================================ 1. every head
@pytest.mark.parametrize("how", MAKE_PACKED)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_packed_equals_sdpa_at_real_positions(case, how, tmp_path, packed_calls):
    ref_model = make_model(case.cls, seed=len(case.id), **case.config)
    layers = ref_model.config.num_hidden_layers
    if how == "set_attn_implementation":
        model = ref_model
    else:
        model = packed_copy(ref_model, how, tmp_path)
    is_qa = case.cls is bertlab.BertForQuestionAnswering
    for kind in INPUT_KINDS:
        inputs = {**batch_inputs(kind, case.multiple_choice), **case.labels()}
        mask = inputs["attention_mask"].reshape(-1, T).bool()
        assert (~mask).any() and mask.all(1).any()  # padded rows and a full row
        with torch.no_grad():
            if how == "set_attn_implementation":
                ref_model.set_attn_implementation("sdpa")
            packed_calls.clear()
            ref = ref_model(**inputs, output_hidden_states=True)
            assert packed_calls == []
            if how == "set_attn_implementation":
                model.set_attn_implementation("packed")
            assert model.config.attn_implementation == "packed"
            assert model.base_model.config.attn_implementation == "packed"
            got = model(**inputs, output_hidden_states=True)
        assert packed_calls == [False] * layers, "the packed kernel did not run (unpadded)"
        assert len(got.hidden_states) == layers + 1
        if case.id in HAS_LOSS:
            assert got.loss is not None and torch.isfinite(got.loss)
        assert_real_positions_match(got, ref, mask, f"{case.id}/{kind}")
        # Padding positions: zeros (QA: the lowest score), never the padded model's values.
        pads = padding_values(got, mask)
        assert pads, "no per-token output to check"
        for name, values in pads.items():
            fill = torch.finfo(values.dtype).min if name.endswith("_logits") and is_qa else 0.0
            assert (values == fill).all(), f"{case.id}/{kind}.{name} at padding is not {fill}"
    if how == "set_attn_implementation":  # and back: the padded numbers again
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            again = model(**inputs, output_hidden_states=True)
        assert packed_calls == [False] * layers
        for name, t in output_tensors(ref).items():
            assert torch.equal(output_tensors(again)[name], t), name


def test_bertmodel_packed_zeros_at_padding_and_every_position_shape():
    """last_hidden_state is zero at padding; position ids as (B, T), (1, T) or (T,) all work."""
    ref = make_model(bertlab.BertModel)
    packed = make_model(bertlab.BertModel, attn="packed")
    inputs = padded_inputs(LENGTHS)
    mask = inputs["attention_mask"].bool()
    shared = torch.arange(T) + 3
    with torch.no_grad():
        for positions in (shared, shared[None], shared.expand(B, T)):
            inputs["position_ids"] = positions
            a, b = ref(**inputs), packed(**inputs)
            assert_real_positions_match(b, a, mask, f"positions {tuple(positions.shape)}")
            assert (b.last_hidden_state[~mask] == 0).all()
            assert (a.last_hidden_state[~mask] != 0).any()  # the padded model computes them


def test_packed_inputs_embeds_equals_sdpa():
    ref = make_model(bertlab.BertForTokenClassification, num_labels=5)
    packed = make_model(bertlab.BertForTokenClassification, num_labels=5, attn="packed")
    inputs = padded_inputs(LENGTHS)
    mask = inputs["attention_mask"].bool()
    embeds = ref.bert.embeddings.word_embeddings(inputs.pop("input_ids")).detach()
    with torch.no_grad():
        a = ref(inputs_embeds=embeds, **inputs, labels=token_labels(), output_hidden_states=True)
        b = packed(inputs_embeds=embeds, **inputs, labels=token_labels(), output_hidden_states=True)
    assert_real_positions_match(b, a, mask, "inputs_embeds")


def test_mask_with_holes_equals_sdpa():
    """Real tokens need not be contiguous: a mask with zeros inside a row is honoured too."""
    ref = make_model(bertlab.BertForPreTraining)
    packed = make_model(bertlab.BertForPreTraining, attn="packed")
    inputs = padded_inputs((9, 9, 9))
    inputs["attention_mask"][0, [2, 5]] = 0
    inputs["attention_mask"][2, [0, 8]] = 0  # a hole at the start too: [CLS] is then column 1
    mask = inputs["attention_mask"].bool()
    labels = mlm_labels((9, 9, 9)).masked_fill(~mask, -100)
    nsp = torch.tensor([0, 1, 0])
    with torch.no_grad():
        a = ref(**inputs, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
        b = packed(**inputs, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
    # The pooler reads column 0 padded, the first real token packed: row 2 differs by design.
    assert_close(b.seq_relationship_logits[:2], a.seq_relationship_logits[:2], "nsp logits")
    skip = frozenset({"seq_relationship_logits", "loss"})
    assert_real_positions_match(b, a, mask, "holes", skip)


def test_question_answering_loss_equals_the_unpadded_sequences():
    """With every kernel, padding positions are outside the QA loss: the padded batch's loss is
    the mean of each sequence's loss run alone (no padding at all), and of an unpadded batch's."""
    sdpa = make_model(bertlab.BertForQuestionAnswering, seed=5)
    packed = make_model(bertlab.BertForQuestionAnswering, seed=5, attn="packed")
    inputs = padded_inputs(LENGTHS)
    answers = qa_positions()
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        got = packed(**inputs, **answers)
        alone = [
            sdpa(
                **{k: v[i : i + 1, :n] for k, v in inputs.items()},
                **{k: v[i : i + 1] for k, v in answers.items()},
            ).loss
            for i, n in enumerate(LENGTHS)
        ]
        assert_close(got.loss, torch.stack(alone).mean(), "QA loss vs each sequence alone")
        # Rows of one length, no padding: the packed model's dense path equals sdpa's loss.
        same = [1, 3]  # both rows cut to the shorter length (6 and 3 -> 3 tokens)
        unpadded = {k: v[same, :3] for k, v in inputs.items()}
        ans = {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([2, 2])}
        assert_close(packed(**unpadded, **ans).loss, sdpa(**unpadded, **ans).loss, "unpadded")
        # Padding positions score the dtype's minimum, never the answer.
        lowest = torch.finfo(torch.float32).min
        for logits in (got.start_logits, got.end_logits):
            assert (logits[~mask] == lowest).all()
            assert (logits[mask] > lowest).all()
        # The padded kernels give padding the same lowest score: the same loss and scores.
        for attn in ("sdpa", "eager"):
            sdpa.set_attn_implementation(attn)
            padded = sdpa(**inputs, **answers)
            assert_close(padded.loss, got.loss, f"{attn} QA loss")
            for name in ("start_logits", "end_logits"):
                assert torch.equal(getattr(padded, name)[~mask], getattr(got, name)[~mask])
                assert_close(getattr(padded, name), getattr(got, name), f"{attn} {name}")


@pytest.mark.parametrize("attn", ["packed", "sdpa", "eager"])
@pytest.mark.parametrize("start", [6, 8, 9, 30])
def test_question_answering_answer_outside_the_sequence_is_ignored(start, attn):
    """An answer position outside a sequence's real tokens (cut off by a window) is ignored, as
    one at or past the padded width T is, whatever the padding: row 1 has 6 tokens, so a start
    at 6 or 8 lies in its padding, 9 = T at the padded width, 30 beyond any width used here.
    With every kernel, a position on padding must not score against the lowest-score fill
    (~3e38), and the padding positions hold that lowest score."""
    model = make_model(bertlab.BertForQuestionAnswering, attn=attn)
    inputs = padded_inputs(LENGTHS)
    end = torch.tensor([3, 5, 0, 2])
    with torch.no_grad():
        ignored = model(**inputs, start_positions=torch.tensor([1, 100, 0, 2]), end_positions=end)
        for extra in (0, 13):
            cut = model(
                **widen(inputs, extra),
                start_positions=torch.tensor([1, start, 0, 2]),
                end_positions=end,
            )
            assert cut.loss < 100, f"start {start}, T={T + extra}: loss {cut.loss.item():.3g}"
            pad = ~widen(inputs, extra)["attention_mask"].bool()
            assert (cut.start_logits[pad] == torch.finfo(torch.float32).min).all()
            assert_close(cut.loss, ignored.loss, f"start {start}, T={T + extra}")


# ================================================================================ 2. padding
def widen(inputs: dict[str, torch.Tensor], extra: int, pad_value: int = 0) -> dict:
    """``extra`` more padding columns on the right."""
    return {
        k: torch.cat([v, torch.full((v.shape[0], extra), pad_value, dtype=v.dtype)], dim=1)
        for k, v in inputs.items()
    }


@pytest.mark.parametrize("kind", ["explicit_positions", "default_positions"])
def test_extra_padding_columns_change_nothing(kind):
    """Padded to T or to T+13: identical numbers (the packed tokens are the same)."""
    pretraining = make_model(bertlab.BertForPreTraining, attn="packed")
    qa = make_model(bertlab.BertForQuestionAnswering, attn="packed")
    inputs = batch_inputs(kind)
    labels = dict(labels=mlm_labels(), next_sentence_label=torch.tensor([0, 1, 1, 0]))
    wide_labels = widen({"labels": labels["labels"]}, 13, pad_value=-100)
    wide = widen(inputs, 13)
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        a = pretraining(**inputs, **labels, output_hidden_states=True)
        b = pretraining(
            **wide,
            **wide_labels,
            next_sentence_label=labels["next_sentence_label"],
            output_hidden_states=True,
        )
        qa_a = qa(**inputs, **qa_positions())
        qa_b = qa(**wide, **qa_positions())
    assert b.prediction_logits.shape[1] == T + 13
    assert torch.equal(a.loss, b.loss)
    assert torch.equal(a.seq_relationship_logits, b.seq_relationship_logits)
    assert torch.equal(a.prediction_logits[mask], b.prediction_logits[:, :T][mask])
    for x, y in zip(a.hidden_states, b.hidden_states, strict=True):
        assert torch.equal(x, y[:, :T]) and (y[:, T:] == 0).all()
    # (cross-entropy sums over T or T+13 columns, the extra ones exactly 0: same up to rounding)
    assert_close(qa_a.loss, qa_b.loss, "QA loss")
    assert torch.equal(qa_a.start_logits, qa_b.start_logits[:, :T])


def test_padding_content_changes_nothing():
    """Whatever the padding positions hold (ids, token types, position ids), packed ignores it."""
    model = make_model(bertlab.BertForPreTraining, attn="packed")
    inputs = padded_inputs(LENGTHS)
    pad = ~inputs["attention_mask"].bool()
    noisy = {k: v.clone() for k, v in inputs.items()}
    noisy["input_ids"][pad] = 42
    noisy["token_type_ids"][pad] = 1
    noisy["position_ids"][pad] = 63
    with torch.no_grad():
        a, b = model(**inputs, output_hidden_states=True), model(**noisy, output_hidden_states=True)
    for name, t in output_tensors(a).items():
        assert torch.equal(t, output_tensors(b)[name]), name


@pytest.mark.parametrize("attn", ["sdpa", "packed"])
def test_padded_row_equals_the_sequence_alone(attn):
    batch_model = make_model(bertlab.BertForPreTraining, attn=attn)
    inputs = padded_inputs(LENGTHS)
    alone_model = make_model(bertlab.BertForPreTraining, attn="packed")  # no padding: dense
    with torch.no_grad():
        batch = batch_model(**inputs, output_hidden_states=True)
        for i, n in enumerate(LENGTHS):
            alone = alone_model(
                **{k: v[i : i + 1, :n] for k, v in inputs.items()}, output_hidden_states=True
            )
            pairs = zip(batch.hidden_states, alone.hidden_states, strict=True)
            for layer, (x, y) in enumerate(pairs):
                assert_close(x[i : i + 1, :n], y, f"row {i} hidden_states[{layer}]")
            assert_close(batch.prediction_logits[i : i + 1, :n], alone.prediction_logits, "mlm")
            assert_close(
                batch.seq_relationship_logits[i : i + 1], alone.seq_relationship_logits, "nsp"
            )


def test_left_padding_equals_right_padding():
    """Mask zeros at the start of a row, position ids 0.. on the real tokens: the packed model
    gives the right-padded numbers at the real tokens, pooled [CLS] vector included."""
    model = make_model(bertlab.BertForPreTraining, attn="packed")
    right = padded_inputs(LENGTHS, left=False)
    right["position_ids"] = torch.where(
        right["attention_mask"].bool(), torch.arange(T).expand(B, T), 0
    )
    left = padded_inputs(LENGTHS, left=True)
    rmask, lmask = right["attention_mask"].bool(), left["attention_mask"].bool()
    assert torch.equal(right["input_ids"][rmask], left["input_ids"][lmask])
    assert not torch.equal(rmask, lmask)
    labels = mlm_labels()
    left_labels = torch.full_like(labels, -100)
    left_labels[lmask] = labels[rmask]
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        r = model(**right, labels=labels, next_sentence_label=nsp, output_hidden_states=True)
        lo = model(**left, labels=left_labels, next_sentence_label=nsp, output_hidden_states=True)
    assert_close(lo.loss, r.loss, "loss")
    assert_close(lo.seq_relationship_logits, r.seq_relationship_logits, "pooled -> NSP")
    assert_close(lo.prediction_logits[lmask], r.prediction_logits[rmask], "MLM logits")
    for i, (x, y) in enumerate(zip(lo.hidden_states, r.hidden_states, strict=True)):
        assert_close(x[lmask], y[rmask], f"hidden_states[{i}]")
        assert (x[~lmask] == 0).all()


# ================================================================================ 3. edge cases
def test_no_padding_runs_dense_and_equals_sdpa(packed_calls, monkeypatch):
    """Every row full (or no mask): one batched SDPA call per layer, equal to the sdpa model."""
    ref = make_model(bertlab.BertForPreTraining)
    packed = make_model(bertlab.BertForPreTraining, attn="packed")
    inputs = padded_inputs((T, T, T))
    labels = dict(labels=mlm_labels((T, T, T)), next_sentence_label=torch.tensor([0, 1, 0]))
    assert Packing.from_mask(inputs["attention_mask"], 3, T, "cpu").indices is None
    fused = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        fused.append(tuple(q.shape))
        return real_sdpa(q, *args, **kwargs)

    monkeypatch.setattr(bertlab.nn.attention.F, "scaled_dot_product_attention", spy)
    # PyTorch's kernels: bertlab's AVX2 attention, where the policy runs it, is test_avx2.py's
    monkeypatch.setattr(bertlab.nn.avx2, "ATTENTION_TOKENS", 0)
    with torch.no_grad():
        a = ref(**inputs, **labels, output_hidden_states=True)
        for mask in (inputs["attention_mask"], None):
            packed_calls.clear()
            fused.clear()
            b = packed(**{**inputs, "attention_mask": mask}, **labels, output_hidden_states=True)
            assert packed_calls == [True, True], "no padding should run the dense (batched) path"
            assert fused == [(3, 4, T, 8)] * 2, "the dense path should be one batched SDPA call"
            assert_real_positions_match(b, a, torch.ones(3, T, dtype=torch.bool), f"mask {mask}")


@pytest.mark.parametrize("attn", ["eager", "sdpa", "packed"])
def test_single_token_sequences(attn):
    ref = make_model(bertlab.BertForTokenClassification, attn="eager", num_labels=5)
    model = make_model(bertlab.BertForTokenClassification, attn=attn, num_labels=5)
    for lengths, seq_len in (((1,), 1), ((1, 1), 1), ((1, 4), 4), ((1,), 5)):
        inputs = padded_inputs(lengths, seq_len)
        mask = inputs["attention_mask"].bool()
        labels = token_labels(lengths, seq_len)
        with torch.no_grad():
            got = model(**inputs, labels=labels, output_hidden_states=True)
            want = ref(**inputs, labels=labels, output_hidden_states=True)
        assert_real_positions_match(got, want, mask, f"lengths {lengths}, T={seq_len}")


@pytest.mark.parametrize("output_attentions", [False, True])
@pytest.mark.parametrize("attn", ["eager", "sdpa", "packed"])
def test_all_padding_row_is_refused(attn, output_attentions):
    inputs = padded_inputs((5, 3, 4))
    inputs["attention_mask"][1] = 0
    for cls in (bertlab.BertModel, bertlab.BertForSequenceClassification):
        model = make_model(cls, attn=attn)
        with torch.no_grad(), pytest.raises(ValueError, match=r"^row 1 .*no tokens"):
            model(**inputs, output_attentions=output_attentions)
    with pytest.raises(ValueError, match=r"^row 1 .*no tokens"):
        Packing.from_mask(inputs["attention_mask"], 3, 5, "cpu")
    # Every row empty: the first is named.
    inputs["attention_mask"].zero_()
    with torch.no_grad(), pytest.raises(ValueError, match=r"^row 0 .*no tokens"):
        make_model(bertlab.BertModel, attn=attn)(**inputs, output_attentions=output_attentions)


# ================================================================================ 4. packing.py
MASK = torch.tensor(
    [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1],
        [0, 1, 1, 0, 0],  # left padding
        [1, 0, 0, 0, 0],  # a single token
    ]
)


def test_from_mask_layout():
    for mask in (MASK, MASK.bool(), MASK.float()):
        p = Packing.from_mask(mask, 4, 5, "cpu")
        assert (p.batch, p.seq_len) == (4, 5)
        assert p.lengths == (3, 5, 2, 1)
        assert p.total == 11 and p.max_seqlen == 5 and not p.dense
        assert p.cu_seqlens.dtype == torch.int32
        assert p.cu_seqlens.tolist() == [0, 3, 8, 10, 11]
        assert p.indices.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 11, 12, 15]
    # No padding, or no mask: the identity layout.
    for mask in (None, torch.ones(3, 4, dtype=torch.long)):
        p = Packing.from_mask(mask, 3, 4, "cpu")
        assert p.dense and p.indices is None
        assert p.lengths == (4, 4, 4) and p.total == 12 and p.max_seqlen == 4
        assert p.cu_seqlens.tolist() == [0, 4, 8, 12]


def test_unpad_pad_round_trip_and_first_tokens():
    p = Packing.from_mask(MASK, 4, 5, "cpu")
    x = torch.randn(4, 5, 3, 2)
    packed = p.unpad(x)
    assert packed.shape == (11, 3, 2)
    assert torch.equal(packed, x[MASK.bool()])  # sequence by sequence, in order
    for fill in (0.0, -7.5):
        back = p.pad(packed, fill=fill)
        assert back.shape == x.shape
        assert torch.equal(back[MASK.bool()], x[MASK.bool()])
        assert (back[~MASK.bool()] == fill).all()
    # 2-D per-token tensors (labels, ids) too.
    ids = torch.arange(20).view(4, 5)
    assert p.unpad(ids).tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 11, 12, 15]
    # Each row's first real token: column 1 for the left-padded row.
    assert torch.equal(p.first_tokens(packed), x[[0, 1, 2, 3], [0, 0, 1, 0]])
    # Dense: unpad is a reshape, pad its inverse, first_tokens column 0.
    d = Packing.from_mask(None, 4, 5, "cpu")
    assert torch.equal(d.unpad(x), x.reshape(20, 3, 2))
    assert torch.equal(d.pad(d.unpad(x)), x)
    assert torch.equal(d.first_tokens(d.unpad(x)), x[:, 0])


def test_mean_over_real_tokens_is_the_same_in_every_layout():
    """Encoded.mean, the sentence vectors' pooling, averages a packed output row by row without
    padding it back: the padded layout's masked mean (mean_pool), for any dtype; spare rows
    after the last token are never read."""
    from bertlab.pipelines.predict import mean_pool

    p = Packing.from_mask(MASK, 4, 5, "cpu")
    x = torch.randn(4, 5, 6)
    want = mean_pool(x, MASK)
    spare = torch.cat([p.unpad(x), torch.full((5, 6), float("nan"))])  # 5 spare rows
    assert_close(p.mean(spare), want, "packed mean", atol=1e-6)
    assert_close(bertlab.nn.packing.Padded("sdpa", MASK.bool()).mean(x), want, "padded", 1e-7)
    assert_close(bertlab.nn.packing.Padded("sdpa", None).mean(x), x.mean(1), "no padding", 1e-6)
    half = p.mean(p.unpad(x).bfloat16())  # summed in float32
    assert half.dtype == torch.float32
    assert_close(half, mean_pool(x.bfloat16().float(), MASK), "bfloat16 rows", atol=1e-6)
    # Through a model: packed and padded kernels give the same vectors and [CLS] rows.
    model = make_model(bertlab.BertModel, attn="packed")
    ids = torch.randint(5, 50, (4, 5))
    with torch.no_grad():
        packed = model.encode(ids, attention_mask=MASK)
        model.config.attn_implementation = "sdpa"
        padded = model.encode(ids, attention_mask=MASK)
    assert packed.packing is not None and padded.packing is None
    assert_close(packed.mean(), padded.mean(), "model mean", atol=1e-5)
    # [CLS] rows: the first real token packed, column 0 padded (as the reference reads it),
    # the same row except for MASK's left-padded row 2
    right = [0, 1, 3]
    assert_close(packed.first()[right], padded.first()[right], "model [CLS]", atol=1e-5)


def windows_for(lengths, rows=None, dtype=torch.float32):
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    p = Packing.from_mask(mask, len(lengths), max(lengths), "cpu")
    return p, p.windows(rows or p.total, dtype, "cpu")


def block_mask(w, members):
    """What a window's mask must be: 0 where a query and a key belong to the same sequence of
    ``members`` (lengths, from window row w.own on) or where a borrowed row meets itself."""
    want = torch.full((w.width, w.width), float("-inf"))
    want.fill_diagonal_(0.0)
    at = w.own
    for m in members:
        want[at : at + m, at : at + m] = 0.0
        at += m
    return want


def test_attention_windows_hold_their_sequences_and_mask_out_the_rest():
    lengths = (16, 127, 1, 33, 5, 7, 9, 20)
    p_rows = sum(lengths) + 3  # 3 spare rows at the end
    p, plan = windows_for(lengths, rows=p_rows)
    # 5, 7 and 9 tokens share one window (21 <= SHARED_ROWS); 1 + 33 and 21 + 20 would not fit
    members = [(16,), (127,), (1,), (33,), (5, 7, 9), (20,)]
    assert SHARED_ROWS == 32
    starts = [0, 16, 143, 144, 177, 198]
    want = [(s, sum(m)) for s, m in zip(starts, members, strict=True)]
    assert [(w.start, w.n) for w in plan] == want
    for w, m in zip(plan, members, strict=True):
        assert w.width == -(-w.n // 16) * 16  # rounded up to a multiple of 16
        assert 0 <= w.first <= w.start and w.first + w.width <= p_rows
        assert w.own == w.start - w.first
        if w.width == w.n and len(m) == 1:
            assert w.mask is None  # already a multiple: its own rows, no mask
            continue
        assert w.mask.shape == (1, 1, w.width, w.width) and w.mask.dtype == torch.float32
        assert torch.equal(w.mask[0, 0], block_mask(w, m))
    # The last window cannot look ahead past row 220: it moves back.
    assert plan[-1].first + plan[-1].width == p_rows and plan[-1].first < plan[-1].start
    assert plan[1].first == 16  # the others look ahead, into the next sequence
    # One plan per (rows, dtype, device), shared by every layer; masks in the dtype asked for.
    assert p.windows(p_rows, torch.float32, "cpu") is plan
    assert p.windows(p_rows, torch.bfloat16, "cpu")[1].mask.dtype == torch.bfloat16
    # A window that would not fit in the tensor: its own rows, masked only between sequences.
    p, plan = windows_for((5,))
    assert (plan[0].first, plan[0].width, plan[0].mask) == (0, 5, None)
    p, plan = windows_for((3, 4))
    assert (plan[0].first, plan[0].width) == (0, 7)
    assert torch.equal(plan[0].mask[0, 0], block_mask(plan[0], (3, 4)))


def test_windowed_attention_is_each_sequence_alone_whatever_its_neighbours_hold():
    lengths = (16, 127, 1, 33, 5, 70, 3, 9, 11)
    p, plan = windows_for(lengths)
    assert any(w.mask is not None and w.first != w.start for w in plan)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(p.total, 4, 8, generator=g) for _ in range(3))
    with torch.no_grad():
        out, _ = bertlab.nn.attention.packed_attention(q, k, v, p, 0.0)
        starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        for b, (s, e) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
            heads = [t[s:e].transpose(0, 1)[None] for t in (q, k, v)]  # (1, A, n, D)
            alone = torch.nn.functional.scaled_dot_product_attention(*heads)[0].transpose(0, 1)
            assert_close(out[s:e], alone, f"sequence {b}", atol=1e-6)
            # Scale every other sequence's rows by 100: this sequence's result is bit-identical.
            loud = [t.clone() for t in (q, k, v)]
            for t in loud:
                t[:s] *= 100
                t[e:] *= 100
            again, _ = bertlab.nn.attention.packed_attention(*loud, p, 0.0)
            assert torch.equal(again[s:e], out[s:e]), f"sequence {b} saw its neighbours"


def test_windows_of_one_width_run_as_one_call_with_the_same_result(monkeypatch):
    lengths = (20, 30, 25, 5, 70, 32)  # windows 32 (x4: 25 and 5 share one; 32 unmasked), 80
    p, plan = windows_for(lengths)
    groups = p.window_groups(p.total, torch.float32, "cpu")
    assert p.window_groups(p.total, torch.float32, "cpu") is groups  # once per batch
    widths = [(g.width, getattr(g, "count", 1)) for g in groups]
    assert widths == [(32, 4), (80, 1)]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(p.total, 4, 8, generator=g) for _ in range(3))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kw):
        calls.append(args[0].shape)
        return sdpa(*args, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    with torch.no_grad():
        grouped, _ = bertlab.nn.attention.packed_attention(q, k, v, p, 0.0)
        assert [c[0] for c in calls] == [4, 1]  # two calls, not five
        monkeypatch.setattr(Packing, "window_groups", lambda self, *a: self.windows(*a))
        one_by_one, _ = bertlab.nn.attention.packed_attention(q, k, v, p, 0.0)
    assert len(calls) == 2 + 5
    assert torch.equal(grouped, one_by_one)


def test_window_order_fills_the_shared_windows():
    # In batch order the windows are 20 | 20 + 12 | 12 + 5 | 40 | 9 + 6, five; bins of
    # SHARED_ROWS hold 20 + 12 twice and 9 + 6 + 5 once, after the 40-token sequence: four.
    lengths = (20, 20, 12, 12, 5, 40, 9, 6)
    order = window_order(lengths)
    assert sorted(order) == list(range(len(lengths)))
    assert order[0] == 5  # longer than SHARED_ROWS: first, in its own window
    placed = [lengths[i] for i in order]
    assert placed == [40, 20, 12, 20, 12, 9, 6, 5], placed
    _, as_given = windows_for(lengths)
    _, ordered = windows_for(placed)
    assert len(ordered) == len(as_given) - 1 == 4
    assert all(w.n <= SHARED_ROWS for w in ordered[1:])
    # best fit: each sequence goes to the fullest bin it fits in
    five = (30, 20, 10, 2, 12)
    assert [five[i] for i in window_order(five)] == [30, 2, 20, 12, 10]
    assert window_order(()) == [] and window_order((7,)) == [0]
    # SST-2-like lengths: never more windows than the batch order, usually fewer
    g = torch.Generator().manual_seed(0)
    lengths = tuple(torch.randint(3, 45, (200,), generator=g).tolist())
    placed = [lengths[i] for i in window_order(lengths)]
    assert len(windows_for(placed)[1]) < len(windows_for(lengths)[1])


def test_varlen_kernel_gets_the_packing_and_its_result_is_returned(monkeypatch):
    """On CUDA in half precision the packed batch goes to PyTorch's variable-length kernel in
    one call. CI has no GPU, so a stand-in kernel (each sequence alone through SDPA, found
    from the offsets it is given) checks the call: the packed q, k, v, the Packing's offsets
    and longest length, and its output returned as the context."""
    lengths = (16, 127, 1, 33)
    p, _ = windows_for(lengths)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(p.total, 4, 8, generator=g) for _ in range(3))
    calls = []

    def stand_in(q, k, v, cu_q, cu_k, max_q, max_k):
        calls.append((cu_q, cu_k, max_q, max_k))
        out = torch.empty_like(q)
        for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            heads = [t[s:e].transpose(0, 1)[None] for t in (q, k, v)]
            out[s:e] = torch.nn.functional.scaled_dot_product_attention(*heads)[0].transpose(0, 1)
        return out

    monkeypatch.setattr(bertlab.nn.attention, "varlen_kernel", lambda: stand_in)
    monkeypatch.setattr(bertlab.nn.attention, "varlen_ok", lambda q, dropout_p: True)
    with torch.no_grad():
        out, _ = bertlab.nn.attention.packed_attention(q, k, v, p, 0.0)
    assert len(calls) == 1
    cu_q, cu_k, max_q, max_k = calls[0]
    assert cu_q is p.cu_seqlens and cu_k is p.cu_seqlens and cu_q.dtype == torch.int32
    assert cu_q.tolist() == [0, 16, 143, 144, 177] and max_q == max_k == 127
    monkeypatch.undo()  # the CPU path, per sequence through its windows: the same result
    with torch.no_grad():
        assert_close(out, bertlab.nn.attention.packed_attention(q, k, v, p, 0.0)[0], "varlen", 1e-6)


def test_varlen_kernel_only_where_it_can_run():
    half = torch.zeros(4, 2, 8, dtype=torch.bfloat16)
    # On the CPU, in any dtype: the per-sequence path (on CUDA, also float32 or dropout).
    assert not bertlab.nn.attention.varlen_ok(half, 0.0)
    assert not bertlab.nn.attention.varlen_ok(half.float(), 0.0)
    if torch.cuda.is_available():  # pragma: no cover - CI has no GPU
        cuda = half.cuda()
        assert bertlab.nn.attention.varlen_ok(cuda, 0.0) == (
            bertlab.nn.attention.varlen_kernel() is not None
        )
        assert not bertlab.nn.attention.varlen_ok(cuda, 0.1)
        assert not bertlab.nn.attention.varlen_ok(cuda.float(), 0.0)


# ================================================================================ 5. attentions
def test_output_attentions_runs_padded_and_equals_eager(packed_calls):
    eager = make_model(bertlab.BertModel, attn="eager")
    packed = make_model(bertlab.BertModel, attn="packed")
    inputs = padded_inputs(LENGTHS)
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = eager(**inputs, output_attentions=True, output_hidden_states=True)
        got = packed(**inputs, output_attentions=True, output_hidden_states=True)
    assert packed_calls == [], "probabilities asked for: the call runs padded"
    assert len(got.attentions) == 2
    for i, (g, w) in enumerate(zip(got.attentions, want.attentions, strict=True)):
        assert g.shape == (B, 4, T, T)
        assert_close(g, w, f"attentions[{i}]")
        assert (g.masked_select(~mask[:, None, None, :]) == 0).all()
        assert_close(g.sum(-1), torch.ones(B, 4, T), "rows sum to 1")
    assert_real_positions_match(got, want, mask, "with attentions")
    # And the next call without them is packed again.
    with torch.no_grad():
        packed(**inputs)
    assert packed_calls == [False, False]


def test_packed_qa_with_attentions_keeps_padding_outside_the_loss():
    """A packed QA model's loss and padding scores must not change when attention probabilities
    are asked for (which runs that call padded)."""
    model = make_model(bertlab.BertForQuestionAnswering, attn="packed")
    inputs = padded_inputs(LENGTHS)
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        plain = model(**inputs, **qa_positions())
        diag = model(**inputs, **qa_positions(), output_attentions=True)
    assert diag.attentions is not None
    assert_close(diag.start_logits[mask], plain.start_logits[mask], "start logits")
    assert (diag.start_logits[~mask] == torch.finfo(torch.float32).min).all(), (
        "padding scores of a packed QA model depend on output_attentions"
    )
    assert_close(diag.loss, plain.loss, "QA loss with output_attentions=True")


# ================================================================================ 6. training
def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    found = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in found.values()), [n for n, g in found.items() if g is None]
    return found


@pytest.mark.parametrize(
    "cls, labels",
    [
        (
            bertlab.BertForPreTraining,
            lambda: dict(labels=mlm_labels(), next_sentence_label=torch.tensor([0, 1, 1, 0])),
        ),
        (bertlab.BertForTokenClassification, lambda: dict(labels=token_labels())),
    ],
    ids=["BertForPreTraining", "BertForTokenClassification"],
)
def test_gradients_equal_sdpa(cls, labels, packed_calls):
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=5)
    model = make_model(cls, **no_dropout).train()
    inputs = padded_inputs(LENGTHS)
    found = {}
    for attn in ("sdpa", "packed"):
        model.set_attn_implementation(attn)
        model.zero_grad(set_to_none=True)
        loss = model(**inputs, **labels()).loss
        loss.backward()
        found[attn] = (loss.detach(), {n: g.clone() for n, g in grads(model).items()})
    assert packed_calls == [False, False]
    (loss_s, g_s), (loss_p, g_p) = found["sdpa"], found["packed"]
    assert_close(loss_p, loss_s, "loss")
    assert any(g.abs().max() > 1e-2 for g in g_s.values())  # gradients are not all ~0
    for name, g in g_s.items():
        assert_close(g_p[name], g, f"grad {name}")


# ================================================================================ 7. return_logits
@pytest.mark.parametrize("attn", ["sdpa", "packed"])
@pytest.mark.parametrize("cls", [bertlab.BertForPreTraining, bertlab.BertForMaskedLM])
def test_return_logits_false_same_loss_and_gradients(cls, attn):
    model = make_model(
        cls, attn=attn, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    ).train()
    inputs = padded_inputs(LENGTHS)
    labels = dict(labels=mlm_labels())
    if cls is bertlab.BertForPreTraining:
        labels["next_sentence_label"] = torch.tensor([0, 1, 1, 0])
    logits_field = "prediction_logits" if cls is bertlab.BertForPreTraining else "logits"
    found = {}
    for return_logits in (True, False):
        model.zero_grad(set_to_none=True)
        out = model(**inputs, **labels, return_logits=return_logits)
        out.loss.backward()
        logits = getattr(out, logits_field)
        assert (logits is None) == (not return_logits), logits_field
        if cls is bertlab.BertForPreTraining:
            assert out.seq_relationship_logits.shape == (B, 2)
        found[return_logits] = (out.loss.detach(), {n: g.clone() for n, g in grads(model).items()})
    (loss_t, g_t), (loss_f, g_f) = found[True], found[False]
    assert torch.isfinite(loss_t)
    assert_close(loss_f, loss_t, "loss")
    for name, g in g_t.items():
        assert_close(g_f[name], g, f"grad {name}")


# ================================================================================ 8. bfloat16
def cosine_at_real_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a[mask].double(), b[mask].double(), dim=-1)


def test_bfloat16_packed_agrees_with_float32():
    """bfloat16 keeps 8 significant bits: each rounding is off by up to 2**-9 ~ 0.002 relative.
    Over the embeddings, 2 layers and the head that leaves each token's hidden vector within
    about 0.02 rad of float32's (measured cosine > 0.9998 on every layer); cosine similarity
    > 0.99 (0.14 rad) is asserted, while the hidden vectors of two different tokens of
    this model have a cosine of at most ~0.85, so a token mixed up with another fails. Logits
    are compared relative to their largest magnitude (measured 2%, allowed 5%), the loss to 2%
    (measured 0.2%). What must hold exactly: bf16 all the way, no NaN, zeros at padding."""
    ref = make_model(bertlab.BertForPreTraining)
    packed = make_model(bertlab.BertForPreTraining, attn="packed").to(torch.bfloat16)
    inputs = padded_inputs(LENGTHS)
    labels = dict(labels=mlm_labels(), next_sentence_label=torch.tensor([0, 1, 1, 0]))
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = ref(**inputs, **labels, output_hidden_states=True)
        got = packed(**inputs, **labels, output_hidden_states=True)
    assert got.prediction_logits.dtype == torch.bfloat16
    for name, t in output_tensors(got).items():
        assert not torch.isnan(t).any(), f"{name} has NaN"
    for i, (g, w) in enumerate(zip(got.hidden_states, want.hidden_states, strict=True)):
        assert g.dtype == torch.bfloat16
        assert (g[~mask] == 0).all()
        cos = cosine_at_real_tokens(g, w, mask)
        assert cos.min() > 0.99, f"hidden_states[{i}]: cosine {cos.min():.4f}"
    scale = want.prediction_logits[mask].abs().max()
    err = max_diff(got.prediction_logits[mask], want.prediction_logits[mask]) / scale
    assert err < 0.05, f"MLM logits: relative error {err:.3g}"
    assert abs(got.loss.item() - want.loss.item()) < 0.02 * want.loss.item()

    # Also a head with the lowest-score fill (QA) and the dense (no padding) path.
    qa = make_model(bertlab.BertForQuestionAnswering, attn="packed").to(torch.bfloat16)
    with torch.no_grad():
        out = qa(**inputs, **qa_positions())
        full = qa(**padded_inputs((T, T)))
    assert torch.isfinite(out.loss)
    assert (out.start_logits[~mask] == torch.finfo(torch.bfloat16).min).all()
    assert torch.isfinite(out.start_logits[mask]).all() and torch.isfinite(full.end_logits).all()

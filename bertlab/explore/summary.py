"""Parameter accounting: one row per parameter group of a BERT model, in the order of the network,
with its output shape, its parameter count and the formula that gives that count.

The count is read from the real parameters (``p.numel()``); the formula is evaluated from the
config and must agree with it, and every parameter must belong to exactly one row, so the table
can neither drift from the code nor miss a parameter. The layout follows the Keras table of
reference 004 (which calls the vocabulary T and the type vocabulary 2; here they are V and Y).

Shapes: B batch, T sequence length, C choices; the sizes are printed as numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from bertlab.nn.config import BertConfig
from bertlab.nn.heads import (
    HEADS,
    BertForMultipleChoice,
    BertForTokenClassification,
)
from bertlab.nn.model import BertModel, BertPreTrainedModel

TIED = "tied to word_embeddings"  # the formula of a weight shared with the word embeddings: 0 new
LEGEND = "V vocab, H hidden, P max positions, Y token types, I intermediate, K labels, L layers"
SHAPES = "B batch, T sequence length, C choices"
LAYER_NAME = re.compile(r"^encoder\.layer\.(\d+)\.")


@dataclass(frozen=True)
class Row:
    """One parameter group. ``params`` is counted from the module, ``formula`` explains it."""

    name: str  # module path without the base model prefix, e.g. "encoder.layer.3.attention"
    kind: str
    output_shape: str  # e.g. "(B, T, 768)"
    params: int
    formula: str  # e.g. "4*H*H + 4*H", or TIED
    trainable: int  # how many of ``params`` have requires_grad
    tensors: int  # named parameter tensors in the group (bert-base has 199 in all, reference 001)


@dataclass(frozen=True)
class _Spec:
    """A row before counting: ``paths`` are the module / parameter paths that it covers."""

    name: str
    kind: str
    output_shape: str
    formula: str
    paths: tuple[str, ...] = ()  # default: (name,)


def symbols(config: BertConfig) -> dict[str, int]:
    """The sizes the formulas are written in (see LEGEND)."""
    c = config
    return dict(
        V=c.vocab_size,
        H=c.hidden_size,
        P=c.max_position_embeddings,
        Y=c.type_vocab_size,
        I=c.intermediate_size,
        K=c.num_labels,
        L=c.num_hidden_layers,
    )


def evaluate(formula: str, values: dict[str, int]) -> int:
    """The value of a sum of products of integers and symbols, e.g. ``2*H*I + I + H``."""
    if formula == TIED:
        return 0
    total = 0
    for term in formula.split("+"):
        product = 1
        for factor in (f.strip() for f in term.split("*")):
            if factor.isdigit():
                product *= int(factor)
            elif factor in values:
                product *= values[factor]
            else:
                raise ValueError(f"formula {formula!r}: unknown symbol {factor!r}")
        total += product
    return total


def _base_specs(model: BertModel) -> list[_Spec]:
    """Embeddings, every encoder layer, then the pooler, as named inside BertModel."""
    H = model.config.hidden_size
    seq = f"(B, T, {H})"
    specs = [
        _Spec("embeddings.word_embeddings", "Embedding", seq, "V*H"),
        _Spec("embeddings.position_embeddings", "Embedding", seq, "P*H"),
        _Spec("embeddings.token_type_embeddings", "Embedding", seq, "Y*H"),
        _Spec("embeddings.LayerNorm", "LayerNorm", seq, "2*H"),
    ]
    for n in range(len(model.encoder.layer)):
        layer = f"encoder.layer.{n}"
        specs += [
            # Q, K, V and the output projection W_O (reference 004: 2,362,368 for bert-base).
            _Spec(
                f"{layer}.attention",
                "SelfAttention",
                seq,
                "4*H*H + 4*H",
                (f"{layer}.attention.self", f"{layer}.attention.output.dense"),
            ),
            _Spec(f"{layer}.attention.output.LayerNorm", "LayerNorm", seq, "2*H"),
            _Spec(
                f"{layer}.feed_forward",
                "FeedForward",
                seq,
                "2*H*I + I + H",
                (f"{layer}.intermediate.dense", f"{layer}.output.dense"),
            ),
            _Spec(f"{layer}.output.LayerNorm", "LayerNorm", seq, "2*H"),
        ]
    if model.pooler is not None:
        specs.append(_Spec("pooler.dense", "Linear+tanh", f"(B, {H})", "H*H + H"))
    return specs


def _head_specs(model: BertPreTrainedModel) -> list[_Spec]:
    """The task heads, as named from the top-level model."""
    c = model.config
    H, V, K = c.hidden_size, c.vocab_size, c.num_labels
    specs = []
    predictions = getattr(getattr(model, "cls", None), "predictions", None)
    if predictions is not None:
        word = model.base_model.embeddings.word_embeddings.weight
        tied = predictions.decoder.weight is word
        specs += [
            _Spec("cls.predictions.transform.dense", "Linear+act", f"(B, T, {H})", "H*H + H"),
            _Spec("cls.predictions.transform.LayerNorm", "LayerNorm", f"(B, T, {H})", "2*H"),
            _Spec(
                "cls.predictions.decoder",
                "Linear (tied)" if tied else "Linear",
                f"(B, T, {V})",
                TIED if tied else "V*H",
            ),
            # The per-token output bias (reference 004, "MLM-Sim": T parameters).
            _Spec("cls.predictions.bias", "Bias", f"(B, T, {V})", "V"),
        ]
    if hasattr(getattr(model, "cls", None), "seq_relationship"):
        specs.append(_Spec("cls.seq_relationship", "Linear", "(B, 2)", "2*H + 2"))
    if isinstance(model, BertForMultipleChoice):
        specs.append(_Spec("classifier", "Linear", "(B, C)", "H + 1"))
    elif isinstance(model, BertForTokenClassification):
        specs.append(_Spec("classifier", "Linear", f"(B, T, {K})", "H*K + K"))
    elif hasattr(model, "classifier"):
        specs.append(_Spec("classifier", "Linear", f"(B, {K})", "H*K + K"))
    if hasattr(model, "qa_outputs"):
        specs.append(_Spec("qa_outputs", "Linear", "(B, T, 2)", "2*H + 2"))
    return specs


def parameter_table(model: BertPreTrainedModel) -> list[Row]:
    """One Row per parameter group, in the order of the network (meta-device models work).

    Raises AssertionError if a row's formula disagrees with its counted parameters, or if the
    rows do not add up to ``model.num_parameters()`` (a parameter no row claims, or one claimed
    twice). Tied weights are counted once, under the word embeddings.
    """
    base = model.base_model
    base_prefix = "" if base is model else f"{model.base_model_prefix}."
    specs = [(base_prefix, s) for s in _base_specs(base)] + [("", s) for s in _head_specs(model)]
    values = symbols(model.config)
    params = dict(model.named_parameters())  # shared tensors appear once, under the first name
    claimed: dict[str, str] = {}
    rows = []
    for prefix, spec in specs:
        paths = [prefix + p for p in spec.paths or (spec.name,)]
        mine = [n for n in params if any(n == p or n.startswith(p + ".") for p in paths)]
        for n in mine:
            if n in claimed:
                raise AssertionError(f"parameter {n} is in rows {claimed[n]} and {spec.name}")
            claimed[n] = spec.name
        count = sum(params[n].numel() for n in mine)
        expected = evaluate(spec.formula, values)
        if count != expected:
            raise AssertionError(
                f"row {spec.name}: counted {count:,} parameters, formula {spec.formula!r} "
                f"gives {expected:,}"
            )
        trainable = sum(params[n].numel() for n in mine if params[n].requires_grad)
        rows.append(
            Row(spec.name, spec.kind, spec.output_shape, count, spec.formula, trainable, len(mine))
        )
    missing = [n for n in params if n not in claimed]
    if missing:
        raise AssertionError(f"parameters in no row of the table: {', '.join(missing)}")
    total = sum(r.params for r in rows)
    if total != model.num_parameters():
        raise AssertionError(f"rows sum to {total:,}, the model has {model.num_parameters():,}")
    return rows


def _collapse(rows: list[Row]) -> list[Row]:
    """Layer 0 in full, then one subtotal row for all L layers in place of layers 1..L-1."""
    layers = [r for r in rows if LAYER_NAME.match(r.name)]
    if not layers:
        return rows
    count = len({LAYER_NAME.match(r.name).group(1) for r in layers})
    first = [r for r in layers if LAYER_NAME.match(r.name).group(1) == "0"]
    subtotal = Row(
        f"encoder.layer.0-{count - 1} (subtotal)",
        f"× {count} layers",
        first[-1].output_shape,
        sum(r.params for r in layers),
        f"L × {sum(r.params for r in first):,}",
        sum(r.trainable for r in layers),
        sum(r.tensors for r in layers),
    )
    start = rows.index(layers[0])
    rest = [r for r in rows if not LAYER_NAME.match(r.name)]
    return rest[:start] + first + [subtotal] + rest[start:]


def format_table(
    rows: list[Row], title: str, config: BertConfig | None = None, *, collapse_layers: bool = False
) -> str:
    """An aligned text table (as reference 004's), the totals and the legend of the formulas.

    ``config`` gives the legend its numbers (``V=30000 H=768 ...``); ``collapse_layers`` shows
    layer 0 in full and one subtotal row for all layers instead of every layer.
    """
    shown = _collapse(rows) if collapse_layers else rows
    header = ("Parameter group", "Kind", "Output shape", "Params", "Formula")
    cells = [header] + [(r.name, r.kind, r.output_shape, f"{r.params:,}", r.formula) for r in shown]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:  # params right-aligned, the rest left
        cols = zip(row, "<<<><", widths, strict=True)
        return "  ".join(f"{cell:{align}{w}}" for cell, align, w in cols).rstrip()

    rule = sum(widths) + 2 * (len(widths) - 1)
    total = sum(r.params for r in rows)
    trainable = sum(r.trainable for r in rows)
    out = [title, "=" * rule, line(header), "-" * rule, *map(line, cells[1:]), "=" * rule]
    out += [f"Total params: {total:,}", f"Trainable params: {trainable:,}"]
    out += [f"Non-trainable params: {total - trainable:,}"]
    out += [f"Named parameter tensors: {sum(r.tensors for r in rows)}", f"Legend: {LEGEND}"]
    if config is not None:
        out.append("        " + " ".join(f"{k}={v}" for k, v in symbols(config).items()))
    out.append(f"Shapes: {SHAPES}")
    return "\n".join(out)


def build_for_summary(config: BertConfig, head: str = "base") -> BertPreTrainedModel:
    """The model of ``head`` (a key of HEADS) on the meta device: shapes without memory, so
    bert-large costs nothing. Its parameters hold no values; use it only to count."""
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    with torch.device("meta"):
        return HEADS[head](config)

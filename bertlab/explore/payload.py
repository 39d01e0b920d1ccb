"""The explore payload: everything the page shows about one sentence, taken from one real forward
pass of the model, as one JSON-able dict (its format: ``FORMAT``; the page's scripts read it).

Nothing here re-implements the network or the front half of inference. The text is checked and
encoded by the pipelines' front half (``bertlab.pipelines.front``: the text rules, the length
rule and the truncation of the pipelines and the server), a reader's best span comes from the
one span decoder (``bertlab.data.squad.decode_spans``), forward hooks read what the model's own
modules compute (the three embedding lookups, the sum that enters the embedding LayerNorm, each
layer's query, key and value projections) and the model's outputs give the hidden states, the
attention probabilities and the head's answer. What the page adds on top is arithmetic on these
numbers that it shows step by step (q·k/√D, the softmax of a row, the LayerNorm of reference
002), and the tests reconcile that arithmetic with the model's own values.

Tensors travel as ``{"dtype", "shape", "b64"}`` (little-endian bytes, C order). A long input is
summarised so that the file stays small enough to open: attention rows keep their largest
weights, vectors are stored in float16; every such step is named in ``payload["summarised"]``,
which the page shows.

Shapes: T tokens, H hidden, L layers, A heads, D = H / A, P positions, V vocabulary.

Imports the network, the pipelines' front half and text rules, the span decoder, and the other
explore modules (graph.py, summary.py).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertlab.data.squad import decode_spans
from bertlab.explore.graph import network_graph
from bertlab.explore.summary import LAYER_NAME, LEGEND, parameter_table, symbols
from bertlab.files import BUNDLED_NAMES, bundled_model_dir
from bertlab.nn.heads import BertForMultipleChoice
from bertlab.nn.model import BertPreTrainedModel, sinusoidal_positions
from bertlab.pipelines import text as text_rules
from bertlab.pipelines.front import Encoded, TooLong, encode, head_name, max_tokens

FORMAT = "bertlab-explore/1"
ATTENTION_BYTES = 16 * 2**20  # full attention maps up to this size; above it, top-k per row
TOP_K = 32  # keys kept per attention row when summarised
VECTOR_BYTES = 32 * 2**20  # float32 vectors up to this size; above it, float16
POSITIONS_SHOWN = 256  # at most this many positions in the position-similarity pictures
# The position tables themselves: their first TABLE_POSITIONS positions, every one (the shortest
# sinusoid is 2π ≈ 6.3 positions long: drawn from every 2nd position it beats into a moiré), over
# at most DIMENSIONS_SHOWN dimensions spread evenly over H (the wavelengths grow along H: the first
# dimensions alone are all short waves).
TABLE_POSITIONS = 128
DIMENSIONS_SHOWN = 64
PREDICTIONS_K = 5  # masked-LM predictions per token and layer


# ============================================================================ arrays
KINDS = {"f32": "<f4", "f16": "<f2", "u16": "<u2", "i32": "<i4"}  # payload dtype -> bytes


def array(t: torch.Tensor, dtype: str = "f32") -> dict[str, Any]:
    """A tensor as the payload stores it: dtype f32, f16, u16 or i32, shape, base64 bytes."""
    a = t.detach().cpu()
    a = (a.float() if dtype.startswith("f") else a).numpy()
    data = np.ascontiguousarray(a.astype(KINDS[dtype]))
    return {"dtype": dtype, "shape": list(a.shape), "b64": base64.b64encode(data).decode()}


def unarray(a: dict[str, Any]) -> torch.Tensor:
    """The tensor of a payload array (float arrays come back as float32)."""
    data = np.frombuffer(base64.b64decode(a["b64"]), dtype=KINDS[a["dtype"]]).reshape(a["shape"])
    if a["dtype"].startswith("f"):
        return torch.from_numpy(data.astype(np.float32))
    return torch.from_numpy(data.astype(np.int64))


# ============================================================================ the forward pass
class Recorder:
    """Forward hooks that keep what named modules output (and, for some, what they received)."""

    def __init__(self) -> None:
        self.outputs: dict[str, torch.Tensor] = {}
        self.inputs: dict[str, torch.Tensor] = {}
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def watch(self, name: str, module: nn.Module, keep_input: bool = False) -> None:
        def hook(_: nn.Module, args: tuple, out: torch.Tensor) -> None:
            self.outputs[name] = out.detach()
            if keep_input:
                self.inputs[name] = args[0].detach()

        self.handles.append(module.register_forward_hook(hook))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def run(model: BertPreTrainedModel, batch: dict[str, torch.Tensor]) -> tuple[Any, Recorder, dict]:
    """The model's forward pass on one sequence (1, T) with hidden states and attentions, the
    hooked values, and the graph of the modules it called."""
    base = model.base_model
    rec = Recorder()
    emb = base.embeddings
    rec.watch("word", emb.word_embeddings)
    rec.watch("position", emb.position_embeddings)
    rec.watch("segment", emb.token_type_embeddings)
    rec.watch("embedding_norm", emb.LayerNorm, keep_input=True)
    for n, layer in enumerate(base.encoder.layer):
        for part in ("query", "key", "value"):
            rec.watch(f"{part}.{n}", getattr(layer.attention.self, part))
    if isinstance(model, BertForMultipleChoice):  # choices: (1, C=1, T)
        batch = {k: v[:, None] for k, v in batch.items()}
    try:
        with torch.no_grad():
            graph, out = network_graph(
                model,
                batch,
                lambda: model(**batch, output_hidden_states=True, output_attentions=True),
            )
    finally:
        rec.close()
    return out, rec, graph


# ============================================================================ the payload
def build_payload(
    model: BertPreTrainedModel,
    tokenizer: Any,
    text: str,
    pair: str | None = None,
    *,
    truncate: bool = False,
    path: str | None = None,
) -> dict[str, Any]:
    """The payload for ``text`` (and ``pair``, segment B) through ``model`` (any head).

    The text must not be empty or hold an invalid code point (``bertlab.pipelines.text``); over
    the model's length (``front.max_tokens``) it is refused, naming both numbers, unless
    ``truncate`` (then the page says how many tokens were dropped)."""
    check_text(text, "text")
    if pair is not None:
        check_text(pair, "pair")
    config = model.config
    limit = max_tokens(config, tokenizer)
    try:
        (enc,) = encode(
            tokenizer,
            [text],
            "hidden",
            limit=limit,
            pairs=None if pair is None else [pair],
            fields=["text"],
            pair_fields=["pair"],
            long="truncate" if truncate else "error",
            offsets=True,
        )
    except TooLong as e:
        named = (
            "max_position_embeddings"
            if limit == config.max_position_embeddings
            else "the tokenizer's model_max_length"
        )
        raise ValueError(
            f"the input is {e.tokens} tokens long; this model reads at most {limit} ({named}): "
            f"shorten it, or pass truncate=True (--truncate) to keep the first {limit}"
        ) from None
    n = enc.tokens
    truncated = {"tokens": n, "kept": limit, "limit": limit} if enc.truncated else None
    ids = torch.tensor([enc.rows[0].input_ids])  # (1, T)
    types = torch.tensor([enc.rows[0].token_type_ids])
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids)}
    was_training = model.training
    model.eval()
    try:
        out, rec, graph = run(model, batch)
    finally:
        model.train(was_training)

    summarised: list[str] = []
    T, L = ids.shape[1], config.num_hidden_layers
    vector_floats = T * config.hidden_size * (6 + 3 * L + 1)
    vec = "f32"
    if vector_floats * 4 > VECTOR_BYTES:
        vec = "f16"
        summarised.append(
            f"Vectors are stored in float16 ({T} tokens × {config.hidden_size} dimensions × "
            f"{L} layers would take {vector_floats * 4 / 2**20:.0f} MB in float32), so "
            "numbers recomputed on the page agree with the model to about 1e-3."
        )
    payload = {
        "format": FORMAT,
        "model": describe_model(model, path),
        "text": text,
        "pair": pair,
        "truncated": truncated,
        "summarised": summarised,
        "tokens": token_rows(tokenizer, enc),
        "embeddings": embedding_parts(model, rec, vec),
        "layers": layer_parts(model, out, rec, vec, summarised),
        "predictions": predictions(model, out, tokenizer.convert_ids_to_tokens),
        "output": head_output(model, out, enc, tokenizer, text, pair),
        "parameters": parameters(model),
        "graph": graph,
    }
    if truncated:
        summarised.insert(0, f"The input was {n} tokens; the first {limit} are shown.")
    return payload


def check_text(text: Any, what: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a string, got {type(text).__name__}")
    text_rules.check_text(text, what, blank="{field} is empty: give at least one word to explore")


def describe_model(model: BertPreTrainedModel, path: str | None) -> dict[str, Any]:
    c = model.config
    if path is None:
        name = f"a {type(model).__name__} object"
    elif Path(path) == bundled_model_dir():
        name = f"{BUNDLED_NAMES[1]} (bundled)"
    else:
        name = Path(path).name
    return {
        "path": str(path) if path else None,
        "name": name,
        "class": type(model).__name__,
        "head": head_name(model),
        "layers": c.num_hidden_layers,
        "heads": c.num_attention_heads,
        "hidden": c.hidden_size,
        "head_dim": c.hidden_size // c.num_attention_heads,
        "intermediate": c.intermediate_size,
        "vocab": c.vocab_size,
        "max_positions": c.max_position_embeddings,
        "type_vocab": c.type_vocab_size,
        "layer_norm_eps": c.layer_norm_eps,
        "hidden_act": c.hidden_act,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def token_rows(tokenizer: Any, enc: Encoded) -> list[dict[str, Any]]:
    """One row per token: piece, id, segment, the characters it came from, the word it is in."""
    ids = enc.rows[0].input_ids
    segments = enc.rows[0].token_type_ids
    offsets = enc.offsets
    words = enc.word_ids
    pieces = tokenizer.convert_ids_to_tokens(ids)
    special = set(tokenizer.all_special_ids)
    mask_id = tokenizer.mask_token_id
    rows = []
    for i, (piece, id_, seg, (start, end), word) in enumerate(
        zip(pieces, ids, segments, offsets, words, strict=True)
    ):
        is_special = id_ in special and word is None
        rows.append(
            {
                "i": i,
                "token": piece,
                "id": id_,
                "segment": seg,
                "special": is_special,
                "start": None if is_special else start,
                "end": None if is_special else end,
                "word": word,
                "masked": id_ == mask_id,
            }
        )
    return rows


def embedding_parts(model: BertPreTrainedModel, rec: Recorder, vec: str) -> dict[str, Any]:
    """The embedding layer taken apart (reference 002): the three lookups, their sum, the
    LayerNorm's statistics and parameters, and its output, all as the model computed them."""
    norm = model.base_model.embeddings.LayerNorm
    summed = rec.inputs["embedding_norm"][0]  # (T, H): what entered LayerNorm
    mean = summed.mean(-1)
    var = summed.var(-1, unbiased=False)
    P = model.config.max_position_embeddings
    table = model.base_model.embeddings.position_embeddings.weight.detach().float()
    H = table.shape[1]
    shown = torch.arange(0, P, math.ceil(P / POSITIONS_SHOWN))
    dims = torch.arange(0, H, math.ceil(H / DIMENSIONS_SHOWN))
    sinusoids = sinusoidal_positions(P, H)
    learned, sinusoid = table[shown], sinusoids[shown]
    rows = torch.arange(min(P, TABLE_POSITIONS))
    return {
        "word": array(rec.outputs["word"][0], vec),
        "position": array(rec.outputs["position"].reshape(summed.shape), vec),
        "segment": array(rec.outputs["segment"].reshape(summed.shape), vec),
        "sum": array(summed, vec),
        "mean": array(mean),
        "var": array(var),
        "gamma": array(norm.weight),
        "beta": array(norm.bias),
        "eps": norm.eps,
        "output": array(rec.outputs["embedding_norm"][0], vec),
        "positions": {
            "index": array(shown, "i32"),
            "learned_similarity": array(cosine_matrix(learned)),
            "sinusoid_similarity": array(cosine_matrix(sinusoid)),
            "table_index": array(rows, "i32"),
            "dims": array(dims, "i32"),
            "learned": array(table[rows][:, dims]),
            "sinusoid": array(sinusoids[rows][:, dims]),
        },
    }


def cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    """(N, H) -> (N, N) cosine similarities."""
    x = F.normalize(x.float(), dim=-1)
    return x @ x.T


def layer_parts(
    model: BertPreTrainedModel, out: Any, rec: Recorder, vec: str, summarised: list[str]
) -> dict[str, Any]:
    """Hidden states, queries, keys, attention (full or top-k), the value-weighted norms, and
    how each token's vector moves through the layers."""
    c = model.config
    L, A = c.num_hidden_layers, c.num_attention_heads
    D = c.hidden_size // A
    hidden = torch.stack([h[0] for h in out.hidden_states]).float()  # (L+1, T, H)
    attention = torch.stack([a.reshape(a.shape[-3:]) for a in out.attentions]).float()  # (L,A,T,T)
    T = attention.shape[-1]
    query = torch.stack([rec.outputs[f"query.{n}"].reshape(T, -1) for n in range(L)])
    key = torch.stack([rec.outputs[f"key.{n}"].reshape(T, -1) for n in range(L)])
    value = torch.stack([rec.outputs[f"value.{n}"].reshape(T, -1) for n in range(L)])
    layers = model.base_model.encoder.layer
    # ||v_j^h W_O^h||: what token j passes on through head h before it is weighted (Kobayashi
    # et al. 2020, "Attention is not only a weight"); W_O^h is head h's block of W_O's columns.
    norms = torch.empty(L, A, T)
    for n, layer in enumerate(layers):
        w_o = layer.attention.output.dense.weight.detach().float()  # (H, H): y = x W_O^T
        for h in range(A):
            block = slice(h * D, (h + 1) * D)
            norms[n, h] = (value[n][:, block].float() @ w_o[:, block].T).norm(dim=-1)
    if attention.numel() * 4 <= ATTENTION_BYTES:
        stored: dict[str, Any] = array(attention)
    else:
        k = min(TOP_K, T)
        top = attention.topk(k, dim=-1)
        stored = {
            "topk": k,
            "index": array(top.indices.to(torch.int32), "u16"),
            "value": array(top.values),
            "rest": array((1 - top.values.sum(-1)).clamp(min=0)),
        }
        kept = float(top.values.sum(-1).mean())
        summarised.append(
            f"Attention keeps the {k} largest weights of each row (on average {kept:.1%} of "
            f"the row); the full maps ({L} × {A} × {T} × {T}) would take "
            f"{attention.numel() * 4 / 2**20:.0f} MB. The worked example recomputes any pair "
            "from the stored queries and keys."
        )
    unit = F.normalize(hidden, dim=-1)
    self_sim = (unit * unit[0:1]).sum(-1)  # (L+1, T)
    pairwise = unit @ unit.transpose(1, 2)  # (L+1, T, T)
    others = (pairwise.sum(-1) - pairwise.diagonal(dim1=1, dim2=2)) / max(T - 1, 1)
    return {
        "hidden": array(hidden, vec),
        "query": array(query, vec),
        "key": array(key, vec),
        "mask": array(torch.zeros(T)),  # one sequence, no padding: every key is visible
        "scale": D**-0.5,
        "attention": stored,
        "value_norm": array(norms),
        "self_similarity": array(self_sim),
        "mean_similarity": array(others),
    }


def predictions(
    model: BertPreTrainedModel, out: Any, convert: Callable[[list[int]], list[str]]
) -> dict[str, Any] | None:
    """A masked-LM model's head read at every layer: the top pieces for every position, and
    the piece of every id among them (``convert``: the tokenizer's ids -> pieces)."""
    head = model.mlm_head()
    if head is None:
        return None
    with torch.no_grad():
        logits = torch.stack([head(h)[0] for h in out.hidden_states])  # (L+1, T, V)
    top = logits.float().softmax(-1).topk(PREDICTIONS_K, dim=-1)
    ids = sorted(set(top.indices.flatten().tolist()))
    return {
        "k": PREDICTIONS_K,
        "token": array(top.indices.to(torch.int32), "i32"),
        "prob": array(top.values),
        "strings": dict(zip(map(str, ids), convert(ids), strict=True)),
    }


def head_output(
    model: BertPreTrainedModel, out: Any, enc: Encoded, tokenizer: Any, text: str, pair: str | None
) -> dict[str, Any]:
    """What the head answers for this input: the model's own output, formatted."""
    name = head_name(model)
    labels = [model.config.id2label.get(i, f"LABEL_{i}") for i in range(model.config.num_labels)]

    def nsp(logits: torch.Tensor) -> dict[str, Any]:
        return {"labels": ["is next", "not next"], "probs": logits[0].softmax(-1).tolist()}

    if name == "sequence-classification":
        logits = out.logits[0].float()
        return {
            "kind": name,
            "labels": labels,
            "probs": logits.softmax(-1).tolist(),
            "logits": logits.tolist(),
        }
    if name == "token-classification":
        probs = out.logits[0].float().softmax(-1)
        best = probs.max(-1)
        return {
            "kind": name,
            "labels": labels,
            "per_token": best.indices.tolist(),
            "probs": best.values.tolist(),
        }
    if name == "question-answering":
        return {"kind": name, **best_span(out, enc, text, pair)}
    if name == "pretraining":
        return {"kind": name, "nsp": nsp(out.seq_relationship_logits.float())}
    if name == "nsp":
        return {"kind": name, "nsp": nsp(out.logits.float())}
    if name == "masked-lm":
        return {"kind": name}
    if name == "multiple-choice":  # one text is one choice: its score, with nothing to compare
        return {"kind": name, "score": float(out.logits.reshape(-1)[0])}
    pooled = getattr(out, "pooler_output", None)
    return {"kind": "base", "pooled_norm": None if pooled is None else float(pooled[0].norm())}


def best_span(out: Any, enc: Encoded, text: str, pair: str | None, longest: int = 30) -> dict:
    """The highest start + end logit over spans of non-special tokens in the context (the pair
    when there is one, as in question + context), at most ``longest`` tokens long: the one span
    decoder's (``decode_spans``) best, every span read."""
    start, end = out.start_logits[0].float(), out.end_logits[0].float()
    context = 1 if pair is not None else 0
    segments = enc.rows[0].token_type_ids
    ok = torch.tensor(
        [w is not None and s == context for w, s in zip(enc.word_ids, segments, strict=True)]
    )
    spans, _ = decode_spans([start], [end], [ok], top_k=1, max_answer_length=longest)
    best = None
    if spans:
        s, e = spans[0].start, spans[0].end
        source = pair if pair is not None else text
        best = {
            "start": s,
            "end": e,
            "score": spans[0].score,
            "text": source[enc.offsets[s][0] : enc.offsets[e][1]],
        }
    return {"start": array(start), "end": array(end), "best": best}


def parameters(model: BertPreTrainedModel) -> dict[str, Any]:
    """The rows of ``bertlab summary``, with the layer each belongs to."""
    rows = parameter_table(model)
    out = []
    for r in rows:
        m = LAYER_NAME.match(r.name)
        out.append(
            {
                "name": r.name,
                "kind": r.kind,
                "output_shape": r.output_shape,
                "params": r.params,
                "formula": r.formula,
                "trainable": r.trainable,
                "tensors": r.tensors,
                "layer": int(m.group(1)) if m else None,
            }
        )
    return {
        "rows": out,
        "total": sum(r.params for r in rows),
        "trainable": sum(r.trainable for r in rows),
        "tensors": sum(r.tensors for r in rows),
        "legend": LEGEND,
        "symbols": symbols(model.config),
    }

"""What each route does with a request, once ``app.py`` has checked the key, the limits and the
JSON: read its fields (``fields``: every text through the pipelines' text rules, every count
against --max-client-batch-size in the field the request sends), encode them with the pipelines'
front half in a worker thread (``ctx.thread``, ``ServedModel.encode``), send the rows to the
model's batcher (``ctx.compute``), merge windows back (``front.merge_vectors``,
``front.merge_tokens``) and finish the outputs with the pipelines' methods, so a response holds
exactly what the Python pipelines return for the same input.

Every route returns (the JSON result, response headers). Long texts: ``truncate`` cuts them,
``windows`` splits them (embeddings: the token-weighted mean of the windows' mean vectors;
classification: the mean of the windows' probabilities; tagging: overlapping windows, each
piece labelled by the window where it has the most context); without either a text past the
model's length is a 413. The ``x-truncated`` and ``x-windows`` headers list the texts cut or
split, and the OpenAI route says it per vector too.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch

from bertlab.pipelines import front
from bertlab.serve import fields as F
from bertlab.serve.engine import Encoded, RequestError, Row, ServedModel


class Context(Protocol):
    """What a route gets from the app for one request: the client batch limit, a worker thread
    for tokenizing (timed), and the model's batcher (``compute``: the rows' outputs, in order,
    or ``finish(outputs)``: the large tensor work runs in the model's runner thread, see
    ``engine.Batcher``)."""

    max_client_batch_size: int

    async def thread(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any: ...

    async def compute(
        self, model: ServedModel, rows: list[Row], finish: Callable[[list[Any]], Any] | None = None
    ) -> Any: ...


Result = tuple[Any, dict[str, str]]
Route = Callable[[Context, ServedModel, dict[str, Any]], Awaitable[Result]]


_rows = front.rows_of
_per_text = front.per_text


def _long_headers(encoded: list[Encoded]) -> dict[str, str]:
    h = {"x-compute-tokens": str(sum(len(r) for e in encoded for r in e.rows))}
    cut = [str(i) for i, e in enumerate(encoded) if e.truncated]
    split = [f"{i}:{len(e.rows)}" for i, e in enumerate(encoded) if len(e.rows) > 1]
    if cut:
        h["x-truncated"] = ",".join(cut)
    if split:
        h["x-windows"] = ",".join(split)
    return h


# ============================================================================ embeddings
async def _vectors(
    ctx: Context,
    model: ServedModel,
    data: dict,
    texts: list[str],
    fields: list[str],
    then: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[Encoded]]:
    """``texts`` (named ``fields`` in the request) as (N, D) vectors under the request's
    pooling, normalize, dimensions and long-text fields (or ``then`` of them), computed in the
    runner thread."""
    pooling = F.value(data, "pooling", str, "mean", choices=("mean", "cls"))
    normalize = F.value(data, "normalize", bool, True)
    dims = F.value(data, "dimensions", int, None, lo=1, hi=model.config.hidden_size)
    long, direction = F.long_policy(data)
    encoded = await ctx.thread(
        model.encode, texts, pooling, long=long, direction=direction, fields=fields
    )

    def finish(outputs: list[torch.Tensor]) -> torch.Tensor:
        per_text = _per_text(encoded, outputs)
        v = torch.stack(
            [front.merge_vectors(e, outs) for e, outs in zip(encoded, per_text, strict=True)]
        )
        if dims is not None:
            v = v[:, :dims]
        if normalize:
            v = torch.nn.functional.normalize(v, dim=-1)
        return v if then is None else then(v)

    return await ctx.compute(model, _rows(encoded), finish), encoded


async def embed(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /embed: {inputs, normalize, truncate, truncation_direction, dimensions} -> a list
    of vectors (one per input, a list of one for a single string)."""
    items, single = F.texts(data, "inputs", ctx.max_client_batch_size)
    v, encoded = await _vectors(ctx, model, data, items, F.names("inputs", len(items), single))
    return v.numpy(), _long_headers(encoded)  # written by app.JSON


async def openai_embeddings(ctx: Context, model: ServedModel, data: dict) -> Result:
    """OpenAI's /v1/embeddings: {input, model, encoding_format, dimensions} -> {object: list,
    data: [{object: embedding, index, embedding}], model, usage: {prompt_tokens, total_tokens}}.
    The vectors are normalized, as OpenAI's are."""
    fmt = F.value(data, "encoding_format", str, "float", choices=("float", "base64"))
    if isinstance(data.get("input"), list) and any(
        isinstance(x, list | int) for x in data["input"]
    ):
        raise RequestError(422, "input", "input must be text: token arrays are not taken here")
    texts, single = F.texts(data, "input", ctx.max_client_batch_size)
    fields = F.names("input", len(texts), single)
    v, encoded = await _vectors(ctx, model, data, texts, fields)
    items = []
    for i, (row, e) in enumerate(zip(v, encoded, strict=True)):
        if fmt == "base64":
            emb: Any = base64.b64encode(row.numpy().astype("<f4").tobytes()).decode("ascii")
        else:
            emb = row.numpy()  # written by app.JSON
        item = {"object": "embedding", "index": i, "embedding": emb}
        if e.truncated:
            item["truncated"] = True
        if len(e.rows) > 1:
            item["windows"] = len(e.rows)
        items.append(item)
    tokens = sum(e.tokens for e in encoded)
    result = {
        "object": "list",
        "data": items,
        "model": model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return result, _long_headers(encoded)


async def similarity(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /similarity: {inputs: {source_sentence, sentences}} -> cosine of each sentence to
    the source sentence. ``inputs.sentences`` holds up to --max-client-batch-size texts."""
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise RequestError(422, "inputs", "inputs must be {source_sentence, sentences}")
    source = F.text(inputs.get("source_sentence"), "inputs.source_sentence")
    label = "inputs.sentences"
    sentences, single = F.texts(inputs, "sentences", ctx.max_client_batch_size, label=label)
    fields = ["inputs.source_sentence", *F.names(label, len(sentences), single)]
    sims, encoded = await _vectors(
        ctx, model, data, [source, *sentences], fields, lambda v: v[1:] @ v[0]
    )
    return sims.tolist(), _long_headers(encoded)


async def rerank(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /rerank: {query, texts, raw_scores, return_text, truncate} -> [{index, score,
    text?}] best first. A cross-encoder (a classifier with one output) scores each (query,
    text) pair: sigmoid of its logit, or the logit with raw_scores. An embedding model scores
    the cosine of the two vectors."""
    query = F.text(data.get("query"), "query")
    items, single = F.texts(data, "texts", ctx.max_client_batch_size)
    names = F.names("texts", len(items), single)
    raw = F.value(data, "raw_scores", bool, False)
    with_text = F.value(data, "return_text", bool, False)
    if model.head == "sequence-classification":
        long, _ = F.long_policy(data, windows_ok=False)
        encoded = await ctx.thread(
            model.encode,
            [query] * len(items),
            "logits",
            pairs=items,
            long=long,
            fields=names,
            pair_fields=names,
        )
        logits = torch.stack(await ctx.compute(model, _rows(encoded)))[:, 0]
        scores = (logits if raw else logits.sigmoid()).tolist()
    else:
        sims, encoded = await _vectors(
            ctx, model, data, [query, *items], ["query", *names], lambda v: v[1:] @ v[0]
        )
        scores = sims.tolist()
    ranked = sorted(range(len(items)), key=lambda i: -scores[i])
    result = [
        {"index": i, "score": scores[i], **({"text": items[i]} if with_text else {})}
        for i in ranked
    ]
    return result, _long_headers(encoded)


# ============================================================================ heads
def _predict_inputs(
    data: dict, most: int
) -> tuple[list[str], list[str] | None, bool, list[str], list[str] | None]:
    """TEI's forms: "text", ["text", "pair"], or a list of ["text"] / ["text", "pair"] -> the
    texts, the pairs, whether one input was sent, and the fields that name them."""
    v = data.get("inputs")
    if isinstance(v, str):
        return [F.text(v, "inputs")], None, True, ["inputs"], None
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v):
        pair = [F.text(v[1], "inputs[1]")]
        return [F.text(v[0], "inputs[0]")], pair, True, ["inputs"], ["inputs[1]"]
    if not isinstance(v, list) or not v or not all(isinstance(x, list) for x in v):
        raise RequestError(
            422,
            "inputs",
            'inputs must be "text", ["text", "pair"], or a list of ["text"] or ["text", "pair"]',
        )
    F.too_many("inputs", len(v), most)
    sizes = {len(x) for x in v}
    if not sizes <= {1, 2} or len(sizes) > 1:
        raise RequestError(422, "inputs", "every item must hold one text, or every item two")
    texts = [F.text(x[0], f"inputs[{i}][0]") for i, x in enumerate(v)]
    pairs = [F.text(x[1], f"inputs[{i}][1]") for i, x in enumerate(v)] if sizes == {2} else None
    fields = [f"inputs[{i}]" for i in range(len(v))]
    pair_fields = None if pairs is None else [f"inputs[{i}][1]" for i in range(len(v))]
    return texts, pairs, False, fields, pair_fields


async def predict(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /predict: {inputs, raw_scores, truncate, windows} -> every label with its score
    (probability, or logit with raw_scores), best first; a list of those for a batch. Windows
    of one text: the mean of their probabilities (of their logits for raw_scores and
    regression)."""
    items, pairs, single, fields, pair_fields = _predict_inputs(data, ctx.max_client_batch_size)
    raw = F.value(data, "raw_scores", bool, False)
    long, direction = F.long_policy(data)
    encoded = await ctx.thread(
        model.encode,
        items,
        "logits",
        pairs=pairs,
        long=long,
        direction=direction,
        fields=fields,
        pair_fields=pair_fields,
    )
    clf, results = model.classify, []
    for outs in _per_text(encoded, await ctx.compute(model, _rows(encoded))):
        logits = torch.stack(outs)  # (windows, C)
        if raw:
            results.append(clf.ranked(logits.mean(0)))
        elif len(outs) == 1 or clf.regression:  # a value: the mean of the windows' values
            results.append(clf.labels(logits.mean(0), top_k=None))
        else:  # windows: the mean of their probabilities
            results.append(clf.ranked(logits.softmax(-1).mean(0)))
    return (results[0] if single else results), _long_headers(encoded)


async def ner(ctx: Context, model: ServedModel, data: dict) -> Result:
    """/ner: {inputs, aggregation: "entities" | "words", truncate, windows} -> per text its
    entities {entity, text, start, end, score} (word pieces merged into words, words into
    entities by the conlleval rules), or its words {word, label, score, start, end}."""
    items, single = F.texts(data, "inputs", ctx.max_client_batch_size)
    aggregation = F.value(data, "aggregation", str, "entities", choices=("entities", "words"))
    long, direction = F.long_policy(data)
    encoded = await ctx.thread(
        model.encode,
        items,
        "tokens",
        long=long,
        direction=direction,
        offsets=True,
        fields=F.names("inputs", len(items), single),
    )
    results = []
    outputs = _per_text(encoded, await ctx.compute(model, _rows(encoded)))
    for text, e, outs in zip(items, encoded, outputs, strict=True):
        probs = front.merge_tokens(e, outs)  # the pieces e describes: those kept, or all
        if aggregation == "words":
            words = model.tag.words(e.word_ids, e.offsets, probs)
            results.append([{"word": text[w["start"] : w["end"]], **w} for w in words])
        else:
            results.append(model.tag.entities(text, e.word_ids, e.offsets, probs))
    return (results[0] if single else results), _long_headers(encoded)


async def qa(ctx: Context, model: ServedModel, data: dict) -> Result:
    """/qa: {question, context, top_k, max_answer_length, doc_stride, max_length,
    allow_no_answer} -> the best span {answer, start, end, score} (a list of top_k spans when
    top_k > 1); contexts longer than one window run in windows doc_stride tokens apart."""
    question = F.text(data.get("question"), "question")
    context = F.text(data.get("context"), "context")
    top_k = F.value(data, "top_k", int, 1, lo=1, hi=100)
    max_answer = F.value(data, "max_answer_length", int, 30, lo=1, hi=model.max_length)
    max_length = F.value(
        data, "max_length", int, min(384, model.max_length), lo=32, hi=model.max_length
    )
    stride = F.value(data, "doc_stride", int, 128, lo=1, hi=max_length - 1)
    max_query = F.value(data, "max_query_length", int, 64, lo=1, hi=max_length // 2)
    no_answer = F.value(data, "allow_no_answer", bool, False)
    try:
        example, features = await ctx.thread(
            model.answer.windows, question, context, max_length, stride, max_query
        )
    except ValueError as e:
        raise RequestError(422, "context", str(e)) from e
    rows = [Row(f["input_ids"], f["token_type_ids"], "span") for f in features]
    outs = await ctx.compute(model, rows)
    answers = model.answer.answers(
        example, features, [s for s, _ in outs], [e for _, e in outs], top_k, max_answer, no_answer
    )
    headers = {"x-compute-tokens": str(sum(len(r) for r in rows))}
    if len(rows) > 1:
        headers["x-windows"] = f"0:{len(rows)}"  # as the other routes say it: text 0, n windows
    return (answers[0] if top_k == 1 else answers), headers


async def fill_mask(ctx: Context, model: ServedModel, data: dict) -> Result:
    """/fill-mask: {inputs, top_k, targets} -> per text the top_k candidates for its [MASK]
    (a list per [MASK] when it has several), transformers' {score, token, token_str,
    sequence}."""
    items, single = F.texts(data, "inputs", ctx.max_client_batch_size)
    vocab = model.config.vocab_size
    top_k = F.value(data, "top_k", int, 5, lo=1, hi=vocab)
    targets = None
    if data.get("targets") is not None:
        names, _ = F.texts(data, "targets", vocab)
        try:
            targets = sorted({model.fill._target_id(t) for t in names})
        except ValueError as e:
            raise RequestError(422, "targets", str(e)) from e
        top_k = min(top_k, len(targets))
    fields = F.names("inputs", len(items), single)
    encoded = await ctx.thread(model.encode, items, "masks", fields=fields)
    mask = model.tokenizer.mask_token_id
    for where, e in zip(fields, encoded, strict=True):
        if mask not in e.rows[0].input_ids:
            raise RequestError(422, where, f"{where} has no {model.tokenizer.mask_token} token")

    def finish(outputs: list[torch.Tensor]) -> list[list[list[tuple]]]:  # softmax over V
        return [model.fill.top(logits, top_k, targets) for logits in outputs]

    results = []
    for e, best in zip(encoded, await ctx.compute(model, _rows(encoded), finish), strict=True):
        ids = e.rows[0].input_ids
        masks = [p for p, t in enumerate(ids) if t == mask]
        results.append(model.fill.candidates(ids, masks, best))
    return (results[0] if single else results), _long_headers(encoded)


# ============================================================================ tokens
async def tokenize(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /tokenize: {inputs, add_special_tokens} -> per text its tokens {id, text, special,
    start, stop} (character offsets into the text)."""
    items, single = F.texts(data, "inputs", ctx.max_client_batch_size)
    special = F.value(data, "add_special_tokens", bool, True)
    enc = model.tokenizer(
        items, add_special_tokens=special, return_offsets_mapping=True, return_attention_mask=False
    )
    specials = set(model.tokenizer.all_special_ids)
    out = []
    for i in range(len(items)):
        ids, offs = enc["input_ids"][i], enc["offset_mapping"][i]
        toks = model.tokenizer.convert_ids_to_tokens(ids)
        out.append(
            [
                {"id": t, "text": s, "special": t in specials, "start": a, "stop": b}
                for t, s, (a, b) in zip(ids, toks, offs, strict=True)
            ]
        )
    return (out[0] if single else out), {}


async def decode(ctx: Context, model: ServedModel, data: dict) -> Result:
    """TEI's /decode: {ids: [int] or [[int]], skip_special_tokens} -> the text(s)."""
    ids = data.get("ids")
    skip = F.value(data, "skip_special_tokens", bool, True)
    single = isinstance(ids, list) and all(isinstance(x, int) for x in ids)
    rows = [ids] if single else ids
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise RequestError(422, "ids", "ids must be a list of token ids or a list of such lists")
    if len(rows) > ctx.max_client_batch_size:
        raise RequestError(
            413, "ids", f"ids holds {len(rows)} lists; at most {ctx.max_client_batch_size}"
        )
    V = model.config.vocab_size
    for r, row in enumerate(rows):
        for p, t in enumerate(row):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V:
                where = f"ids[{p}]" if single else f"ids[{r}][{p}]"
                raise RequestError(
                    422, where, f"token id {t!r} at {where} is outside the vocabulary (size {V})"
                )
    texts = [model.tokenizer.decode(row, skip_special_tokens=skip) for row in rows]
    return (texts[0] if single else texts), {}


ROUTES: dict[str, Route] = {
    "embed": embed,
    "v1/embeddings": openai_embeddings,
    "similarity": similarity,
    "rerank": rerank,
    "predict": predict,
    "ner": ner,
    "qa": qa,
    "fill-mask": fill_mask,
    "tokenize": tokenize,
    "decode": decode,
}
EVERY_MODEL = ("tokenize", "decode")  # routes every head serves

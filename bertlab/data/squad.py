"""Question answering data: SQuAD v1.1 and v2.0 JSON, windows over long contexts, answers back.

Reading checks every answer against its context: the text at ``answer_start`` must be the
answer's text. One that is not is counted and reported, and never used as a training target
(it still counts as a gold answer for evaluation, as the official script compares texts).

Features follow the original recipe (``run_squad.py``): the question, cut to
``max_query_length`` tokens, then as much of the context as fits in ``max_length``; a longer
context gives several windows, each starting ``doc_stride`` tokens after the previous one. A
training window's target is the answer's first and last token, found through the tokens'
character offsets; a window that does not hold the whole answer points at [CLS] (position 0), as
the original does, and so does an unanswerable question (v2.0).

Answers are read back per example over all its windows (``best_answers``): the ``n_best``
highest start and end logits, spans inside the context, end not before start, at most
``max_answer_length`` tokens, scored start + end logit; the best span's text is cut from the
context by character offsets. For v2.0 the no-answer score is the lowest [CLS] start + end over
the windows, and a question is left unanswered when that beats the best span by more than
``null_threshold``.

``decode_spans`` is bertlab's one span decoder: ``best_answers`` here, the question-answering
pipelines of both name sets (bertlab/pipelines), the server's /qa and the explorer's answer all
read their spans through it. Its ``scoring="probabilities"`` is transformers' question-answering
pipeline's scoring, which its parity needs. Imports torch and the tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertlab.tokenizer import BertTokenizer


@dataclass
class SquadExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[str]  # every gold text ([] when unanswerable)
    answer_start: int | None  # the first answer that matches its context, for training
    answer_text: str | None


@dataclass
class SquadData:
    examples: list[SquadExample]
    version: str
    source: str
    mismatched: list[str] = field(default_factory=list)  # ids with an answer off its offset

    def __len__(self) -> int:
        return len(self.examples)

    def describe(self) -> str:
        titles = len({e.title for e in self.examples})
        no = sum(not e.answers for e in self.examples)
        return (
            f"{self.source}: SQuAD {self.version}, {titles} articles, {len(self):,} "
            f"questions ({no:,} unanswerable); {len(self.mismatched)} answers whose text "
            f"does not match the context at their offset (not used for training)"
        )


def read_squad(path: str | os.PathLike, titles: set[str] | None = None) -> SquadData:
    """Read a SQuAD file; ``titles`` keeps only those articles (to hold some out)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file at {path}")
    try:
        raw = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise ValueError(f"{path}: not SQuAD JSON (no top-level 'data' list)")
    examples, mismatched = [], []
    v2 = False
    for a, article in enumerate(raw["data"]):
        title = article.get("title", f"article {a}")
        if titles is not None and title not in titles:
            continue
        for p, para in enumerate(article.get("paragraphs", [])):
            context = para.get("context")
            if not isinstance(context, str):
                raise ValueError(f"{path}: article {title!r}, paragraph {p} has no context")
            for qa in para.get("qas", []):
                qid, question = qa.get("id"), qa.get("question")
                if not isinstance(qid, str) or not isinstance(question, str):
                    raise ValueError(
                        f"{path}: article {title!r}, paragraph {p}: a question "
                        "without an id or text"
                    )
                impossible = bool(qa.get("is_impossible", False))
                v2 = v2 or "is_impossible" in qa
                answers = [] if impossible else qa.get("answers", [])
                texts, start, text = [], None, None
                for ans in answers:
                    texts.append(ans["text"])
                    s = ans.get("answer_start")
                    ok = isinstance(s, int) and context[s : s + len(ans["text"])] == ans["text"]
                    if ok and start is None:
                        start, text = s, ans["text"]
                    elif not ok:
                        mismatched.append(qid)
                if not impossible and not texts:
                    raise ValueError(
                        f"{path}: question {qid} has no answer and is not marked is_impossible"
                    )
                examples.append(SquadExample(qid, title, question, context, texts, start, text))
    if not examples:
        raise ValueError(
            f"{path} holds no questions" + (f" of the articles {sorted(titles)}" if titles else "")
        )
    return SquadData(examples, "2.0" if v2 else "1.1", str(path), mismatched)


def encode_squad(
    tokenizer: BertTokenizer,
    data: SquadData,
    *,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = True,
) -> list[dict[str, Any]]:
    """Windows over every example: {input_ids, token_type_ids, example (index), offsets (the
    context tokens' character spans, None elsewhere)} and, when ``training``, start_positions
    and end_positions. Examples with no usable answer are left out of training (counted by
    the caller through ``data.mismatched``); unanswerable ones point at [CLS]."""
    if max_query_length < 1:
        raise ValueError(f"max_query_length must be >= 1, got {max_query_length}")
    passages = list(dict.fromkeys(e.context for e in data.examples))  # each passage once
    sizes = tokenizer(
        passages,
        add_special_tokens=False,
        return_length=True,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    sizes = sizes["length"]
    for passage, size in zip(passages, sizes, strict=True):
        if size == 0:
            qid = next(e.id for e in data.examples if e.context == passage)
            raise ValueError(f"question {qid}: its context has no tokens ({passage[:60]!r})")
    kept = [
        i
        for i, e in enumerate(data.examples)
        if not training or not e.answers or e.answer_start is not None
    ]
    # Questions cut to their first max_query_length tokens, by character offsets.
    asked = tokenizer(
        [data.examples[i].question for i in kept],
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["offset_mapping"]
    room = max_length - tokenizer.num_special_tokens_to_add(True)
    questions = []
    for i, offsets in zip(kept, asked, strict=True):
        n = min(len(offsets), max_query_length)
        if room - n <= doc_stride:
            raise ValueError(
                f"question {data.examples[i].id}: {n} question tokens leave a context window of "
                f"{room - n} tokens in max_length {max_length}, not more than doc_stride "
                f"{doc_stride}; lower max_query_length or doc_stride, or raise max_length"
            )
        question = data.examples[i].question
        questions.append(question if n == len(offsets) else question[: offsets[n - 1][1]])
    contexts = [data.examples[i].context for i in kept]
    enc = tokenizer(
        questions,
        contexts,
        truncation="only_second",
        max_length=max_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_attention_mask=False,
    )
    features = []
    for w, sample in enumerate(enc["overflow_to_sample_mapping"]):
        example = kept[sample]
        seq = enc.sequence_ids(w)
        offsets = [
            tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][w], seq, strict=True)
        ]
        f = {
            "input_ids": enc["input_ids"][w],
            "token_type_ids": enc["token_type_ids"][w],
            "example": example,
            "offsets": offsets,
        }
        if training:
            e = data.examples[example]
            f["start_positions"] = f["end_positions"] = 0
            if e.answer_start is not None:
                first, last = e.answer_start, e.answer_start + len(e.answer_text or "")
                inside = [i for i, o in enumerate(offsets) if o is not None]
                if offsets[inside[0]][0] <= first and offsets[inside[-1]][1] >= last:
                    f["start_positions"] = next(i for i in inside if offsets[i][1] > first)
                    f["end_positions"] = max(i for i in inside if offsets[i][0] < last)
        features.append(f)
    return features


@dataclass(frozen=True)
class Span:
    """An answer span: its score, the window it was read from, and its first and last token
    there."""

    score: float
    window: int
    start: int
    end: int


SCORINGS = ("logits", "probabilities")


def decode_spans(
    start_logits: Sequence[torch.Tensor],
    end_logits: Sequence[torch.Tensor],
    allowed: Sequence[torch.Tensor],
    *,
    top_k: int = 1,
    max_answer_length: int = 30,
    candidates: int | None = None,
    scoring: str = "logits",
) -> tuple[list[Span], float | None]:
    """The ``top_k`` best answer spans over a question's windows, best first (ties in window
    order, then by start and end token), and the no-answer score: the lowest [CLS] score over
    the windows (None without windows).

    Per window w: ``start_logits[w]`` and ``end_logits[w]`` (T,) (padding past n is ignored)
    and ``allowed[w]`` (n,) bool, the tokens an answer may begin and end at (the context's). A
    span runs from start s to end e >= s, at most ``max_answer_length`` tokens.

    ``scoring="logits"`` (the original BERT recipe): start + end logit, and with ``candidates``
    only spans among the window's ``candidates`` highest start and end logits are read
    (``run_squad.py``'s ``n_best_size``; None: every span). ``scoring="probabilities"``
    (transformers' question-answering pipeline): P(start) x P(end), each a softmax over the
    allowed tokens and [CLS] (the others at -10000); [CLS] alone is the no-answer score, and
    each window's ``top_k`` are chosen among all its (s, e <= s + max_answer_length - 1) pairs
    before those outside the allowed tokens are dropped, as transformers does."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring {scoring!r} is not one of {', '.join(SCORINGS)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k {top_k!r} is not a positive int")
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length must be >= 1, got {max_answer_length}")
    read = _window_probabilities if scoring == "probabilities" else _window_logits
    spans: list[Span] = []
    null: float | None = None
    for w, ok in enumerate(allowed):
        n = len(ok)
        found, cls = read(
            w,
            start_logits[w][:n].float(),
            end_logits[w][:n].float(),
            torch.as_tensor(ok, dtype=torch.bool),
            top_k,
            max_answer_length,
            candidates,
        )
        spans += found
        null = cls if null is None else min(null, cls)
    spans.sort(key=lambda x: -x.score)  # stable: ties keep their window and token order
    return spans[:top_k], null


def _window_logits(
    w: int,
    s: torch.Tensor,
    e: torch.Tensor,
    ok: torch.Tensor,
    top_k: int,
    longest: int,
    candidates: int | None,
) -> tuple[list[Span], float]:
    """One window's best spans by start + end logit, and its [CLS] score."""
    n = len(ok)
    if candidates is None:
        starts = ends = torch.arange(n)
    else:
        starts = s.topk(min(candidates, n)).indices
        ends = e.topk(min(candidates, n)).indices
    score = s[starts][:, None] + e[ends][None, :]  # (S, E), in candidate order
    length = ends[None, :] - starts[:, None] + 1
    valid = ok[starts][:, None] & ok[ends][None, :] & (length >= 1) & (length <= longest)
    where = valid.nonzero()  # (K, 2), row-major: the candidates' order
    scores = score[valid]
    order = scores.argsort(descending=True, stable=True)[:top_k].tolist()
    found = [
        Span(float(scores[k]), w, int(starts[where[k, 0]]), int(ends[where[k, 1]])) for k in order
    ]
    return found, float(s[0] + e[0])


def _window_probabilities(
    w: int,
    s: torch.Tensor,
    e: torch.Tensor,
    ok: torch.Tensor,
    top_k: int,
    longest: int,
    candidates: int | None,
) -> tuple[list[Span], float]:
    """One window's best spans by P(start) x P(end) (transformers' scoring), and P([CLS])^2."""
    n = len(ok)
    keep = ok.clone()
    keep[0] = True  # [CLS]: in the softmax, the empty answer
    start = s.masked_fill(~keep, -10000.0).softmax(-1)  # (n,)
    end = e.masked_fill(~keep, -10000.0).softmax(-1)
    cls = float(start[0] * end[0])
    start[0] = end[0] = 0.0  # [CLS] is the empty answer, not a span
    spans = torch.outer(start, end).triu().tril(longest - 1)  # (n, n)
    flat = spans.flatten()
    if top_k == 1:
        order = flat.argmax().reshape(1)
    else:
        order = flat.argsort(descending=True, stable=True)[:top_k]
    found = []
    for i in order.tolist():
        a, z = divmod(i, n)
        if keep[a] and keep[z]:
            found.append(Span(float(spans[a, z]), w, a, z))
    return found, cls


def best_answers(
    data: SquadData,
    features: list[dict[str, Any]],
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
    null_threshold: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Per question id: {"text", "start", "end" (character offsets), "score", "window" and
    "tokens" (the span's first and last token there), "n_best": [...], "null_score"}.
    ``start_logits``/``end_logits``: (windows, T), in ``features``' order; spans are read by
    ``decode_spans`` among the ``n_best`` highest start and end logits of each window.
    ``null_threshold`` (SQuAD 2.0): answer "" when null_score - best score > threshold."""
    by_example: dict[int, list[int]] = {}
    for w, f in enumerate(features):
        by_example.setdefault(f["example"], []).append(w)
    results = {}
    for example, windows in by_example.items():
        e = data.examples[example]
        found, null = decode_spans(
            [start_logits[w] for w in windows],
            [end_logits[w] for w in windows],
            [torch.tensor([o is not None for o in features[w]["offsets"]]) for w in windows],
            top_k=n_best,
            max_answer_length=max_answer_length,
            candidates=n_best,
        )
        spans = []
        for span in found:
            w = windows[span.window]
            a, b = features[w]["offsets"][span.start][0], features[w]["offsets"][span.end][1]
            spans.append(
                {
                    "text": e.context[a:b],
                    "start": a,
                    "end": b,
                    "score": span.score,
                    "window": w,
                    "tokens": (span.start, span.end),
                }
            )
        best = (
            spans[0]
            if spans
            else {
                "text": "",
                "start": 0,
                "end": 0,
                "score": float("-inf"),
                "window": None,
                "tokens": None,
            }
        )
        answer = dict(best)
        abstain = null_threshold is not None and null is not None
        if abstain and null - best["score"] > null_threshold:  # type: ignore[operator]
            answer = {
                "text": "",
                "start": 0,
                "end": 0,
                "score": null,
                "window": None,
                "tokens": None,
            }
        results[e.id] = {**answer, "null_score": null, "n_best": spans}
    return results

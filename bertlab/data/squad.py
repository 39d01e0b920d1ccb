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

Answers are read back per example over all its windows: the ``n_best`` highest start and end
logits, spans inside the context, end not before start, at most ``max_answer_length`` tokens,
scored start + end logit; the best span's text is cut from the context by character offsets.
For v2.0 the no-answer score is the best [CLS] start + end over the windows, and a question is
left unanswered when that beats the best span by more than ``null_threshold``.
"""

from __future__ import annotations

import json
import os
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
    ``start_logits``/``end_logits``: (windows, T), in ``features``' order.
    ``null_threshold`` (SQuAD 2.0): answer "" when null_score - best score > threshold."""
    by_example: dict[int, list[int]] = {}
    for w, f in enumerate(features):
        by_example.setdefault(f["example"], []).append(w)
    results = {}
    for example, windows in by_example.items():
        e = data.examples[example]
        spans, null = [], None
        for w in windows:
            offsets = features[w]["offsets"]
            s_log, e_log = start_logits[w].float(), end_logits[w].float()
            score0 = float(s_log[0] + e_log[0])
            null = score0 if null is None else min(null, score0)
            n = len(offsets)
            starts = s_log[:n].topk(min(n_best, n)).indices.tolist()
            ends = e_log[:n].topk(min(n_best, n)).indices.tolist()
            for i in starts:
                for j in ends:
                    if offsets[i] is None or offsets[j] is None or j < i:
                        continue
                    if j - i + 1 > max_answer_length:
                        continue
                    a, b = offsets[i][0], offsets[j][1]
                    spans.append(
                        {
                            "text": e.context[a:b],
                            "start": a,
                            "end": b,
                            "score": float(s_log[i] + e_log[j]),
                            "window": w,
                            "tokens": (i, j),
                        }
                    )
        spans.sort(key=lambda s: -s["score"])
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
        results[e.id] = {**answer, "null_score": null, "n_best": spans[:n_best]}
    return results

"""The metrics BERT's tasks are reported with, computed the way the field computes them.

Every function returns fractions in [0, 1] (multiply by 100 for the percentages that papers and
the official scripts print), except correlations, in [-1, 1].

* classification (GLUE): ``accuracy``, ``f1`` (binary, for the positive class, as MRPC and QQP
  report it; or macro / micro), ``matthews_corrcoef`` (CoLA; the multi-class form),
  ``pearson`` and ``spearman`` (STS-B; Spearman on average ranks for ties);
* entities (CoNLL-2003): ``conll_entities`` splits tag sequences into typed chunks by the rules of
  the ``conlleval`` script, and ``conlleval`` scores predicted chunks against gold ones: a chunk is
  correct when its type, first and last token all match (precision, recall, F1, overall and per
  type, and token accuracy);
* question answering (SQuAD): ``normalize_answer`` (lower case, punctuation and the articles a, an,
  the removed, whitespace collapsed), ``exact_match`` and ``token_f1`` against the best of the
  gold answers; ``squad`` over a set of questions; for SQuAD 2.0 an empty gold list means "no
  answer" (right only when the prediction is empty too) and ``best_no_answer_threshold`` finds the
  no-answer probability above which to abstain, as the official 2.0 script does.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any


def _pair(preds: Sequence, labels: Sequence) -> tuple[list, list]:
    preds, labels = list(preds), list(labels)
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels: they must match")
    if not labels:
        raise ValueError("no examples to score: an empty set has no metric")
    return preds, labels


# ============================================================================ classification
def accuracy(preds: Sequence, labels: Sequence) -> float:
    preds, labels = _pair(preds, labels)
    return sum(p == y for p, y in zip(preds, labels, strict=True)) / len(labels)


def f1(preds: Sequence, labels: Sequence, average: str = "binary", positive=1) -> float:
    """F1 of the ``positive`` class (``average="binary"``), the mean of the per-class F1s
    (``"macro"``, over the classes in either list) or F1 of all decisions pooled (``"micro"``).
    A class never predicted and never present has no F1: it is left out of the macro mean."""
    preds, labels = _pair(preds, labels)

    def of(c) -> float | None:
        tp = sum(p == c and y == c for p, y in zip(preds, labels, strict=True))
        fp = sum(p == c and y != c for p, y in zip(preds, labels, strict=True))
        fn = sum(p != c and y == c for p, y in zip(preds, labels, strict=True))
        return None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)

    if average == "binary":
        return of(positive) or 0.0
    if average == "macro":
        scores = [s for c in sorted(set(preds) | set(labels), key=str) if (s := of(c)) is not None]
        return sum(scores) / len(scores)
    if average == "micro":  # single-label: every error is one false positive and one false negative
        return accuracy(preds, labels)
    raise ValueError(f"average {average!r} is not 'binary', 'macro' or 'micro'")


def matthews_corrcoef(preds: Sequence, labels: Sequence) -> float:
    """Matthews correlation, multi-class form (Gorodkin 2004); 0 when a side is constant."""
    preds, labels = _pair(preds, labels)
    classes = sorted(set(preds) | set(labels), key=str)
    n = len(labels)
    correct = sum(p == y for p, y in zip(preds, labels, strict=True))
    t, p = Counter(labels), Counter(preds)
    cov_yp = correct * n - sum(t[c] * p[c] for c in classes)
    cov_yy = n * n - sum(t[c] ** 2 for c in classes)
    cov_pp = n * n - sum(p[c] ** 2 for c in classes)
    if cov_yy == 0 or cov_pp == 0:
        return 0.0
    return cov_yp / math.sqrt(cov_yy * cov_pp)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = (list(map(float, v)) for v in _pair(x, y))
    if len(x) < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {len(x)}")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        raise ValueError("a correlation is undefined when one side is constant")
    return sxy / math.sqrt(sxx * syy)


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing the average of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = _pair(x, y)
    return pearson(_ranks(list(map(float, x))), _ranks(list(map(float, y))))


# ============================================================================ entities
def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '')."""
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I", "E", "S") or not kind:
        raise ValueError(f"tag {tag!r} is not O or B-, I-, E-, S- followed by a type")
    return prefix, kind


def _ends(prev: str, prev_kind: str, tag: str, kind: str) -> bool:
    """conlleval's endOfChunk: does the chunk open before this token end here?"""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev != "O" and prev_kind != kind


def _starts(prev: str, prev_kind: str, tag: str, kind: str) -> bool:
    """conlleval's startOfChunk: does a chunk begin at this token?"""
    if tag in ("B", "S"):
        return True
    if tag in ("I", "E") and prev in ("E", "S", "O"):
        return True
    return tag != "O" and prev_kind != kind


def conll_entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The typed chunks of one sentence's tags: {(type, first token, last token)}.

    The rules of conlleval, so IOB1 (I- starts a chunk, B- only between two adjacent chunks of
    one type), IOB2 (every chunk starts with B-) and IOBES all read as they are meant: an I- after
    O or after another type starts a chunk, a B- always does.
    """
    chunks: set[tuple[str, int, int]] = set()
    prev, prev_kind, start = "O", "", None
    for i, raw in enumerate([*tags, "O"]):  # a final O closes the last chunk
        tag, kind = _split_tag(raw)
        if start is not None and _ends(prev, prev_kind, tag, kind):
            chunks.add((prev_kind, start, i - 1))
            start = None
        if _starts(prev, prev_kind, tag, kind):
            start = i
        prev, prev_kind = tag, kind
    return chunks


def to_iob2(tags: Sequence[str]) -> list[str]:
    """The same chunks, every one starting with B- (IOB1 -> IOB2; IOB2 stays as it is)."""
    out = ["O"] * len(tags)
    for kind, first, last in conll_entities(tags):
        out[first] = f"B-{kind}"
        for i in range(first + 1, last + 1):
            out[i] = f"I-{kind}"
    return out


def conlleval(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Entity-level scores of predicted tag sequences against gold ones, sentence by sentence.

    Returns {"precision", "recall", "f1", "accuracy" (per token), "gold", "predicted",
    "correct" (chunk counts), "per_type": {type: {"precision", "recall", "f1", "gold",
    "predicted", "correct"}}}. With no predicted chunk precision is 0, with no gold chunk recall
    is 0, and F1 is 0 when both are 0 (as conlleval prints them).
    """
    gold, pred = _pair(gold, pred)
    counts: dict[str, Counter] = {}
    tokens = right = 0
    for n, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(p)} predicted tags for {len(g)} gold tags")
        gc, pc = conll_entities(g), conll_entities(p)
        for name, chunks in (("gold", gc), ("predicted", pc), ("correct", gc & pc)):
            for kind, _, _ in chunks:
                counts.setdefault(kind, Counter())[name] += 1
        tokens += len(g)
        right += sum(a == b for a, b in zip(g, p, strict=True))

    def scores(c: Mapping[str, int]) -> dict:
        prec = c["correct"] / c["predicted"] if c["predicted"] else 0.0
        rec = c["correct"] / c["gold"] if c["gold"] else 0.0
        f = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        return {
            "precision": prec,
            "recall": rec,
            "f1": f,
            "gold": c["gold"],
            "predicted": c["predicted"],
            "correct": c["correct"],
        }

    total = sum(counts.values(), Counter())
    return {
        **scores(total),
        "accuracy": right / tokens if tokens else 0.0,
        "per_type": {k: scores(counts[k]) for k in sorted(counts)},
    }


def format_conlleval(result: Mapping[str, Any]) -> str:
    """The table conlleval prints: overall, then one line per entity type (percentages)."""
    head = f"{'':<10}{'precision':>10}{'recall':>10}{'F1':>10}{'gold':>8}{'predicted':>10}"
    lines = [
        f"processed: {result['gold']} gold entities, {result['predicted']} predicted, "
        f"{result['correct']} correct; token accuracy {100 * result['accuracy']:.2f}%",
        head,
    ]
    rows = [("overall", result), *result["per_type"].items()]
    for name, r in rows:
        lines.append(
            f"{name:<10}{100 * r['precision']:>10.2f}{100 * r['recall']:>10.2f}"
            f"{100 * r['f1']:>10.2f}{r['gold']:>8}{r['predicted']:>10}"
        )
    return "\n".join(lines)


# ============================================================================ SQuAD
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop the articles a/an/the, collapse whitespace (the
    official SQuAD evaluation's normalisation, in its order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """F1 over the normalised tokens (a bag: repeated tokens count as often as they appear in
    both). When either side is empty (SQuAD 2.0's no-answer), 1 if both are, else 0."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _best(metric, prediction: str, answers: Sequence[str]) -> float:
    """The best score over the gold answers; no gold answer means 'no answer' (SQuAD 2.0)."""
    return max(metric(prediction, a) for a in answers) if answers else float(prediction == "")


def squad(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]]) -> dict:
    """Exact match and F1 over questions: ``predictions`` {id: text} ("" = no answer),
    ``answers`` {id: [gold texts]} ([] = unanswerable). Every question must have a prediction.
    With unanswerable questions, also the scores on each kind ("has_answer_*", "no_answer_*")."""
    missing = [q for q in answers if q not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction, e.g. {missing[0]!r}")
    if not answers:
        raise ValueError("no questions to score")
    em = {q: _best(exact_match, predictions[q], a) for q, a in answers.items()}
    f = {q: _best(token_f1, predictions[q], a) for q, a in answers.items()}
    result = {
        "exact_match": sum(em.values()) / len(em),
        "f1": sum(f.values()) / len(f),
        "total": len(answers),
    }
    has = [q for q, a in answers.items() if a]
    if len(has) < len(answers):
        no = [q for q, a in answers.items() if not a]
        for name, ids in (("has_answer", has), ("no_answer", no)):
            if ids:
                result[f"{name}_exact_match"] = sum(em[q] for q in ids) / len(ids)
                result[f"{name}_f1"] = sum(f[q] for q in ids) / len(ids)
            result[f"{name}_total"] = len(ids)
    return result


def best_no_answer_threshold(
    predictions: Mapping[str, str],
    answers: Mapping[str, Sequence[str]],
    no_answer_prob: Mapping[str, float],
    metric: str = "f1",
) -> tuple[float, float]:
    """SQuAD 2.0: the threshold t on the no-answer probability (abstain when prob > t) that
    maximises the metric, and that best score. The search of the official script: start from
    abstaining everywhere, then answer the questions in order of rising probability."""
    score = token_f1 if metric == "f1" else exact_match
    if metric not in ("f1", "exact_match"):
        raise ValueError(f"metric {metric!r} is not 'f1' or 'exact_match'")
    current = best = sum(1.0 for a in answers.values() if not a)  # abstaining everywhere
    threshold = 0.0
    for q in sorted(answers, key=lambda q: no_answer_prob[q]):
        if answers[q]:
            current += _best(score, predictions[q], answers[q])
        elif predictions[q]:
            current -= 1.0
        if current > best:
            best, threshold = current, no_answer_prob[q]
    return threshold, best / len(answers)


def apply_no_answer_threshold(
    predictions: Mapping[str, str], no_answer_prob: Mapping[str, float], threshold: float
) -> dict[str, str]:
    """Predictions with "" (no answer) wherever the no-answer probability exceeds threshold."""
    return {q: ("" if no_answer_prob[q] > threshold else p) for q, p in predictions.items()}

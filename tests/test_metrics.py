"""The task metrics (bertlab.metrics) on hand-worked cases: each expected value is worked out in
the comment beside it, not taken from another implementation."""

from __future__ import annotations

import math

import pytest

from bertlab.metrics import (
    accuracy,
    apply_no_answer_threshold,
    best_no_answer_threshold,
    conll_entities,
    conlleval,
    exact_match,
    f1,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    spearman,
    squad,
    to_iob2,
    token_f1,
)

PREDS, LABELS = [1, 0, 1, 1], [1, 1, 1, 0]  # tp 2 (0, 2), fn 1 (1), fp 1 (3), tn 0


# ============================================================================ classification
def test_accuracy_and_binary_f1():
    assert accuracy(PREDS, LABELS) == 0.5  # positions 0 and 2
    assert f1(PREDS, LABELS) == pytest.approx(2 / 3)  # 2tp / (2tp + fp + fn) = 4 / 6
    assert f1(PREDS, LABELS, positive=0) == 0.0  # class 0: tp 0
    # macro: class 1 F1 2/3, class 0 F1 0 -> 1/3; micro (single label) = accuracy
    assert f1(PREDS, LABELS, average="macro") == pytest.approx(1 / 3)
    assert f1(PREDS, LABELS, average="micro") == 0.5


def test_matthews_binary_matches_the_textbook_formula():
    # (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (0 - 1) / sqrt(3*3*1*1) = -1/3
    assert matthews_corrcoef(PREDS, LABELS) == pytest.approx(-1 / 3)
    assert matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0  # a constant prediction


def test_matthews_multiclass():
    # correct 3 of 6; true counts 2/2/2, predicted 3/1/2:
    # (3*6 - (2*3 + 2*1 + 2*2)) / sqrt((36 - 12) * (36 - 14)) = 6 / sqrt(528)
    got = matthews_corrcoef([0, 2, 1, 0, 0, 2], [0, 1, 2, 0, 1, 2])
    assert got == pytest.approx(6 / math.sqrt(528))


def test_pearson_and_spearman():
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    # deviations (-1.5, -.5, .5, 1.5) and (-1.5, .5, -.5, 1.5): 4 / sqrt(5 * 5)
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([10, 20, 30], [3, 2, 1]) == pytest.approx(-1.0)
    # ties share ranks: (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1, 5, 100], [1, 2, 3]) == pytest.approx(1.0)  # ranks, not values


def test_classification_bad_input():
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="no examples"):
        f1([], [])
    with pytest.raises(ValueError, match="one side is constant"):
        pearson([1, 1, 1], [1, 2, 3])
    with pytest.raises(ValueError, match="average 'weighted'"):
        f1(PREDS, LABELS, average="weighted")


# ============================================================================ entities
def test_chunks_by_the_conlleval_rules():
    assert conll_entities(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 1), ("LOC", 3, 3)}
    # IOB1: I- opens a chunk; B- only separates two adjacent chunks of one type
    assert conll_entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == {
        ("PER", 0, 1),
        ("PER", 2, 2),
        ("LOC", 4, 4),
    }
    assert conll_entities(["B-PER", "I-LOC"]) == {("PER", 0, 0), ("LOC", 1, 1)}  # type change
    assert conll_entities(["S-PER", "B-LOC", "E-LOC", "O"]) == {("PER", 0, 0), ("LOC", 1, 2)}
    assert conll_entities(["O", "O"]) == set()


def test_iob1_converts_to_iob2_with_the_same_chunks():
    iob1 = ["I-ORG", "I-ORG", "O", "I-PER", "B-PER", "I-PER", "I-LOC"]
    iob2 = to_iob2(iob1)
    assert iob2 == ["B-ORG", "I-ORG", "O", "B-PER", "B-PER", "I-PER", "B-LOC"]
    assert conll_entities(iob2) == conll_entities(iob1)
    assert to_iob2(iob2) == iob2


def test_conlleval_scores():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    r = conlleval(gold, pred)
    # gold PER, LOC, ORG(0-1); predicted PER, ORG(3), ORG(0-0): only PER is right
    assert (r["gold"], r["predicted"], r["correct"]) == (3, 3, 1)
    assert r["precision"] == pytest.approx(1 / 3) and r["recall"] == pytest.approx(1 / 3)
    assert r["f1"] == pytest.approx(1 / 3)
    assert r["accuracy"] == pytest.approx(4 / 6)  # tokens 0, 1, 2 and 4
    assert r["per_type"]["PER"]["f1"] == 1.0
    assert r["per_type"]["LOC"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "gold": 1,
        "predicted": 0,
        "correct": 0,
    }
    assert r["per_type"]["ORG"]["precision"] == 0.0 and r["per_type"]["ORG"]["gold"] == 1


def test_conlleval_bad_input():
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 gold tags"):
        conlleval([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="tag 'PER' is not O or B-"):
        conll_entities(["PER"])


# ============================================================================ SQuAD
def test_answer_normalisation():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # whole words only
    assert exact_match("the Eiffel Tower", "Eiffel Tower.") == 1.0


def test_token_f1():
    # (quick, brown, dog) against (quick, brown, fox): 2 shared, p = r = 2/3
    assert token_f1("quick brown dog", "the quick brown fox") == pytest.approx(2 / 3)
    # a bag of tokens: (x, x, y) and (x, y, y) share one x and one y
    assert token_f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0
    assert token_f1("red", "blue") == 0.0


def test_squad_best_of_the_gold_answers():
    preds = {"q1": "Denver Broncos", "q2": "Carolina"}
    gold = {"q1": ["Denver Broncos", "The Broncos"], "q2": ["Carolina Panthers"]}
    r = squad(preds, gold)
    assert r["exact_match"] == 0.5
    # q1 F1 1; q2: (carolina) against (carolina, panthers): p 1, r 1/2, F1 2/3
    assert r["f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert r["total"] == 2 and "no_answer_total" not in r


def test_squad_v2_no_answer_and_threshold():
    gold = {"a": ["paris"], "b": [], "c": ["rome"], "d": []}
    preds = {"a": "paris", "b": "london", "c": "milan", "d": ""}
    r = squad(preds, gold)
    assert r["exact_match"] == 0.5  # a and d
    assert r["has_answer_exact_match"] == 0.5 and r["no_answer_exact_match"] == 0.5
    prob = {"a": 0.1, "b": 0.6, "c": 0.3, "d": 0.2}
    # abstain everywhere: 2 (b, d). Answer in rising order: a +1 -> 3 (best, t = 0.1);
    # d (prediction empty) 0 -> 3; c +0 -> 3; b (answered wrongly) -1 -> 2.
    threshold, best = best_no_answer_threshold(preds, gold, prob, "exact_match")
    assert (threshold, best) == (0.1, 0.75)
    applied = apply_no_answer_threshold(preds, prob, threshold)
    assert applied == {"a": "paris", "b": "", "c": "", "d": ""}
    assert squad(applied, gold)["exact_match"] == best


def test_squad_bad_input():
    with pytest.raises(ValueError, match="1 questions have no prediction, e.g. 'q2'"):
        squad({"q1": "x"}, {"q1": ["x"], "q2": ["y"]})
    with pytest.raises(ValueError, match="metric 'bleu'"):
        best_no_answer_threshold({}, {}, {}, "bleu")

"""Every pipeline of both name sets and the explorer, on generated texts (unpaired surrogates
among NUL, control characters, combining marks, right-to-left text and emoji): a text with an
invalid code point is a ValueError naming its argument and position, before any work; every
other text is answered, and the answer holds together with the text (spans cut from it)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import texts as odd_texts
from tiny_models import tiny

import bertlab
from bertlab.explore.payload import build_payload
from bertlab.pipelines import pipeline
from bertlab.pipelines.text import invalid_code_point

hypothesis = pytest.importorskip("hypothesis", reason="a test extra: the text fuzzer")
st = hypothesis.strategies
NLI = {0: "contradiction", 1: "entailment", 2: "neutral"}
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@pytest.fixture(scope="module")
def pipes(module_tmp):
    root = module_tmp.mktemp("pipeline-texts")
    base = tiny(bertlab.BertModel, root / "base", 1)
    mlm = tiny(bertlab.BertForMaskedLM, root / "mlm", 2)
    clf = tiny(bertlab.BertForSequenceClassification, root / "clf", 3, id2label=NLI)
    ner = tiny(bertlab.BertForTokenClassification, root / "ner", 4, id2label=TAGS)
    qa = tiny(bertlab.BertForQuestionAnswering, root / "qa", 5)
    made = {
        "embed": pipeline("embed", str(base)),
        "classify": pipeline("classify", str(clf)),
        "tag": pipeline("tag", str(ner)),
        "answer": pipeline("answer", str(qa)),
        "fill-mask": pipeline("fill-mask", str(mlm)),
        "feature-extraction": pipeline("feature-extraction", str(base)),
        "text-classification": pipeline("text-classification", str(clf)),
        "token-classification": pipeline("token-classification", str(ner)),
        "question-answering": pipeline("question-answering", str(qa)),
        "zero-shot-classification": pipeline("zero-shot-classification", str(clf)),
    }
    explorer = bertlab.BertForQuestionAnswering.from_pretrained(qa).eval()
    made["explore"] = (explorer, made["question-answering"].tokenizer)
    return made


def _call(name: str, pipe, t: list[str]):
    """One call of pipeline ``name`` around the texts ``t``: (a thunk, the texts by the name
    of the argument that carries them, a check of the answer)."""
    if name == "embed":
        return (lambda: pipe(t[:2])), {"texts[0]": t[0], "texts[1]": t[1]}, _shape((2, 64))
    if name == "classify":
        fields = {"texts": t[0], "pairs": t[1]}
        return (lambda: pipe(t[0], t[1], top_k=None)), fields, _labels(3)
    if name in ("tag", "token-classification"):
        key = "texts" if name == "tag" else "inputs"

        def spans(out):
            for text, entities in zip(t[:2], out, strict=True):
                for e in entities:
                    assert 0 <= e["start"] <= e["end"] <= len(text)
                    assert e.get("text", text[e["start"] : e["end"]]) == text[e["start"] : e["end"]]

        return (lambda: pipe(t[:2])), {f"{key}[0]": t[0], f"{key}[1]": t[1]}, spans
    if name in ("answer", "question-answering"):
        q, c = "who " + t[0], "Ann " + t[1]
        kw = {"max_length": 64, "doc_stride": 16, "max_query_length": 16}
        if name == "question-answering":
            kw = {"max_seq_len": 64, "doc_stride": 16}

        def cut(out):
            assert out["answer"] == c[out["start"] : out["end"]]

        return (lambda: pipe(q, c, **kw)), {"question": q, "context": c}, cut
    if name == "fill-mask":
        x = t[0] + " [MASK] " + t[1]
        return (lambda: pipe(x, top_k=3)), {"inputs": x}, _shape(3)
    if name == "feature-extraction":
        return (lambda: pipe(t[0])), {"inputs": t[0]}, _width(64)
    if name == "text-classification":
        pair = {"text": t[0], "text_pair": t[1]}
        fields = {"inputs.text": t[0], "inputs.text_pair": t[1]}
        return (lambda: pipe(pair, top_k=None)), fields, _labels(3)
    if name == "zero-shot-classification":
        fields = {"sequences": t[0], "candidate_labels[0]": "x " + t[1], "candidate_labels[1]": "y"}
        labels = [fields["candidate_labels[0]"], "y"]
        return (lambda: pipe(t[0], labels)), fields, _scores(2)
    if name == "explore":
        text, pair = "who " + t[0], "Ann " + t[1]
        return (lambda: build_payload(*pipe, text, pair)), {"text": text, "pair": pair}, _best(pair)
    raise AssertionError(name)


def _shape(shape):
    def check(out):
        assert (tuple(out.shape) if isinstance(out, torch.Tensor) else len(out)) == shape

    return check


def _width(h):
    def check(out):
        assert len(out) == 1 and all(len(v) == h for v in out[0])

    return check


def _scores(n):
    def check(out):
        assert len(out["scores"]) == n and abs(sum(out["scores"]) - 1) < 1e-4

    return check


def _best(pair):
    def check(out):
        best = out["output"]["best"]
        assert best is None or best["text"] in pair

    return check


def _labels(n):
    def check(out):
        assert len(out) == n and abs(sum(x["score"] for x in out) - 1) < 1e-4

    return check


def test_every_pipeline_refuses_an_invalid_text_by_argument_and_position_or_answers(pipes):
    seen = {"refused": 0, "answered": 0}

    @hypothesis.settings(max_examples=150, deadline=None, database=None)
    @hypothesis.given(
        st.sampled_from(sorted(pipes)), st.lists(odd_texts(st, 4), min_size=2, max_size=2)
    )
    def call(name, t):
        run, fields, check = _call(name, pipes[name], t)
        bad = {f: why for f, x in fields.items() if (why := invalid_code_point(x)) is not None}
        if bad:
            with pytest.raises(ValueError) as caught:
                run()
            message = str(caught.value)
            field = message.split(" holds ", 1)[0]
            assert field in bad and message.startswith(f"{field} holds {bad[field]}: "), message
            seen["refused"] += 1
            return
        out = run()
        if check is not None:
            check(out)
        seen["answered"] += 1

    call()
    assert seen["refused"] > 10 and seen["answered"] > 10, seen

"""`bertlab predict`'s output: every pipeline turns its own results into a line of text and a
line of JSON, and reads its own input lines (no model is loaded for these)."""

from __future__ import annotations

import io
import json

import pytest

from bertlab.cli.main import main
from bertlab.pipelines import (
    PIPELINES,
    AnswerPipeline,
    ClassifyPipeline,
    EmbedPipeline,
    FillMaskPipeline,
    TagPipeline,
)


def test_every_pipeline_formats_its_results_as_text():
    assert EmbedPipeline.text("hi", [0.5, -0.25] + [0.0] * 382) == (
        "hi\t[+0.5000, -0.2500, +0.0000, +0.0000, +0.0000, +0.0000, ...] (384 dims)"
    )
    ranked = [{"label": "pos", "score": 0.875}, {"label": "neg", "score": 0.125}]
    assert ClassifyPipeline.text("a film", ranked) == "a film\tpos 0.875, neg 0.125"
    assert ClassifyPipeline.text("a film", {"value": 3.25}) == "a film\t3.2500"  # regression
    ann = {"entity": "PER", "text": "Ann", "start": 0, "end": 3, "score": 0.9}
    assert TagPipeline.text("Ann runs", [ann]) == "Ann runs\tPER 'Ann' [0:3] 0.900"
    assert TagPipeline.text("it runs", []) == "it runs\t(no entities)"
    best = {"answer": "Bob", "start": 8, "end": 11, "score": 0.5}
    item = {"question": "Who?", "context": "Ann met Bob."}
    assert AnswerPipeline.text(item, best) == "Who?\t'Bob' [8:11] 0.500"
    assert (
        AnswerPipeline.text(item, [best, {**best, "answer": "Ann"}]) == "Who?\t'Bob' [8:11] 0.500"
    )
    one = [{"token": "capital", "score": 0.5}, {"token": "city", "score": 0.25}]
    assert FillMaskPipeline.text("[MASK] x", one) == "[MASK] x\tcapital 0.500, city 0.250"
    two = FillMaskPipeline.text("[MASK] [MASK]", [one[:1], one[1:]])
    assert two == "[MASK] [MASK]\tcapital 0.500 | city 0.250"


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_pipeline_writes_one_json_object_per_result(name):
    cls = PIPELINES[name]
    result = [{"label": "é", "score": 0.5}]
    line = cls.json_line("naïve", result)
    assert "\n" not in line and "naïve" in line  # one line, text kept as written
    assert json.loads(line) == {"input": "naïve", "output": result}


def test_inputs_are_read_by_their_pipeline():
    assert EmbedPipeline.parse("a line", 1, context="ignored") == "a line"
    asked = {"question": "Who?", "context": "Ann met Bob."}
    assert AnswerPipeline.parse(json.dumps(asked), 1) == asked
    assert AnswerPipeline.parse("Who?", 1, context="Ann met Bob.") == asked
    with pytest.raises(ValueError, match="answer input line 3: a JSON object with question"):
        AnswerPipeline.parse("Who?", 3)


def test_predict_prints_the_pipelines_own_text(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("first line\nsecond\n"))
    assert main(["predict", "embed", "--no-normalize"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x.split("\t")[0] for x in lines] == ["first line", "second"]
    assert all(x.endswith("(384 dims)") for x in lines)

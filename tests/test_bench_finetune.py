"""`bertlab bench finetune`: the two sides really run the same experiment (same starting
weights, batches and optimiser give the same losses when dropout is off), the time budget cuts
both, the per-type table comes with tagging, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertlab.cli.main import main
from bertlab.train.finetune import FinetuneConfig

pytest.importorskip("transformers", reason="transformers is a test extra: the other side")
from bertlab.bench.finetune import bench_finetune  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def _config(sst2, **kw) -> FinetuneConfig:
    base = dict(
        task="classify",
        train=str(sst2 / "train.tsv"),
        dev=str(sst2 / "dev.tsv"),
        epochs=1,
        batch_size=16,
        max_length=48,
        lr=1e-4,
        max_train_examples=64,
    )
    return FinetuneConfig(**{**base, **kw})


def test_without_dropout_both_sides_follow_the_same_losses(sst2):
    r = bench_finetune(_config(sst2, dropout=0.0), seconds=1e6, progress=False)
    b, t = r["bertlab"], r["transformers"]
    assert b["steps"] == t["steps"] == b["planned_steps"] == 4  # 64 examples, batch 16
    # Identical weights, batches, optimiser and schedule: the losses agree step by step, and
    # after the first step they could not if any of those differed.
    assert len(b["losses"]) == len(t["losses"]) == 4
    for ours, theirs in zip(b["losses"], t["losses"], strict=True):
        assert ours == pytest.approx(theirs, abs=2e-4)
    assert abs(b["losses"][-1] - b["losses"][0]) > 1e-3  # it did train
    # The same metric code on both sides' logits: at most one of 40 borderline examples apart.
    assert abs(b["dev"]["accuracy"] - t["dev"]["accuracy"]) <= 1 / 40 + 1e-9
    assert r["main_metric"] == "accuracy" and r["speedup"] > 0
    assert [e["step"] for e in b["evaluations"]] == [e["step"] for e in t["evaluations"]] == [4]


def test_a_budget_that_holds_no_bertlab_step_is_refused_by_name(sst2):
    """bertlab's budget counts reading and the final evaluation: a budget they spend holds no
    step, and the bench says so rather than compare nothing."""
    with pytest.raises(ValueError, match="a budget of 1e-06 s holds no training step"):
        bench_finetune(_config(sst2, epochs=3), seconds=1e-6, progress=False)


def test_tagging_reports_the_per_type_table_for_both_sides(tmp_path, capsys):
    conll = str(FIXTURES / "conll_style_bertlab.txt")
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "finetune",
            "tag",
            "--train",
            conll,
            "--dev",
            conll,
            "--seconds",
            "60",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--lr",
            "1e-4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.count("entities on the dev set") == 2 and "best f1" in printed
    report = json.loads(out.read_text())
    assert report["machine"] and report["finetune"]["main_metric"] == "f1"
    for side in ("bertlab", "transformers"):
        assert {"PER", "LOC", "ORG"} <= set(report["finetune"][side]["dev_full"]["per_type"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["finetune"], "one task, one of classify, tag, qa; got none"),
        (["finetune", "summarise"], "got summarise"),
        (["finetune", "classify"], "needs --train"),
        (["finetune", "classify", "--train", "{train}"], "needs a dev set"),
        (
            ["finetune", "classify", "--train", "{train}", "--dev", "{dev}", "--seconds", "0"],
            "budget must be > 0 seconds, got 0",
        ),
        (
            ["finetune", "classify", "--train", "{train}", "--dev", "{dev}", "--models", "a,b"],
            "one model; got --models a,b",
        ),
    ],
)
def test_refusals_name_the_value(sst2, capsys, args, message):
    args = [a.format(train=sst2 / "train.tsv", dev=sst2 / "dev.tsv") for a in args]
    assert main(["bench", *args]) == 2
    assert message in capsys.readouterr().err

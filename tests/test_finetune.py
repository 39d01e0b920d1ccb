"""`bertlab finetune`: each task end to end on the bundled checkpoint and small real samples,
the saved model against transformers, the time budget, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.cli.main import main
from bertlab.train.finetune import FinetuneConfig, finetune

FIXTURES = Path(__file__).parent / "fixtures"


def test_classify_end_to_end(sst2, tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    out = tmp_path / "run"
    code = main(
        [
            "finetune",
            "classify",
            "--train",
            str(sst2 / "train.tsv"),
            "--dev",
            str(sst2 / "dev.tsv"),
            "-o",
            str(out),
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--max-length",
            "48",
            "--lr",
            "1e-4",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "160 examples; text 'sentence', label 'label'; 2 labels: 0, 1" in printed
    assert "dev (best, step" in printed
    r = json.loads((out / "results.json").read_text())
    assert r["steps"] == 20 and r["best_step"] in (10, 20)
    assert set(r["dev"]) == {"accuracy", "mcc", "f1"} and 0 <= r["dev"]["accuracy"] <= 1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "eval_accuracy" in x] == [10, 20]  # each epoch
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["label2id"] == {"0": 0, "1": 1}
    assert not (out / "best").exists() and not (out / "checkpoint.pt").exists()
    ours = bertlab.BertForSequenceClassification.from_pretrained(out / "model").eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(out / "model").eval()
    tok = bertlab.BertTokenizer.from_pretrained(out / "model")
    batch = tok(["a gorgeous , witty film", "dull and lifeless"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert (ours(**batch).logits - theirs(**batch).logits).abs().max() < 1e-5
    # the saved model is the best one: its dev accuracy is the one reported
    from bertlab.data.classification import encode_classification, read_classification
    from bertlab.tasks.classify import ClassificationTask
    from bertlab.tasks.finetuning import Split

    train = read_classification(sst2 / "train.tsv")
    dev = read_classification(sst2 / "dev.tsv", like=train)
    dev_f, _ = encode_classification(tok, dev, 48)
    again = ClassificationTask(["0", "1"]).evaluate(ours, Split(dev, dev_f))
    assert again["accuracy"] == pytest.approx(r["dev"]["accuracy"])


def test_tag_end_to_end_with_the_per_type_table(tmp_path, capsys):
    conll = FIXTURES / "conll_style_bertlab.txt"
    out = tmp_path / "ner"
    assert (
        main(
            [
                "finetune",
                "tag",
                "--train",
                str(conll),
                "--dev",
                str(conll),
                "-o",
                str(out),
                "--epochs",
                "3",
                "--batch-size",
                "4",
                "--lr",
                "1e-4",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "overall" in printed and "PER" in printed and "precision" in printed
    r = json.loads((out / "results.json").read_text())
    assert set(r["dev"]) == {"f1", "precision", "recall", "accuracy"}
    assert {"LOC", "PER", "ORG"} <= set(r["dev_full"]["per_type"])
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"]["0"] == "O" and "B-PER" in config["id2label"].values()


def test_qa_end_to_end_holding_out_articles(tmp_path):
    squad = FIXTURES / "squad_sample.json"
    config = FinetuneConfig(
        task="qa",
        train=str(squad),
        dev_articles=3,
        epochs=1,
        batch_size=8,
        max_length=128,
        doc_stride=48,
        max_query_length=32,
    )
    r = finetune(config, tmp_path / "qa", progress=False)
    assert len(r["report"]["dev_articles"]) == 3
    assert set(r["dev"]) == {"exact_match", "f1"} and 0 <= r["dev"]["f1"] <= 1
    assert r["dev"]["f1"] >= r["dev"]["exact_match"]


def test_time_budget_stops_evaluates_and_saves(sst2, tmp_path):
    config = FinetuneConfig(
        task="classify",
        train=str(sst2 / "train.tsv"),
        dev=str(sst2 / "dev.tsv"),
        epochs=3,
        batch_size=16,
        max_length=32,
        max_seconds=1e-6,
    )
    r = finetune(config, tmp_path / "short", progress=False)
    assert r["steps"] == 1 and r["planned_steps"] == 30 and r["best_step"] == 1
    assert (tmp_path / "short" / "model" / "model.safetensors").exists()


def test_refusals_before_any_training(sst2, tmp_path):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\nfine\t1\nodd\tneutral\n", "utf-8")
    config = FinetuneConfig(task="classify", train=str(sst2 / "train.tsv"), dev=str(dev))
    with pytest.raises(ValueError, match="line 3: label 'neutral' never appears"):
        finetune(config, tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="task 'summarise' is not one of"):
        FinetuneConfig(task="summarise", train="x")
    with pytest.raises(ValueError, match="dev_articles holds out SQuAD articles"):
        FinetuneConfig(task="tag", train="x", dev_articles=2)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    ok = FinetuneConfig(task="classify", train=str(sst2 / "train.tsv"))
    with pytest.raises(FileExistsError, match="already holds a run.*--overwrite"):
        finetune(ok, out, progress=False)
    with pytest.raises(ValueError, match="leaves no article to train on"):
        finetune(
            FinetuneConfig(task="qa", train=str(FIXTURES / "squad_sample.json"), dev_articles=11),
            tmp_path / "q",
            progress=False,
        )

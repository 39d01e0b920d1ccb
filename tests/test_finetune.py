"""`bertlab finetune`: each task end to end on the bundled checkpoint and small real samples,
the saved model against transformers, the time budget, and the refusals; the task objects'
one protocol, a stopped run resumed exactly, and what Ctrl-C prints."""

from __future__ import annotations

import json
import math
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


def test_a_budget_spent_before_the_first_step_starts_none_and_says_why(sst2, tmp_path, caplog):
    """The budget counts reading the data: one it spent leaves no step to start (none is
    started that would pass it); the starting model is saved, and the log says why."""
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
    assert r["steps"] == 0 and r["planned_steps"] == 30 and r["best_step"] is None
    assert (tmp_path / "short" / "model" / "model.safetensors").exists()
    said = caplog.text
    assert "stopping at step 0 of 30" in said and "spent before the first step" in said


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
    preset = FinetuneConfig(task="classify", train=str(sst2 / "train.tsv"), model="base")
    with pytest.raises(ValueError, match="starts from a model folder .*'base' is a preset"):
        finetune(preset, tmp_path / "p", progress=False)
    assert not (tmp_path / "p").exists()


# ============================================================================ task objects
@pytest.fixture(scope="module")
def tiny(module_tmp) -> Path:
    """A 2-layer, 32-wide BERT on the bundled vocabulary: fine-tuning runs in seconds."""
    folder = module_tmp.mktemp("tiny")
    torch.manual_seed(0)
    config = bertlab.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    bertlab.BertModel(config).save_pretrained(folder)
    bertlab.BertTokenizer.from_pretrained("default").save_pretrained(folder)
    return folder


def _task_configs(sst2, tiny) -> dict[str, FinetuneConfig]:
    common = dict(model=str(tiny), epochs=1, batch_size=8)
    return {
        "classify": FinetuneConfig(
            task="classify", train=str(sst2 / "train.tsv"), dev=str(sst2 / "dev.tsv"), **common
        ),
        "tag": FinetuneConfig(
            task="tag",
            train=str(FIXTURES / "conll_style_bertlab.txt"),
            dev=str(FIXTURES / "conll_style_bertlab.txt"),
            **common,
        ),
        "qa": FinetuneConfig(
            task="qa",
            train=str(FIXTURES / "squad_sample.json"),
            dev_articles=3,
            max_length=128,
            doc_stride=48,
            max_query_length=32,
            **common,
        ),
    }


def test_every_task_object_keeps_the_one_protocol(sst2, tiny):
    import inspect

    from bertlab.tasks.finetuning import FinetuneTask, Split
    from bertlab.train.finetune import TASKS, prepare

    assert set(TASKS) == {"classify", "tag", "qa"}
    for name, config in _task_configs(sst2, tiny).items():
        run = prepare(config)
        task = run.task
        assert isinstance(task, FinetuneTask) and task.name == name == config.task
        assert isinstance(run.train, Split) and isinstance(run.dev, Split)
        # One evaluate signature for every task: (model, data) -> metrics.
        assert list(inspect.signature(task.evaluate).parameters) == ["model", "data"]
        loss, metrics = task(run.model, run.batches(config.batch_size, config.seed)(0))
        assert loss.ndim == 0 and loss.requires_grad and set(metrics) == {"loss"}
        figures = task.evaluate(run.model, run.dev)
        assert task.main_metric in figures
        same, details = task.evaluate_with_details(run.model, run.dev)
        assert same == figures  # one evaluation gives both
        assert (details is not None) == (name == "tag")  # entities have the per-type table
        assert details is None or {"LOC", "PER", "ORG"} <= set(details["per_type"])
        assert all(isinstance(v, float) for v in figures.values())
        assert isinstance(run.model, task.model_class)
        assert task.hf_class == type(run.model).__name__  # the same name in transformers
        assert task.default_length == (384 if name == "qa" else 128)
        assert config.length == (config.max_length or task.default_length)


def test_the_fine_tuning_runner_never_asks_which_task_it_runs():
    import bertlab.bench.finetune as bench
    import bertlab.cli.tasks as cli
    import bertlab.train.finetune as runner

    for module in (runner, bench):
        source = Path(module.__file__).read_text("utf-8")
        assert "config.task ==" not in source and "task in (" not in source, module.__name__
    import inspect

    predict = inspect.getsource(cli.cmd_predict) + inspect.getsource(cli._inputs)
    assert "args.task ==" not in predict and "args.task !=" not in predict


# ============================================================================ the run
def _interrupt_at(monkeypatch, step: int) -> None:
    """SIGINT while the batch of ``step`` (0-based) is drawn: the loop finishes that step,
    saves a checkpoint and stops, as after a Ctrl-C."""
    import os
    import signal

    from bertlab.train.finetune import Prepared

    batches = Prepared.batches

    def interrupting(self, batch_size, seed):
        data = batches(self, batch_size, seed)

        def stop_once(s, micro=0):
            if s == step:
                os.kill(os.getpid(), signal.SIGINT)
            return data(s, micro)

        return stop_once

    monkeypatch.setattr(Prepared, "batches", interrupting)


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_stopped_run_resumed_with_the_printed_command_equals_an_unbroken_one(
    sst2, tiny, tmp_path, monkeypatch, capsys
):
    import shlex

    args = ["finetune", "classify", "--train", str(sst2 / "train.tsv"), "--dev"]
    args += [str(sst2 / "dev.tsv"), "--model", str(tiny), "--epochs", "2", "--batch-size", "16"]
    args += ["--lr", "1e-3"]  # dropout stays on: the random states must resume too
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert main([*args, "-o", str(whole)]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        _interrupt_at(m, 12)  # in the second epoch, after the first dev evaluation
        assert main([*args, "-o", str(broken)]) == 130  # a Ctrl-C exits non-zero
    err = capsys.readouterr().err
    assert "stopped at step 13" in err and "continue with:" in err
    command = err.strip().splitlines()[-1].strip()
    assert command.startswith("bertlab finetune classify ") and command.endswith("--resume")
    assert (broken / "checkpoint.pt").exists() and not (broken / "model").exists()
    assert main(shlex.split(command)[1:]) == 0
    a, b = _rows(whole), _rows(broken)
    assert [r["step"] for r in b] == list(range(1, 21))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # same batches, same dropout draws
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    wa = bertlab.BertForSequenceClassification.from_pretrained(whole / "model").state_dict()
    wb = bertlab.BertForSequenceClassification.from_pretrained(broken / "model").state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = (json.loads((run / "results.json").read_text()) for run in (whole, broken))
    assert ra["dev"] == rb["dev"] and ra["best_step"] == rb["best_step"]
    # Training time (what max_seconds counts) apart from evaluation. A resumed run's training
    # clock carries over from before the stop; its wall and evaluation times are this call's.
    assert 0 < ra["seconds"] and ra["seconds"] + ra["eval_seconds"] <= ra["wall_seconds"]
    stopped_at = _rows(broken)[12]  # step 13, where the run was stopped
    assert stopped_at["step"] == 13 and rb["seconds"] > stopped_at["train_seconds"] > 0
    assert not (broken / "checkpoint.pt").exists()  # a finished run keeps no checkpoint


def test_resume_refuses_changed_settings_and_a_run_without_a_checkpoint(sst2, tiny, tmp_path):
    config = _task_configs(sst2, tiny)["classify"]
    with pytest.raises(FileNotFoundError, match="holds no checkpoint to resume from"):
        finetune(config, tmp_path / "none", progress=False, resume=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"")
    (run / "run.json").write_text(json.dumps({**json.loads(json.dumps(vars(config))), "lr": 1}))
    with pytest.raises(ValueError, match="settings differ from the run in .*: lr 1 -> 5e-05"):
        finetune(config, run, progress=False, resume=True)
    with pytest.raises(FileExistsError, match="already holds a run .*--resume.*--overwrite"):
        finetune(config, run, progress=False)
    with pytest.raises(ValueError, match="--resume .* or --overwrite .*, not both"):
        finetune(config, run, progress=False, resume=True, overwrite=True)
    with pytest.raises(ValueError, match="max_seconds must be > 0, got 0"):
        FinetuneConfig(task="classify", train="x", max_seconds=0)


def test_ctrl_c_prints_the_resume_command_and_exits_non_zero(sst2, tiny, tmp_path, capsys):
    from bertlab.train import finetune as runner
    from bertlab.train.loop import TrainingInterrupted

    def interrupted(*_args, **_kw):
        # Built without its constructor: only its documented attributes are relied on.
        stop = TrainingInterrupted.__new__(TrainingInterrupted)
        stop.step, stop.checkpoint = 7, tmp_path / "run" / "checkpoint.pt"
        raise stop

    out = tmp_path / "run dir"  # a space: the command must quote it
    args = ["finetune", "tag", "--train", str(FIXTURES / "conll_style_bertlab.txt")]
    args += ["--model", str(tiny), "--lr", "1e-4", "-o", str(out)]
    import unittest.mock

    with unittest.mock.patch.object(runner, "train", interrupted):
        assert main(args) == 130
    err = capsys.readouterr().err
    assert "stopped at step 7" in err
    assert err.strip().splitlines()[-1].strip() == (
        f"bertlab finetune tag --train {FIXTURES / 'conll_style_bertlab.txt'} --model {tiny} "
        f"--lr 0.0001 -o '{out}' --resume"
    )
    assert issubclass(TrainingInterrupted, KeyboardInterrupt)


def test_max_seconds_help_says_what_is_counted(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "a budget for the whole run: reading the data, training, dev evaluations" in shown


def test_a_time_budget_plans_the_schedule_and_trains_a_model(tmp_path):
    """The bundled SST-2 sample within 30 s, reading and evaluating included: the learning
    rate warms up, reaches its peak and decays to about zero by the last step, whatever the
    machine's speed, and the model is clearly better than chance."""
    samples = Path(bertlab.__file__).parent / "data" / "samples"
    dev = tmp_path / "dev.tsv"  # 400 of the 1,000 held-out sentences: a quicker evaluation
    lines = (samples / "sst2_dev.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    dev.write_text("".join(lines[:401]), "utf-8")
    config = FinetuneConfig(
        task="classify",
        train=str(samples / "sst2_train.tsv"),
        dev=str(dev),
        epochs=10,  # more than 30 s of training on any machine: the budget sets the plan
        batch_size=32,
        max_length=64,
        lr=1e-4,
        max_seconds=30,
    )
    r = finetune(config, tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    first = rows[0]["train_seconds"] if rows else math.inf
    if first > config.max_seconds / 6:  # the budget counts reading and evaluating too
        pytest.skip(
            f"one step took {first:.0f} s on this machine (busy or slow): a budget of "
            f"{config.max_seconds:g} s holds too few steps for a schedule to check"
        )
    lrs = [row["lr"] for row in rows]
    epochs = config.epochs * math.ceil(5000 / config.batch_size)  # 5,000 training sentences
    assert r["steps"] <= r["planned_steps"] < epochs  # the budget, not the epochs, set the plan
    assert max(lrs) == pytest.approx(config.lr, rel=0.1)  # warm-up ended: the peak was reached
    assert lrs.index(max(lrs)) < len(lrs) // 2  # a share of the planned steps, not of 10 epochs
    # the peak holds for two steps where the plan's warm-up ends one step after the plan is made
    # (linear_schedule: the warm-up's last step, then the decay's first), else for one
    first, last = lrs.index(max(lrs)), len(lrs) - 1 - lrs[::-1].index(max(lrs))
    assert last - first <= 1
    after = lrs[last:]
    assert all(a > b for a, b in zip(after, after[1:], strict=False))  # then decays, every step
    # decayed to about zero at the end of the plan; on a machine busy with other work the steps
    # can slow after the plan was made, and the budget then stops the run before that end
    # (no step starts that would overrun it)
    if r["steps"] == r["planned_steps"]:
        assert lrs[-1] <= 0.05 * max(lrs)
    assert r["seconds"] <= r["wall_seconds"] and r["eval_seconds"] > 0
    if r["steps"] < 40:  # the schedule is checked above; the accuracy needs more steps
        pytest.skip(
            f"only {r['steps']} steps fit in {config.max_seconds:g} s on this machine (busy or "
            "slow): the schedule was checked, too few steps to require an accuracy of 0.7"
        )
    assert r["dev"]["accuracy"] > 0.7  # chance is 0.5

"""Pre-training (bertlab.train.pretrain, `bertlab pretrain`, `bertlab plot`): the data stream and
its independence of the number of processes, the objective, the phase schedule, exact resume, the
saved model against transformers, and every refusal. Runs on several processes (torchrun) are in
test_pretrain_elastic.py."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.cli.main import main
from bertlab.data.corpus import prepare
from bertlab.data.masking import IGNORE_INDEX, MaskingConfig
from bertlab.data.stream import CorpusStream, Phases, evaluation_batches
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import BertForPreTraining
from bertlab.tasks.pretraining import PretrainingObjective
from bertlab.train.loop import TrainConfig, TrainingInterrupted
from bertlab.train.pretrain import PretrainConfig, pretrain

VOCAB = bertlab.bundled_model_dir()
WIKITEXT = Path(__file__).parent / "fixtures" / "wikitext2_sample.tokens"
MASK_ID = 103
TINY = dict(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def corpora(module_tmp):
    root = module_tmp.mktemp("corpora")
    short = prepare(
        WIKITEXT, VOCAB, root / "short", max_seq_length=64, shard_size=20, progress=False
    )
    long = prepare(
        WIKITEXT, VOCAB, root / "long", max_seq_length=128, shard_size=30, progress=False, seed=7
    )
    held = prepare(WIKITEXT, VOCAB, root / "held", max_seq_length=64, progress=False, seed=99)
    config = root / "tiny.json"
    BertConfig(**TINY).save_pretrained(root)
    (root / "config.json").rename(config)
    return {"short": short, "long": long, "held": held, "config": config, "root": root}


def _stream(directory, batch, rank=0, world=1, **kw):
    return CorpusStream(
        directory,
        batch,
        MaskingConfig(max_predictions=10),
        mask_token_id=MASK_ID,
        vocab_size=30522,
        rank=rank,
        world_size=world,
        **kw,
    )


def _n_shards(directory) -> int:
    return len(json.loads((Path(directory) / "meta.json").read_text())["shards"])


# ============================================================================ the data stream
def test_global_batch_is_the_same_for_any_number_of_processes(corpora):
    n = _n_shards(corpora["short"])
    assert n >= 4 and n % 2 == 0, n  # the fixture must give an even number of shards
    one = _stream(corpora["short"], 8)
    two = [_stream(corpora["short"], 8, rank=r, world=2) for r in range(2)]
    for step in range(0, 40, 7):  # far enough to pass over every shard more than once
        whole = sorted(one.rows(step, 0))
        parts = [two[r].rows(step, 0) for r in range(2)]
        assert sorted(parts[0] + parts[1]) == whole
        assert all(len(p) == 4 for p in parts)
        for r in range(2):  # each rank reads only its own shards
            assert {k for k, _, _ in parts[r]} <= set(range(r, n, 2))
    opened = [set(s.corpus._names) for s in two]
    assert not opened[0] & opened[1]


def test_masks_follow_the_row_not_the_process(corpora):
    """A row's mask depends on the row only: rank 1 of 2 masks its rows exactly as the single
    process masks the same rows."""
    one = _stream(corpora["short"], 8)
    rank1 = _stream(corpora["short"], 8, rank=1, world=2)
    rows = rank1.rows(3, 0)
    a, b = rank1.batch(rows), one.batch(rows)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])


def test_every_example_once_per_pass_then_reshuffled(corpora):
    stream = _stream(corpora["short"], 4)
    sizes = stream.sizes
    k = 0
    per_pass = [
        sorted(stream._example(k, p)[0] for p in range(e * sizes[k], (e + 1) * sizes[k]))
        for e in range(2)
    ]
    assert per_pass[0] == per_pass[1] == list(range(sizes[k]))
    order = [
        [stream._example(k, p)[0] for p in range(e * sizes[k], (e + 1) * sizes[k])]
        for e in range(2)
    ]
    assert order[0] != order[1]


@pytest.mark.parametrize("static", [False, True])
def test_static_masks_repeat_and_dynamic_ones_change(corpora, static):
    stream = _stream(corpora["short"], 4, static=static)
    k, j = 0, 3
    first, second = stream.batch([(k, j, 0)]), stream.batch([(k, j, 1)])  # two passes
    assert torch.equal(first["input_ids"], second["input_ids"]) == static
    assert torch.equal(first["labels"], second["labels"]) == static
    assert (first["labels"] != IGNORE_INDEX).sum() >= 1
    special = (first["labels"] != IGNORE_INDEX) & torch.isin(
        torch.where(first["labels"] != IGNORE_INDEX, first["labels"], 0), torch.tensor([101, 102])
    )
    assert not special.any()


def test_counts_for_the_loss_are_global(corpora):
    batch = _stream(corpora["short"], 8)(0, 0)
    assert float(batch["mlm_count"]) == float((batch["labels"] != IGNORE_INDEX).sum())
    assert float(batch["nsp_count"]) == 8


def test_phase_schedule_switches_corpus_at_its_step(corpora):
    short, long = _stream(corpora["short"], 4), _stream(corpora["long"], 2, first_step=9)
    phases = Phases([(0, short), (9, long)])
    assert phases(8, 0)["input_ids"].shape[0] == 4
    assert phases(8, 0)["input_ids"].shape[1] <= 64
    b = phases(9, 0)
    assert b["input_ids"].shape[0] == 2
    assert torch.equal(b["input_ids"], long(9, 0)["input_ids"])
    assert long.rows(9, 0) == _stream(corpora["long"], 2).rows(0, 0)  # the phase starts afresh


# ============================================================================ the objective
def test_objective_matches_the_model_loss(corpora):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    batch = _stream(corpora["short"], 6)(0, 0)
    loss, m = PretrainingObjective()(model, batch)
    ref = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        labels=batch["labels"],
        next_sentence_label=batch["next_sentence_label"],
    )
    assert abs(float(loss.detach()) - float(ref.loss.detach())) < 1e-5
    keep = batch["labels"] != IGNORE_INDEX
    acc = (ref.prediction_logits[keep].argmax(-1) == batch["labels"][keep]).float().mean()
    assert abs(float(m["mlm_acc"]) - float(acc)) < 1e-6
    nsp = (ref.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).float().mean()
    assert abs(float(m["nsp_acc"]) - float(nsp)) < 1e-6


def test_evaluation_batches_are_fixed_and_cover_the_sample(corpora):
    a = evaluation_batches(
        corpora["held"], 50, 16, MaskingConfig(max_predictions=10), MASK_ID, 30522
    )
    b = evaluation_batches(
        corpora["held"], 50, 16, MaskingConfig(max_predictions=10), MASK_ID, 30522
    )
    assert [x["input_ids"].shape[0] for x in a] == [16, 16, 16, 2]
    assert all(torch.equal(x["labels"], y["labels"]) for x, y in zip(a, b, strict=True))
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    result = PretrainingObjective().evaluate(model, a)
    assert set(result) == {"mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc"}
    assert 0 <= result["mlm_acc"] <= 1 and 0 <= result["nsp_acc"] <= 1
    assert result["mlm_loss"] > 5  # an untrained model over 30,522 tokens


# ============================================================================ runs
def _config(corpora, out, steps=6, **kw) -> PretrainConfig:
    train_kw = {k: kw.pop(k) for k in list(kw) if k in TrainConfig.__dataclass_fields__}
    tc = TrainConfig(
        out_dir=str(out), steps=steps, lr=1e-3, warmup_steps=1, log_every=100, **train_kw
    )
    kw.setdefault("eval_data", str(corpora["held"]))
    kw.setdefault("data", str(corpora["short"]))
    kw.setdefault("model", str(corpora["config"]))
    return PretrainConfig(train=tc, batch_size=8, eval_examples=24, **kw)


def _losses(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_saves_a_model_transformers_loads_identically(corpora, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    run = tmp_path / "run"
    metrics = pretrain(
        _config(
            corpora,
            run,
            steps=6,
            long_data=str(corpora["long"]),
            long_fraction=0.34,
            long_batch_size=4,
            eval_every=3,
        )
    )
    assert metrics["step"] == 6
    rows = _losses(run)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert {"loss", "mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc", "lr", "tokens_per_s"} <= set(
        rows[0]
    )
    assert "eval_mlm_acc" in rows[2] and "eval_nsp_acc" in rows[5] and "eval_mlm_acc" not in rows[0]
    settings = json.loads((run / "run.json").read_text())
    assert settings["long_fraction"] == 0.34 and settings["train"]["steps"] == 6
    model_dir = run / "model"
    assert {"config.json", "model.safetensors", "vocab.txt"} <= {
        p.name for p in model_dir.iterdir()
    }
    ours = BertForPreTraining.from_pretrained(model_dir).eval()
    theirs = transformers.BertForPreTraining.from_pretrained(model_dir).eval()
    tok = bertlab.BertTokenizer.from_pretrained(model_dir)
    batch = tok(
        ["the cat sat on the mat .", "a longer second sentence about cats"],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    real = batch["attention_mask"].bool()  # (bertlab's packed path leaves padding at zero)
    assert (a.prediction_logits[real] - b.prediction_logits[real]).abs().max() < 1e-5
    assert (a.seq_relationship_logits - b.seq_relationship_logits).abs().max() < 1e-5


def test_stopped_and_resumed_run_gives_the_same_losses(corpora, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    pretrain(_config(corpora, whole, steps=6, eval_every=0))
    broken = tmp_path / "broken"
    call = Phases.__call__

    def interrupt_at_step_3(self, step, micro):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the loop finishes step 3, saves, and stops
        return call(self, step, micro)

    monkeypatch.setattr(Phases, "__call__", interrupt_at_step_3)
    with pytest.raises(TrainingInterrupted) as stopped:
        pretrain(_config(corpora, broken, steps=6, eval_every=0))
    assert stopped.value.step == 3 and not (broken / "model").exists()
    monkeypatch.setattr(Phases, "__call__", call)
    pretrain(_config(corpora, broken, steps=6, eval_every=0), resume=True)
    a, b = _losses(whole), _losses(broken)
    assert [r["step"] for r in b] == list(range(1, 7))
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # dropout on: exact RNG restore
    assert (broken / "model" / "model.safetensors").exists()


def test_interrupted_pretrain_command_says_how_to_continue_and_exits_130(
    corpora, tmp_path, monkeypatch, capfd
):
    call = Phases.__call__

    def interrupt_at_step_2(self, step, micro):
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return call(self, step, micro)

    monkeypatch.setattr(Phases, "__call__", interrupt_at_step_2)
    run = tmp_path / "run"
    args = ["pretrain", "--data", str(corpora["short"]), "--model", str(corpora["config"])]
    args += ["--steps", "4", "--batch-size", "4", "--log-every", "100", "-o", str(run)]
    assert main(args) == 130
    err = capfd.readouterr().err
    assert "SIGINT: stopping after the current step, saving a checkpoint in" in err
    assert f"stopped at step 2, saved in {run / 'checkpoints'}" in err  # the checkpoint's folder
    assert err.strip().splitlines()[-1].strip() == shlex.join(["bertlab", *args, "--resume"])
    assert (run / "checkpoints" / "step-00000002" / "state.json").exists()
    monkeypatch.setattr(Phases, "__call__", call)
    assert main([*args, "--resume"]) == 0
    assert [r["step"] for r in _losses(run)] == [1, 2, 3, 4]


def test_mlm_only_corpus_trains_a_masked_lm(corpora, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
    mlm_only = prepare(
        WIKITEXT,
        VOCAB,
        tmp_path / "mlm",
        max_seq_length=64,
        nsp=False,
        shard_size=40,
        progress=False,
    )
    run = tmp_path / "run"
    pretrain(
        _config(
            corpora,
            run,
            steps=3,
            data=str(mlm_only),
            eval_data=None,
            masking="static",
            whole_word=True,
            precision="bfloat16",
        )
    )
    rows = _losses(run)
    assert all("nsp_loss" not in r and r["mlm_loss"] > 0 for r in rows)
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    ours = bertlab.BertForMaskedLM.from_pretrained(run / "model").eval()
    theirs = transformers.BertForMaskedLM.from_pretrained(run / "model").eval()
    ids = torch.tensor([[101, 1996, 4937, 2938, 102]])
    with torch.no_grad():
        assert (ours(ids).logits - theirs(ids).logits).abs().max() < 1e-5
    with pytest.raises(ValueError, match="--no-nsp"):
        pretrain(
            _config(corpora, tmp_path / "mixed", data=str(mlm_only), eval_data=str(corpora["held"]))
        )


def test_plot_draws_the_curves(corpora, tmp_path):
    pytest.importorskip("matplotlib", reason="plotting is an optional extra (bertlab[plot])")
    run = tmp_path / "run"
    pretrain(_config(corpora, run, steps=4, eval_every=2))
    assert main(["plot", str(run)]) == 0
    png = run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ============================================================================ refusals
def test_run_folder_holding_a_run_is_refused(corpora, tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(_config(corpora, run, steps=2, eval_data=None))
    before = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a run.*--resume.*--overwrite"):
        pretrain(_config(corpora, run, steps=2, eval_data=None))
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing touched
    with pytest.raises(ValueError, match=r"settings differ.*steps"):
        pretrain(_config(corpora, run, steps=3, eval_data=None), resume=True)
    pretrain(_config(corpora, run, steps=3, eval_data=None), overwrite=True)
    assert len(_losses(run)) == 3
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        pretrain(_config(corpora, tmp_path / "new", steps=2, eval_data=None), resume=True)
    code = main(
        [
            "pretrain",
            "--data",
            str(corpora["short"]),
            "--model",
            str(corpora["config"]),
            "--steps",
            "2",
            "-o",
            str(run),
        ]
    )
    assert code == 2 and "already holds a run" in capsys.readouterr().err


def test_vocabulary_and_length_mismatches_are_refused(corpora, tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**TINY, "model_type": "bert", "vocab_size": 1000}))
    with pytest.raises(ValueError, match="30522 tokens.*vocab_size 1000"):
        pretrain(_config(corpora, tmp_path / "a", model=str(small)))
    short_pos = tmp_path / "short_pos.json"
    short_pos.write_text(json.dumps({**TINY, "model_type": "bert", "max_position_embeddings": 32}))
    with pytest.raises(ValueError, match="up to 64 tokens.*max_position_embeddings 32"):
        pretrain(_config(corpora, tmp_path / "b", model=str(short_pos)))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_batch_not_divisible_across_processes_is_refused(corpora):
    with pytest.raises(ValueError, match="batch size 7 .* 2 process"):
        _stream(corpora["short"], 7, rank=0, world=2)
    with pytest.raises(ValueError, match="batch size 8 .* 3 micro-batch"):
        _stream(corpora["short"], 8, grad_accum=3)
    n = _n_shards(corpora["short"])
    odd = next(w for w in range(3, 20) if n % w)
    with pytest.raises(ValueError, match=f"{n} shard.*{odd} processes"):
        _stream(corpora["short"], 8 * odd, rank=0, world=odd)


def test_missing_corpus_is_refused(tmp_path, corpora):
    with pytest.raises(FileNotFoundError, match="not a prepared corpus"):
        pretrain(_config(corpora, tmp_path / "run", data=str(tmp_path)))


def test_bad_pretrain_settings_are_named(corpora):
    with pytest.raises(ValueError, match="masking 'sometimes'"):
        _config(corpora, "x", masking="sometimes")
    with pytest.raises(ValueError, match="long_fraction must be in"):
        _config(corpora, "x", long_fraction=1.5)

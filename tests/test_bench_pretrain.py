"""``bench pretrain`` on a tiny corpus: both sides run, and bertlab's side is the shipped loop."""

from pathlib import Path

import pytest

import bertlab
from bertlab.bench import pretrain as bench
from bertlab.data.corpus import prepare

VOCAB = bertlab.bundled_model_dir()
WIKITEXT = Path(__file__).parent / "fixtures" / "wikitext2_sample.tokens"


def test_bench_pretrain_runs_both_sides_and_bertlab_through_the_shipped_loop(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is a test extra")
    corpus = prepare(WIKITEXT, VOCAB, tmp_path / "c", max_seq_length=32, progress=False)
    calls = []

    def spy(model, task, data, config, **kw):
        calls.append((type(task).__name__, config))
        return loop_train(model, task, data, config, **kw)

    loop_train = bench.train
    monkeypatch.setattr(bench, "train", spy)
    r = bench.bench_pretrain(
        corpus,
        corpus,
        preset="tiny",
        steps=4,
        batch_size=4,
        segment=2,
        eval_every=2,
        eval_examples=8,
        progress=False,
    )
    [(task, config)] = calls
    assert task == "PretrainingObjective" and config.steps == 4 and config.optimizer == "adamw"
    assert set(r) >= {"settings", "seconds", "tokens_per_s", "speedup", "eval", "final"}
    for side in ("bertlab", "transformers"):
        assert len(r["train_loss"][side]) == 4 and r["seconds"][side] > 0
        assert [e["step"] for e in r["eval"][side]] == [2, 4]
        assert set(r["final"][side]) == {"step", "mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc"}
        assert r["tokens_per_s"][side] > 0
    # The same examples in the same order: both sides saw the same real tokens.
    assert r["real_tokens"] == round(
        r["tokens_per_s"]["transformers"] * r["seconds"]["transformers"]
    )

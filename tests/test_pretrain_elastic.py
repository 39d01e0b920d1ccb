"""Pre-training on several processes standing in for nodes (torchrun, gloo, loopback): sharded
checkpoints (torch.distributed.checkpoint) that resume on another number of processes, elastic
restarts after SIGKILL, a bad shard on one rank stopping every rank, world-size changes a run
cannot honour, the run folder's --resume auto, and the checkpoint store itself (exact round
trip, background writes, damaged and crafted files)."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.cli.main import main
from bertlab.data.corpus import prepare
from bertlab.data.masking import MaskingConfig
from bertlab.data.stream import CorpusStream
from bertlab.distributed import rng_state
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import BertForPreTraining
from bertlab.train import pretrain as pretrain_module
from bertlab.train.loop import Lamb, TrainConfig
from bertlab.train.pretrain import PretrainConfig, pretrain
from bertlab.train.runs import ShardedCheckpoints, check_run_folder

WIKITEXT = Path(__file__).parent / "fixtures" / "wikitext2_sample.tokens"
TINY = dict(
    vocab_size=30522,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)
# Losses of runs on 1, 2 and 3 processes agree to this relative difference, step by step (and
# accuracies, which are sums of per-process shares, to this much): they see the same global
# batches, but the sums over a batch's rows (the loss, every gradient) are taken in another
# order (inside one process's matrix products, or per process and then all-reduced), which
# rounds differently in float32. Measured on the 2-core Xeon over 8 steps: at most 1.3e-7
# (about two float32 ulps); the bound leaves room for 8.
TOLERANCE = 1e-6

# bertlab's command line, killing its own process (SIGKILL) at chosen steps. KILL_AT holds
# [attempt, rank, step, checkpoint] rules: the process of that torchrun attempt
# (TORCHELASTIC_RESTART_COUNT) and rank kills itself as it starts that step (counted from 1),
# once the checkpoint of step `checkpoint` is whole in KILL_RUN, after rank 0 copied the
# metrics so far to metrics.attempt<N>.jsonl.
KILLER = """
import json, os, shutil, signal, sys, time
from pathlib import Path
from bertlab.cli.main import main
from bertlab.data.stream import Phases

rules = json.loads(os.environ.get("KILL_AT", "[]"))
run = Path(os.environ["KILL_RUN"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ.get("RANK", "0"))
call = Phases.__call__

def call_or_die(self, step, micro):
    for a, r, s, saved in rules:
        if (a, r, s - 1, 0) == (attempt, rank, step, micro):
            whole = run / "checkpoints" / f"step-{saved:08d}" / "state.json"
            for _ in range(1200):
                if whole.exists():
                    break
                time.sleep(0.05)
            if rank == 0:
                shutil.copy(run / "metrics.jsonl", run / f"metrics.attempt{attempt}.jsonl")
            os.kill(os.getpid(), signal.SIGKILL)
    return call(self, step, micro)

Phases.__call__ = call_or_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus(module_tmp):
    """12 shards: 1, 2, 3, 4 and 6 processes can share them."""
    root = module_tmp.mktemp("elastic")
    data = prepare(
        WIKITEXT, bertlab.bundled_model_dir(), root / "c12", max_seq_length=64, shard_size=19,
        progress=False,
    )  # fmt: skip
    assert len(json.loads((data / "meta.json").read_text())["shards"]) == 12
    BertConfig(**TINY).save_pretrained(root)
    (root / "killer.py").write_text(KILLER)
    return {"data": data, "config": root / "config.json", "killer": root / "killer.py"}


def _args(corpus, out, steps=8, save_every=2) -> list[str]:
    return [
        "pretrain",
        "--data",
        str(corpus["data"]),
        "--model",
        str(corpus["config"]),
        "--steps",
        str(steps),
        "--batch-size",
        "12",
        "--grad-accum",
        "2",
        "--lr",
        "1e-3",
        "--dropout",
        "0",  # dropout draws differ between numbers of processes
        "--log-every",
        "100",
        "--save-every",
        str(save_every),
        "-o",
        str(out),
    ]


def _run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _torchrun(nproc: int, *args: str, restarts: int = 0) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "--max-restarts",
        str(restarts),
        *args,
    ]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ============================================================================ across processes
def test_killed_run_resumed_on_other_world_sizes_gives_the_losses_of_an_unbroken_one(
    corpus, tmp_path
):
    """8 steps, a checkpoint every 2. On 2 processes under torchrun --max-restarts 1: rank 0
    is killed (SIGKILL) as step 4 starts, torchrun restarts both, the run resumes from step 2
    by itself; rank 1 is killed as step 6 starts, and the job ends (no restarts left). Then 1
    process resumes from step 4, is killed as step 7 starts; 3 processes finish the run from
    step 6. Its losses are those of one unbroken process, step by step, to the reduction
    order's rounding; the steps 2 -> 3 again on 2 processes repeat their losses exactly."""
    whole = tmp_path / "whole"
    assert main(_args(corpus, whole)) == 0
    run = tmp_path / "run"
    kill = {"KILL_RUN": str(run)}

    a = _run(
        _torchrun(2, str(corpus["killer"]), *_args(corpus, run), restarts=1),
        {**kill, "KILL_AT": "[[0, 0, 4, 2], [1, 1, 6, 4]]"},
    )
    assert a.returncode != 0 and f"resuming {run} at step 2" in a.stderr, a.stderr[-3000:]
    before, after = _rows(run / "metrics.attempt0.jsonl"), _rows(run / "metrics.jsonl")
    assert [r["step"] for r in before] == [1, 2, 3] and [r["step"] for r in after] == [
        1,
        2,
        3,
        4,
        5,
    ]
    timing = ("tokens_per_s", "train_seconds")
    again = [{k: v for k, v in r.items() if k not in timing} for r in (before[2], after[2])]
    assert again[0] == again[1]  # step 3 again, from the checkpoint of step 2: bit for bit

    b = _run(
        [sys.executable, str(corpus["killer"]), *_args(corpus, run), "--resume"],
        {**kill, "KILL_AT": "[[0, 0, 7, 6]]"},
    )
    assert b.returncode == -9, b.stderr[-3000:]
    assert "ran on 2 process(es); it continues on 1" in b.stderr and "at step 4" in b.stderr

    c = _run(_torchrun(3, "-m", "bertlab", *_args(corpus, run), "--resume"))
    assert c.returncode == 0, c.stderr[-3000:]
    assert "ran on 1 process(es); it continues on 3" in c.stderr and "at step 6" in c.stderr

    ref, got = _rows(whole / "metrics.jsonl"), _rows(run / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 9))  # the rows after a checkpoint, once
    for x, y in zip(ref, got, strict=True):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc"):
            assert abs(x[key] - y[key]) <= TOLERANCE * max(1.0, abs(x[key])), (key, x, y)
    w1 = BertForPreTraining.from_pretrained(whole / "model").state_dict()
    w2 = BertForPreTraining.from_pretrained(run / "model").state_dict()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4
    # The last two checkpoints are kept; the last, of 3 processes, holds a part from each.
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step-00000006", "step-00000008"]
    parts = sorted((run / "checkpoints" / "step-00000008").glob("__*.distcp"))
    assert [p.name for p in parts] == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    assert min(p.stat().st_size for p in parts) > 0.2 * sum(p.stat().st_size for p in parts)
    state = json.loads((run / "checkpoints" / "step-00000008" / "state.json").read_text())
    assert state["step"] == 8 and state["world_size"] == 3 and len(state["rng_ranks"]) == 3


def test_a_missing_shard_on_one_rank_stops_every_rank_naming_it(corpus, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(corpus["data"], data)
    (data / "shard_00001.sep.npy").unlink()  # shard 1: rank 1's of 2
    done = _run(
        _torchrun(
            2, "-m", "bertlab", *_args(corpus, tmp_path / "run", steps=2), "--data", str(data)
        )
    )
    assert done.returncode != 0
    missing = f"{data / 'shard_00001.sep.npy'} does not exist"
    assert f"pretrain: error: shard 1 of {data} is missing a file: {missing}" in done.stderr
    # rank 0, whose own shards are whole, stops too, by itself, naming the file
    assert f"pretrain: error: rank 1 of 2 stopped: shard 1 of {data}" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_damaged_shard_is_named(corpus, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(corpus["data"], data)

    def stream(rank: int) -> CorpusStream:
        return CorpusStream(
            data, 12, MaskingConfig(max_predictions=10), mask_token_id=103, vocab_size=30522,
            rank=rank, world_size=2,
        )  # fmt: skip

    ids = data / "shard_00003.input_ids.npy"
    ids.write_bytes(ids.read_bytes()[:-10])  # truncated
    with pytest.raises(ValueError, match=f"{ids} is damaged: it does not read as an array"):
        stream(1)
    stream(0)  # rank 0's shards are whole
    offsets = data / "shard_00002.offsets.npy"
    import numpy as np

    np.save(offsets, np.arange(20, dtype=np.int64))  # the right length, the wrong offsets
    with pytest.raises(ValueError, match=f"{offsets} is damaged: its offsets do not run"):
        stream(0)


def test_a_world_size_the_run_cannot_keep_is_refused(corpus, tmp_path, monkeypatch):
    tc = TrainConfig(out_dir=str(tmp_path / "run"), steps=2, lr=1e-3, log_every=100)
    config = PretrainConfig(
        data=str(corpus["data"]), model=str(corpus["config"]), train=tc, batch_size=12
    )
    pretrain(config)
    five = lambda: (0, 5)  # noqa: E731  (as torch.distributed would say on 5 processes)
    monkeypatch.setattr(pretrain_module, "world", five)
    monkeypatch.setattr("bertlab.data.stream.world", five)
    with pytest.raises(ValueError) as refused:
        pretrain(config, resume=True)
    assert str(refused.value) == (
        f"the run in {tmp_path / 'run'} ran on 1 process(es); 5 cannot continue it with the "
        "same global batches: batch size 12 cannot be split into 1 micro-batch(es) over 5 "
        "process(es): it must be a multiple of 5"
    )


# ============================================================================ the run folder
def test_resume_auto_and_a_restarted_process(tmp_path, monkeypatch):
    settings = {"model": "mini", "world_size": 2}
    out = tmp_path / "run"
    assert check_run_folder(out, settings, "auto", False) == (False, False)  # nothing: start
    out.mkdir()
    (out / "run.json").write_text(json.dumps(settings))
    (out / "metrics.jsonl").write_text("")
    # this run, stopped before its first checkpoint: started again, over its files
    assert check_run_folder(out, {**settings, "world_size": 1}, "auto", False, ("world_size",)) == (
        False,
        True,
    )
    with pytest.raises(FileExistsError, match="other settings and no checkpoint"):
        check_run_folder(out, {**settings, "model": "base"}, "auto", False)
    (out / "checkpoints" / "step-00000002.partial").mkdir(parents=True)  # a write cut short
    with pytest.raises(FileNotFoundError, match="holds no checkpoint to resume from"):
        check_run_folder(out, settings, True, False)
    (out / "checkpoints" / "step-00000002").mkdir()
    (out / "checkpoints" / "step-00000002" / "state.json").write_text("{}")
    assert check_run_folder(out, settings, "auto", False) == (True, False)
    # a process torchrun restarted resumes, even from a command that said --overwrite
    with pytest.raises(FileExistsError, match="already holds a run"):
        check_run_folder(out, settings, False, False, elastic=True)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert check_run_folder(out, settings, False, True, elastic=True) == (True, False)
    assert check_run_folder(out, settings, False, True) == (False, True)  # fine-tuning's
    with pytest.raises(ValueError, match=r"settings differ.*model 'mini' -> 'base'"):
        check_run_folder(out, {**settings, "model": "base"}, False, False, elastic=True)


# ============================================================================ the store
def _trained(optimizer: str = "adamw") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 50}))
    params = list(model.parameters())
    opt = Lamb(params, lr=1e-3) if optimizer == "lamb" else torch.optim.AdamW(params, fused=True)
    for _ in range(2):
        ids = torch.randint(0, 50, (2, 8))
        model(ids, labels=ids, next_sentence_label=torch.tensor([0, 1])).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(x, b[k]) if torch.is_tensor(x) else (_same(x, b[k]) if isinstance(x, dict)
        else x == b[k])
        for k, x in a.items()
    )  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_sharded_checkpoint_reads_back_exactly(tmp_path, optimizer):
    model, opt = _trained(optimizer)
    store = ShardedCheckpoints(tmp_path / "checkpoints")
    state = {"step": 2, "rng": None, "rng_ranks": [rng_state()], "plan": None}
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = opt.state_dict()
    store.save(model, opt, state, wait=False)  # in the background: the tensors are copied first
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    store.close()
    assert ShardedCheckpoints.complete(tmp_path / "checkpoints")[0].name == "step-00000002"

    fresh, fresh_opt = _trained(optimizer)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh_opt.state.clear()
    path, loaded = ShardedCheckpoints(tmp_path / "checkpoints").load(fresh, fresh_opt)
    assert path.name == "step-00000002" and loaded["step"] == 2 and loaded["world_size"] == 1
    assert _same(fresh.state_dict(), saved)
    assert _same(fresh_opt.state_dict(), saved_opt)
    assert torch.equal(loaded["rng_ranks"][0]["torch"], state["rng_ranks"][0]["torch"])


def test_a_deletion_cut_short_leaves_nothing_the_next_start_keeps(tmp_path):
    """Old checkpoints are renamed out of the checkpoints' names before they are deleted; one
    that a kill left half deleted (its state file gone, its parts still there, as earlier
    versions could leave it) is removed when the next run opens the folder."""
    model, opt = _trained()
    folder = tmp_path / "checkpoints"
    store = ShardedCheckpoints(folder)
    base = {"rng": None, "rng_ranks": [rng_state()], "plan": None}
    for step in (2, 4, 6):
        store.save(model, opt, {**base, "step": step}, wait=True)
    store.close()
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000004", "step-00000006"]
    half = folder / "step-00000004"
    (half / "state.json").unlink()  # the deletion killed after its first file
    assert any(half.iterdir())
    ShardedCheckpoints(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000006"]
    path, loaded = ShardedCheckpoints(folder).load(model, opt)
    assert path.name == "step-00000006" and loaded["step"] == 6


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_damaged_or_crafted_checkpoints_are_not_read(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    model, opt = _trained()
    store = ShardedCheckpoints(tmp_path / "checkpoints")
    base = {"rng": None, "rng_ranks": [rng_state()], "plan": None}
    for step in (2, 4, 6):
        store.save(model, opt, {**base, "step": step}, wait=True)
    folders = ShardedCheckpoints.complete(tmp_path / "checkpoints")
    assert [p.name for p in folders] == ["step-00000006", "step-00000004"]  # two kept
    (folders[0] / ".metadata").write_bytes(pickle.dumps(_Boom()))  # runs a command if unpickled
    part = next(folders[1].glob("*.distcp"))
    part.write_bytes(part.read_bytes()[:1000])  # truncated
    with caplog.at_level(logging.WARNING, logger="bertlab"):
        assert ShardedCheckpoints(tmp_path / "checkpoints").load(model, opt) is None
    assert "posix.system, which is not part of DCP's metadata" in caplog.text
    assert caplog.text.count("is damaged") == 2 and not (tmp_path / "pwned").exists()

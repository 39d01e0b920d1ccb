"""The training loop: exact resume, atomic checkpoints, damaged-checkpoint fallback, schedule,
no decay on biases/LayerNorm, LAMB, accumulation, a non-finite loss stopping the run, the time
budget's plan, interruption; and the one pre-training loss of the head and the objective."""

import json
import logging
import os
import signal
from itertools import pairwise

import pytest
import torch

from bertlab import BertConfig, BertForPreTraining
from bertlab.nn.losses import IGNORE_INDEX, pretraining_loss
from bertlab.tasks.pretraining import PretrainingObjective
from bertlab.train import loop
from bertlab.train.loop import (
    TrainConfig,
    TrainingInterrupted,
    linear_schedule,
    param_groups,
    train,
)

CFG = BertConfig(
    vocab_size=60,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
)


def data(step: int, micro: int) -> dict[str, torch.Tensor]:
    """A batch that depends only on (step, micro): resuming sees the same data."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    ids = torch.randint(5, 60, (4, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    chosen = (torch.rand(4, 16, generator=g) < 0.2) & mask.bool()
    labels = torch.where(chosen, ids, -100)
    nsp = torch.randint(0, 2, (4,), generator=g)
    return {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "labels": labels,
        "next_sentence_label": nsp,
    }


def task(model, batch):
    out = model(**batch, return_logits=False)
    return out.loss, {"loss": out.loss.item()}


def model():
    torch.manual_seed(0)
    return BertForPreTraining(CFG)  # dropout on: resume must also restore the RNG


def losses(path):
    return [json.loads(line)["loss"] for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_stopped_and_resumed_run_gives_the_same_losses(tmp_path):
    full = tmp_path / "full"
    train(model(), task, data, TrainConfig(out_dir=str(full), steps=6, warmup_steps=2, lr=1e-3))

    part = tmp_path / "part"
    crash_at = 4

    def crashing(step, micro):
        if step == crash_at:
            raise KeyboardInterrupt("machine lost")
        return data(step, micro)

    cfg = TrainConfig(out_dir=str(part), steps=6, warmup_steps=2, lr=1e-3, save_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(model(), task, crashing, cfg)
    assert len(losses(part)) == crash_at  # steps 1..4 logged, checkpoint at step 4
    train(model(), task, data, cfg, resume=True)
    assert losses(part) == losses(full)  # exactly, step by step


def test_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    cfg = TrainConfig(out_dir=str(tmp_path), steps=4, save_every=2, lr=1e-3)
    train(model(), task, data, cfg)
    ckpt = tmp_path / "checkpoint.pt"
    assert (tmp_path / "checkpoint.pt.prev").exists() and not list(tmp_path.glob("*.tmp"))
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING, logger="bertlab"):
        train(
            model(), task, data, TrainConfig(out_dir=str(tmp_path), steps=5, lr=1e-3), resume=True
        )
    assert "damaged" in caplog.text and "resuming" in caplog.text
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 5


def test_non_finite_loss_stops_with_step_and_checkpoint(tmp_path):
    def bad(step, micro):
        return data(step, micro)

    def exploding(model, batch):
        loss, m = task(model, batch)
        return loss * float("nan"), {"loss": float("nan")}

    cfg = TrainConfig(out_dir=str(tmp_path), steps=3, lr=1e-3)
    with pytest.raises(FloatingPointError, match=r"not finite at step 1 .*none yet"):
        train(model(), exploding, bad, cfg)


def test_no_weight_decay_on_biases_and_layernorm():
    m = model()
    names = {id(p): n for n, p in m.named_parameters()}
    decay, no_decay = param_groups(m, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(
        names[id(p)].endswith("weight") and "LayerNorm" not in names[id(p)] for p in decay["params"]
    )
    assert all(
        names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in no_decay["params"]
    )


def test_linear_warmup_then_decay():
    f = linear_schedule(4, 10)
    assert [round(f(s), 3) for s in range(10)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        0.833,
        0.667,
        0.5,
        0.333,
        0.167,
    ]


def test_accumulation_and_lamb_train(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), steps=8, lr=5e-3, grad_accum=2, optimizer="lamb")
    train(model(), task, data, cfg)
    first, last = losses(tmp_path)[0], losses(tmp_path)[-1]
    assert last < first  # it learns


@pytest.mark.parametrize(
    "field,value",
    [("steps", 0), ("optimizer", "sgd"), ("precision", "fp8"), ("warmup_steps", 99), ("lr", 0.0)],
)
def test_bad_config_is_named(field, value, tmp_path):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{"out_dir": str(tmp_path), "steps": 5, field: value})


# ============================================================================ one loss
def test_the_head_and_the_pretraining_objective_give_one_loss_on_one_process():
    m = model().eval()
    batch = data(0, 0) | {"token_type_ids": torch.zeros(4, 16, dtype=torch.long)}
    counted = batch | {
        "mlm_count": (batch["labels"] != IGNORE_INDEX).sum().reshape(1),
        "nsp_count": torch.tensor([4]),
    }
    loss, parts = PretrainingObjective()(m, counted)
    gathered = m(**batch, return_logits=False).loss  # only the labelled positions scored
    every = m(**batch).loss  # every position scored, the unlabelled ones ignored
    assert torch.allclose(loss, gathered, atol=1e-6) and torch.allclose(loss, every, atol=1e-6)
    assert float(parts["loss"]) == pytest.approx(float(loss.detach()), abs=1e-7)


def test_pretraining_loss_is_the_mean_by_default_and_a_share_with_a_global_count():
    g = torch.Generator().manual_seed(0)
    logits, nsp_logits = torch.randn(12, 7, generator=g), torch.randn(3, 2, generator=g)
    labels = torch.tensor([1, -100, 3, 4, -100, 6, 0, 2, -100, -100, 5, 1])
    nsp_labels = torch.tensor([0, 1, 1])
    loss, parts = pretraining_loss(logits, labels, nsp_logits, nsp_labels)
    mlm = torch.nn.functional.cross_entropy(logits, labels)  # torch's mean, -100 ignored
    nsp = torch.nn.functional.cross_entropy(nsp_logits, nsp_labels)
    assert torch.allclose(loss, mlm + nsp) and torch.allclose(parts["mlm_loss"], mlm)
    # Two processes, each holding half the labelled positions: their shares add up to the mean.
    halves = [
        pretraining_loss(logits[s], labels[s], mlm_count=8)[0] for s in (slice(0, 6), slice(6, 12))
    ]
    assert torch.allclose(sum(halves), mlm)
    with pytest.raises(ValueError, match="nsp_logits were given without nsp_labels"):
        pretraining_loss(logits, labels, nsp_logits)


# ============================================================================ the time plan
class FakeClock:
    """A clock that only the task moves: one second a forward pass, so step times are exact
    and the plan does not depend on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def slow_task(
    clock: FakeClock,
    interrupt_at: int | None = None,
    first: float = 1.0,
    slower_from: int | None = None,
    faster_from: int | None = None,
):
    calls = {"n": 0}

    def run(m, batch):
        late = slower_from is not None and calls["n"] >= slower_from
        early = faster_from is not None and calls["n"] < faster_from
        clock.now += first if calls["n"] == 0 else 2.0 if late or early else 1.0
        if calls["n"] == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # the loop finishes this step, saves, stops
        calls["n"] += 1
        return task(m, batch)

    return run


def test_a_time_budget_plans_the_steps_and_decays_the_rate_to_zero_at_its_end(
    tmp_path, monkeypatch
):
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=100, warmup_steps=10, lr=1e-3, max_seconds=10.7)
    last = train(model(), slow_task(clock), data, cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # The plan comes after 1 skipped + 3 timed steps of 1 s: 4 s spent, 6.7 s left, of which
    # the plan fills 90% (loop.PLAN_SHARE): 6 more steps.
    plan = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["plan"]
    # Warm-up 10 * 10/100 = 1 step is over before the plan: it ends where the plan is made.
    assert plan == {"steps": 10, "warmup": 4, "seconds_per_step": 1.0, "since": 0, "start": 1.0}
    assert last["step"] == last["planned_steps"] == len(rows) == 10 < cfg.steps
    assert [r["planned_steps"] for r in rows] == [100] * 3 + [10] * 7
    assert "stopped_by_time" not in last and rows[-1]["train_seconds"] <= cfg.max_seconds
    # From the plan on, the logged rate (the one after each step) follows the planned schedule.
    planned = linear_schedule(4, 10)
    assert [r["lr"] for r in rows[3:]] == pytest.approx([1e-3 * planned(s) for s in range(4, 11)])
    assert rows[-1]["lr"] == 0.0


def test_steps_that_slow_down_after_the_plan_shrink_it_so_the_run_ends_on_its_schedule(
    tmp_path, monkeypatch
):
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=100, warmup_steps=10, lr=1e-3, max_seconds=20)
    last = train(model(), slow_task(clock, slower_from=4), data, cfg)  # 1 s, then 2 s a step
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    plans = [r["planned_steps"] for r in rows[3:]]  # from the first plan on
    assert len(set(plans)) > 1 and plans == sorted(plans, reverse=True)  # it only shrank
    assert last["step"] == last["planned_steps"] == plans[-1]  # ended on the plan, not cut
    assert "stopped_by_time" not in last and rows[-1]["lr"] == 0.0
    assert rows[-1]["train_seconds"] <= cfg.max_seconds
    # a shorter plan decays the rate sooner; it never warms up again (no jump back to the peak)
    lrs = [r["lr"] for r in rows]
    peak = lrs.index(max(lrs))
    assert all(later <= earlier for earlier, later in pairwise(lrs[peak:]))


def test_steps_that_speed_up_after_the_plan_grow_it_so_the_budget_is_used(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=100, warmup_steps=10, lr=1e-3, max_seconds=30)
    # 2 s a step for the first 4 (the plan is made on them: 13 steps, ending at 17 s), then 1 s
    last = train(model(), slow_task(clock, first=2.0, faster_from=4), data, cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    plans = [r["planned_steps"] for r in rows[3:]]
    assert plans[0] == 13 and len(set(plans)) > 1 and plans == sorted(plans)  # it only grew
    assert last["step"] == last["planned_steps"] == plans[-1]  # ended on the plan, not cut
    assert "stopped_by_time" not in last and rows[-1]["lr"] == 0.0
    # the budget is used: the run ends past loop.GROW_BELOW of it, within it
    assert loop.GROW_BELOW * cfg.max_seconds <= rows[-1]["train_seconds"] <= cfg.max_seconds
    # a longer plan decays the rate from where it is: no jump up, and no step sharper than
    # the first plan's slope (1e-3 over its 9 steps after the warm-up)
    lrs = [r["lr"] for r in rows]
    peak = lrs.index(max(lrs))
    assert all(later <= earlier for earlier, later in pairwise(lrs[peak:]))
    assert max(a - b for a, b in pairwise(lrs[peak:])) <= 1e-3 / 9 + 1e-12


def test_a_plan_fitted_again_goes_on_from_the_rate_where_it_is():
    cfg = TrainConfig(out_dir="x", steps=100, warmup_steps=10, lr=1e-3, max_seconds=100)
    first = loop.Plan(steps=20, warmup=4, seconds_per_step=2.0)
    for per_step in (0.5, 4.0):  # faster: longer; slower: shorter
        again = loop.Plan.fit(cfg, done=10, elapsed=30, per_step=per_step, previous=first)
        assert (again.since, again.warmup) == (10, 4)
        assert again.factor(10) == pytest.approx(first.factor(10))  # no jump
        assert again.factor(again.steps) == 0.0 and again.steps != first.steps
    # fitted again during the warm-up: the warm-up goes on, then the decay to the new end
    early = loop.Plan.fit(cfg, done=2, elapsed=6, per_step=0.5, previous=first)
    assert early.since == 0 and early.warmup == 4 and early.factor(3) == 1.0


def test_a_resumed_budget_run_keeps_its_plan_and_equals_the_unbroken_one(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)

    def config(out):
        return TrainConfig(out_dir=str(out), steps=100, warmup_steps=10, lr=1e-3, max_seconds=10.7)

    train(model(), slow_task(clock), data, config(tmp_path / "full"))
    part = tmp_path / "part"
    with pytest.raises(TrainingInterrupted) as stop:
        train(model(), slow_task(clock, interrupt_at=6), data, config(part))
    assert stop.value.step == 7 and stop.value.checkpoint == part / "checkpoint.pt"
    assert torch.load(stop.value.checkpoint, weights_only=True)["plan"]["steps"] == 10
    train(model(), slow_task(clock), data, config(part), resume=True)
    full, parted = (rows(tmp_path / "full"), rows(part))
    assert [r["step"] for r in parted] == list(range(1, 11))
    for key in ("loss", "lr", "planned_steps", "train_seconds"):
        assert [r[key] for r in parted] == [r[key] for r in full], key


def test_the_first_steps_one_off_cost_is_left_out_of_the_plan(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    cfg = TrainConfig(out_dir=str(tmp_path), steps=50, lr=1e-3, max_seconds=12.5)
    last = train(model(), slow_task(clock, first=5.0), data, cfg)
    # 5 s, then 1 s a step: planned after 8 s at step 4, with 4.5 s left: 90% hold 4 more steps.
    plan = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["plan"]
    assert plan["seconds_per_step"] == 1.0 and plan["steps"] == last["step"] == 8


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_a_budget_config_is_checked():
    with pytest.raises(ValueError, match="max_seconds must be > 0, got 0"):
        TrainConfig(out_dir="x", steps=5, max_seconds=0)


# ============================================================================ interruption
def test_a_signal_saves_the_step_then_raises_training_interrupted(tmp_path):
    def interrupting(m, batch):
        if batch["input_ids"].sum() == data(1, 0)["input_ids"].sum():  # during step 2
            os.kill(os.getpid(), signal.SIGTERM)
        return task(m, batch)

    cfg = TrainConfig(out_dir=str(tmp_path), steps=5, lr=1e-3)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingInterrupted) as stop:
        train(model(), interrupting, data, cfg)
    assert isinstance(stop.value, KeyboardInterrupt)
    assert (stop.value.step, stop.value.signum) == (2, signal.SIGTERM)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2
    assert "interrupted at step 2" in str(stop.value)
    assert signal.getsignal(signal.SIGTERM) is before  # the loop's handler is gone


def test_the_progress_line_off_a_terminal_is_plain_lines(tmp_path, capsys):
    train(model(), task, data, TrainConfig(out_dir=str(tmp_path), steps=3, lr=1e-3, log_every=1))
    err = capsys.readouterr().err
    assert "\r" not in err and "step 3/3 loss " in err

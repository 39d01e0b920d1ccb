"""The training loop: exact resume, atomic checkpoints, damaged-checkpoint fallback, schedule,
no decay on biases/LayerNorm, LAMB, accumulation, and a non-finite loss stopping the run."""

import json
import logging

import pytest
import torch

from bertlab import BertConfig, BertForPreTraining
from bertlab.train.loop import TrainConfig, linear_schedule, param_groups, train

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

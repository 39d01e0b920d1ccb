"""``bertlab bench finetune {classify,tag,qa}``: one fine-tuning, in bertlab and in transformers.

The bertlab side is ``bertlab.train.finetune.finetune`` itself, as ``bertlab finetune`` runs it. The
transformers side is its ``BertFor...`` model in a plain training loop of the kind its
documentation shows (torch AdamW, ``get_linear_schedule_with_warmup``, gradient clipping at
1.0). Both start from identical weights (bertlab's starting model, the fresh head included,
saved and loaded into transformers), see the same batches in the same order (bertlab's
features; the two tokenizers give identical ids, as ``tests/test_tokenizer_parity.py`` shows),
use the same hyperparameters and seed, evaluate on the dev set after every epoch and when the
budget runs out, keep their best evaluation, and train for the same seconds. bertlab's side
runs under ``--max-seconds`` as ``bertlab finetune`` does, which counts its evaluations and
keeps room for the final one; where that budget stopped it, transformers' side then trains for
the training seconds bertlab's side had, its evaluations not charged, so both train for the same
time (a bertlab run that finished its planned steps leaves transformers the whole budget). The
dev figures come from the same metric code (``bertlab.metrics``) applied to each side's logits.

The runs are sequential in one process (transformers first), on identical thread counts; a
quiet machine matters, since a slower run trains fewer steps in its budget.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from bertlab.progress import Progress
from bertlab.train.finetune import FinetuneConfig, Prepared, finetune, prepare


def _transformers_model(run: Prepared) -> torch.nn.Module:
    """transformers' model of the task, holding ``run``'s starting weights."""
    import transformers

    cls = getattr(transformers, run.task.hf_class)
    start = run.model
    with tempfile.TemporaryDirectory() as d:
        start.save_pretrained(d)
        return cls.from_pretrained(d, attn_implementation="sdpa")


def _run_transformers(
    config: FinetuneConfig,
    run: Prepared,
    model: torch.nn.Module,
    key: str,
    seconds: float,
    progress: bool,
    steps: int,
) -> dict[str, Any]:
    """Fine-tune transformers' ``model`` in its own loop, on ``run``'s batches, for ``seconds``;
    ``key`` picks the best evaluation. The learning-rate schedule runs over ``steps``: the plan
    bertlab's loop made for the same budget, so both sides warm up and decay alike."""
    from transformers import get_linear_schedule_with_warmup

    no_decay = ("bias", "LayerNorm.weight")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {
            "params": [p for n, p in named if not any(k in n for k in no_decay)],
            "weight_decay": config.weight_decay,
        },
        {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=config.lr, eps=1e-6)
    sched = get_linear_schedule_with_warmup(opt, int(config.warmup_ratio * steps), steps)
    data = run.batches(config.batch_size, config.seed)
    torch.manual_seed(config.seed)
    model.train()
    evals: list[dict[str, Any]] = []
    best: dict[str, Any] = {}
    trained = 0.0
    tokens = done = 0
    losses: list[float] = []
    status = Progress() if progress else None
    for step in range(steps):
        t0 = time.perf_counter()
        batch = data(step)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        trained += time.perf_counter() - t0
        losses.append(round(float(loss.detach()), 5))
        tokens += int(batch["attention_mask"].sum())
        done = step + 1
        late = trained > seconds
        if status is not None and (done % 20 == 0 or late or done == steps):
            status.update(
                f"transformers step {done}/{steps} loss {losses[-1]:.4f} "
                f"{tokens / trained:,.0f} tok/s"
            )
        if done % run.per_epoch == 0 or late or done == steps:
            result, details = run.task.evaluate_with_details(model, run.dev)
            model.train()
            evals.append({"step": done, "seconds": trained, **result})
            if not best or result[key] > best["metrics"][key]:
                best = {"step": done, "metrics": result, "details": details}
        if late:
            break
    if status is not None:
        status.close()
    out: dict[str, Any] = {
        "steps": done,
        "planned_steps": steps,
        "seconds": trained,
        "tokens_per_s": tokens / trained,
        "best_step": best["step"],
        "dev": best["metrics"],
        "evaluations": evals,
        "losses": losses,
    }
    if best["details"] is not None:  # e.g. the per-type table of entities, best model's
        out["dev_full"] = best["details"]
    return out


def _run_bertlab(
    config: FinetuneConfig, run: Prepared, seconds: float, progress: bool
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        r = finetune(replace(config, max_seconds=seconds), d, progress=progress, prepared=run)
        rows = [json.loads(line) for line in (Path(d) / "metrics.jsonl").open()]
    if not rows:
        raise ValueError(
            f"a budget of {seconds:g} s holds no training step of bertlab's run (its time counts "
            "the final evaluation, which is kept room for): give more --seconds"
        )
    evals = [
        {
            "step": row["step"],
            "seconds": row["train_seconds"],
            **{k[5:]: v for k, v in row.items() if k.startswith("eval_")},
        }
        for row in rows
        if any(k.startswith("eval_") for k in row)
    ]
    last = rows[-1]
    out = {
        "steps": r["steps"],
        "planned_steps": r["planned_steps"],
        "seconds": last["train_seconds"],
        "tokens_per_s": last["tokens_per_s"],
        "best_step": r["best_step"],
        "dev": r["dev"],
        "evaluations": evals,
        "losses": [round(row["loss"], 5) for row in rows],
    }
    if "dev_full" in r:
        out["dev_full"] = r["dev_full"]
    return out


def bench_finetune(config: FinetuneConfig, seconds: float, progress: bool = True) -> dict[str, Any]:
    """Both sides for ``seconds`` of training each; the report of ``bertlab bench finetune``."""
    if not seconds > 0:
        raise ValueError(f"the time budget must be > 0 seconds, got {seconds}")
    if config.dev is None and not config.dev_articles:
        raise ValueError("bench finetune needs a dev set: --dev, or --dev-articles for qa")
    if config.precision != "float32":
        raise ValueError(
            f"bench finetune compares float32 runs; got precision {config.precision!r}"
        )
    report: dict[str, Any] = {
        "task": config.task,
        "config": asdict(config),
        "budget_seconds": seconds,
        "threads": torch.get_num_threads(),
    }
    started = time.perf_counter()
    run = prepare(config, progress)  # the data is read and encoded once, for both sides
    key = report["main_metric"] = run.task.main_metric
    hf = _transformers_model(run)  # a copy of the starting weights, taken before training
    # bertlab first: its loop plans the schedule to the budget, and transformers' side gets the
    # same planned steps for its schedule and bertlab's training seconds for its own budget.
    report["bertlab"] = b = _run_bertlab(config, run, seconds, progress)
    planned = b["planned_steps"]
    # transformers trains as long, where the budget stopped bertlab's side; a run that finished
    # its plan leaves transformers' side the whole budget, to finish the same plan
    trained = seconds if b["steps"] >= planned else b["seconds"]
    report["transformers"] = t = _run_transformers(config, run, hf, key, trained, progress, planned)
    del hf
    report["speedup"] = b["tokens_per_s"] / t["tokens_per_s"]
    report["difference"] = b["dev"][key] - t["dev"][key]
    report["wall_seconds"] = time.perf_counter() - started
    return report


def format_report(r: dict[str, Any]) -> str:
    key = r["main_metric"]
    lines = [f"{'':<14}{'steps':>12}{'train s':>9}{'tokens/s':>10}{'best ' + key:>14}"]
    for side in ("bertlab", "transformers"):
        s = r[side]
        lines.append(
            f"{side:<14}{s['steps']:>6}/{s['planned_steps']:<5}{s['seconds']:>9.0f}"
            f"{s['tokens_per_s']:>10,.0f}{s['dev'][key]:>14.4f}"
        )
    lines.append(
        f"bertlab trains {r['speedup']:.2f}x the tokens per second; best {key} "
        f"{r['difference']:+.4f} against transformers"
    )
    return "\n".join(lines)


def plot_finetune(r: dict[str, Any], path: str | Path) -> None:
    """Dev figure against training seconds, both sides."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("the chart needs matplotlib (pip install 'bertlab[plot]')") from e
    key = r["main_metric"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for side in ("bertlab", "transformers"):
        ev = r[side]["evaluations"]
        ax.plot([e["seconds"] for e in ev], [e[key] for e in ev], "o-", label=side)
    ax.axvline(r["budget_seconds"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(0, r["budget_seconds"] * 1.05)
    ax.set_xlabel("training seconds (dashed: the budget)")
    ax.set_ylabel(f"dev {key}")
    ax.set_title(f"fine-tuning ({r['task']}), {math.ceil(r['budget_seconds'])} s each")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

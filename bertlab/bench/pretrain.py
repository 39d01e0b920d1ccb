"""``bertlab bench pretrain``: the same pre-training run in bertlab and in transformers.

Both sides start from identical weights (bertlab's initialisation, saved and loaded into
transformers' ``BertForPreTraining``), train on the same examples in the same order with the
same optimiser settings (AdamW, no decay on biases and LayerNorm, linear warm-up and decay,
clipping at 1.0), steps and seed, and are evaluated on the same held-out batches. bertlab's side
is what ``bertlab pretrain`` runs: the shipped loop (``bertlab.train.loop.train``, fused AdamW,
bfloat16 autocast when asked) with the pre-training objective; transformers' side is a plain
loop (``torch.optim.AdamW``, a LambdaLR schedule). Each side masks the way it does by default:
bertlab with its dynamic 80/10/10 recipe (a count of 15% per sequence), transformers with
``DataCollatorForLanguageModeling`` (each token chosen with probability 0.15).

The two runs take turns in segments of steps in one process, so that the machine's noise falls
on both: transformers runs its segment inside the shipped loop's evaluation hook, which the loop
keeps out of bertlab's training time. The wall time of each side counts its training steps
only (batches, forward, backward, update).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertlab.data.corpus import read_meta
from bertlab.data.masking import MaskingConfig
from bertlab.data.stream import Phases, evaluation_batches
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import BertForPreTraining
from bertlab.nn.losses import IGNORE_INDEX
from bertlab.progress import Progress
from bertlab.tasks.pretraining import PretrainingObjective
from bertlab.tokenizer import BertTokenizer
from bertlab.train.loop import TrainConfig, linear_schedule, param_groups, train


def _optimizer(model: torch.nn.Module, lr: float, warmup: int, steps: int):
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.999), eps=1e-6)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(warmup, steps))


def _evaluate_hf(model, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The held-out metrics of ``PretrainingObjective.evaluate``, from transformers' logits."""
    sums = dict.fromkeys(("mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc"), 0.0)
    n_mlm = n_nsp = 0.0
    model.eval()
    with torch.no_grad():
        for b in batches:
            out = model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"],
            )
            keep = b["labels"] != IGNORE_INDEX
            logits, target = out.prediction_logits[keep].float(), b["labels"][keep]
            sums["mlm_loss"] += float(F.cross_entropy(logits, target, reduction="sum"))
            sums["mlm_acc"] += float((logits.argmax(-1) == target).sum())
            nsp = out.seq_relationship_logits.float()
            label = b["next_sentence_label"]
            sums["nsp_loss"] += float(F.cross_entropy(nsp, label, reduction="sum"))
            sums["nsp_acc"] += float((nsp.argmax(-1) == label).sum())
            n_mlm += float(keep.sum())
            n_nsp += len(label)
    model.train()
    return {k: v / (n_mlm if k.startswith("mlm") else n_nsp) for k, v in sums.items()}


def bench_pretrain(
    data: str | Path,
    eval_data: str | Path,
    long_data: str | Path | None = None,
    preset: str = "mini",
    steps: int = 1000,
    batch_size: int = 32,
    long_fraction: float = 0.1,
    long_batch_size: int | None = None,
    lr: float = 1e-4,
    warmup: int | None = None,
    seed: int = 0,
    segment: int = 50,
    eval_every: int = 100,
    eval_examples: int = 512,
    progress: bool = True,
    precision: str = "float32",
) -> dict[str, Any]:
    """Both sides' runs -> the report (settings, seconds, tokens/s, speed-up, held-out metrics
    over the run, training losses). ``precision="bfloat16"``: both sides under autocast."""
    from transformers import BertForPreTraining as HFBertForPreTraining
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    for name, value in (("steps", steps), ("segment", segment), ("eval_every", eval_every)):
        if value < 1:
            raise ValueError(f"bench pretrain: {name} must be >= 1, got {value}")
    meta = read_meta(data)
    vocab_dir = meta["vocab_dir"]
    tokenizer = BertTokenizer.from_pretrained(vocab_dir)
    vocab_size = int(meta["vocab_size"])
    warmup = steps // 100 if warmup is None else warmup
    config = TrainConfig(
        out_dir="",  # set below, in a temporary folder
        steps=steps,
        lr=lr,
        warmup_steps=warmup,
        weight_decay=0.01,
        max_grad_norm=1.0,
        precision=precision,
        seed=seed,
        log_every=steps,  # the bench's own status line reports the turns
        checkpoints=False,
    )

    torch.manual_seed(seed)
    ours = BertForPreTraining(BertConfig.preset(preset, vocab_size=vocab_size))
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = HFBertForPreTraining.from_pretrained(tmp, attn_implementation="sdpa")
    objective = PretrainingObjective()
    hf_tok = BertTokenizerFast(
        vocab_file=str(Path(vocab_dir) / "vocab.txt"), do_lower_case=tokenizer.do_lower_case
    )
    collator = DataCollatorForLanguageModeling(
        hf_tok, mlm=True, mlm_probability=0.15, return_tensors="pt"
    )

    ours_data = Phases.build(
        steps,
        data,
        batch_size,
        long_data,
        long_fraction,
        long_batch_size,
        MaskingConfig.for_length,
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=vocab_size,
        seed=seed,
        rank=0,
        world_size=1,
    )

    def hf_batch(step: int) -> dict[str, torch.Tensor]:
        """The same rows as bertlab's step, unmasked, through transformers' collator."""
        stream = ours_data.stream(step)
        features = [
            {
                "input_ids": e["input_ids"].tolist(),
                "token_type_ids": e["token_type_ids"].tolist(),
                "next_sentence_label": int(e["next_sentence_label"]),
            }
            for e in stream.examples(stream.rows(step, 0))
        ]
        return collator(features)

    masking = MaskingConfig.for_length(int(read_meta(eval_data)["max_seq_length"]))
    batches = evaluation_batches(
        eval_data, eval_examples, 64, masking, tokenizer.mask_token_id, vocab_size, seed=seed
    )

    # ---------------------------------------------------------------- transformers' side
    hf_opt, hf_sched = _optimizer(hf, lr, warmup, steps)
    hf_log: dict[str, list] = {"loss": [], "tokens": []}
    evals: dict[str, list[dict]] = {"bertlab": [], "transformers": []}
    hf_seconds = 0.0
    low = precision == "bfloat16"  # as the loop does for bertlab's side

    def hf_steps(upto: int) -> None:
        """Train transformers' side on its steps before ``upto`` (the loop calls its evaluation
        hook without gradients: they are switched back on here)."""
        nonlocal hf_seconds
        hf.train()
        for step in range(len(hf_log["loss"]), upto):
            t0 = time.perf_counter()
            batch = hf_batch(step)
            with torch.enable_grad():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
                    out = hf(**batch)
                out.loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            hf_opt.step()
            hf_sched.step()
            hf_opt.zero_grad(set_to_none=True)
            hf_seconds += time.perf_counter() - t0
            hf_log["loss"].append(float(out.loss.detach()))
            hf_log["tokens"].append(int(batch["attention_mask"].sum()))
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                evals["transformers"].append({"step": step + 1, **_evaluate_hf(hf, batches)})

    # ---------------------------------------------------------------- bertlab's side
    started = time.perf_counter()
    status = Progress() if progress else None

    def between(model: torch.nn.Module, step: int) -> dict[str, float]:
        """The loop's evaluation hook (outside bertlab's timed steps): bertlab's held-out
        metrics when due, then transformers' next segment."""
        result = {}
        if step % eval_every == 0 or step == steps:
            result = objective.evaluate(model, batches)
            evals["bertlab"].append({"step": step, **result})
        if step % segment == 0:
            hf_steps(min(steps, step + segment))
        if status is not None:
            status.update(
                f"bench pretrain: step {step}/{steps}, transformers {hf_seconds:.0f}s, "
                f"{time.perf_counter() - started:.0f}s in all"
            )
        return result

    with tempfile.TemporaryDirectory() as run_dir:
        config = replace(config, out_dir=run_dir)
        hf_steps(min(steps, segment))
        last = train(
            ours,
            objective,
            ours_data,
            config,
            evaluate=between,
            eval_every=math.gcd(segment, eval_every),
        )
        rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]
    if status is not None:
        status.close()
    hf_steps(steps)  # nothing left unless the loop stopped early

    ours_tokens = round(last["tokens_per_s"] * last["train_seconds"])
    seconds = {"bertlab": float(last["train_seconds"]), "transformers": hf_seconds}
    tokens = {"bertlab": ours_tokens, "transformers": sum(hf_log["tokens"])}
    result = {
        "settings": {
            "preset": preset,
            "steps": steps,
            "batch_size": batch_size,
            "long_batch_size": (long_batch_size or batch_size) if long_data else None,
            "long_fraction": long_fraction if long_data else 0.0,
            "lr": lr,
            "warmup": warmup,
            "seed": seed,
            "segment": segment,
            "precision": precision,
            "data": str(data),
            "long_data": str(long_data) if long_data else None,
            "eval_data": str(eval_data),
            "eval_examples": eval_examples,
            "threads": torch.get_num_threads(),
            "bertlab_loop": "bertlab.train.loop.train (fused AdamW)",
        },
        "seconds": seconds,
        "tokens_per_s": {n: tokens[n] / seconds[n] for n in seconds},
        "seconds_per_step": {n: seconds[n] / steps for n in seconds},
        "speedup": seconds["transformers"] / seconds["bertlab"],
        "real_tokens": ours_tokens,
        "eval": evals,
        "final": {n: evals[n][-1] for n in evals},
        "train_loss": {"bertlab": [r["loss"] for r in rows], "transformers": hf_log["loss"]},
    }
    return result


def plot_pretrain(report: dict[str, Any], path: str | Path) -> None:
    """Held-out MLM and NSP accuracy and the training loss, both sides, to PNG."""
    import matplotlib

    from bertlab.train.curves import smooth

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colours = {"bertlab": "#2a7", "transformers": "#c44"}
    for name, colour in colours.items():
        loss = report["train_loss"][name]
        axes[0].plot(
            range(1, len(loss) + 1),
            smooth(loss, max(1, len(loss) // 50)),
            color=colour,
            label=name,
            linewidth=1,
        )
        ev = report["eval"][name]
        steps = [e["step"] for e in ev]
        axes[1].plot(steps, [e["mlm_acc"] for e in ev], "o-", color=colour, label=name)
        axes[2].plot(steps, [e["nsp_acc"] for e in ev], "o-", color=colour, label=name)
    for ax, title in zip(
        axes,
        ("training loss (MLM + NSP)", "held-out MLM accuracy", "held-out NSP accuracy"),
        strict=True,
    ):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    s = report["settings"]
    fig.suptitle(
        f"pre-training {s['preset']}, batch {s['batch_size']}, {s['steps']} steps: "
        f"bertlab {report['speedup']:.2f}x faster per step",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

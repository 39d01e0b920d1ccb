"""``bertlab bench pretrain``: the same pre-training run in bertlab and in transformers.

Both sides start from identical weights (bertlab's initialisation, saved and loaded into
transformers' ``BertForPreTraining``), train on the same examples in the same order with the
same optimiser (AdamW, no decay on biases and LayerNorm, linear warm-up and decay, clipping at
1.0), steps and seed, and are evaluated on the same held-out batches. Each side masks the way it
does by default: bertlab with its dynamic 80/10/10 recipe (a count of 15% per sequence),
transformers with ``DataCollatorForLanguageModeling`` (each token chosen with probability 0.15).
The two runs alternate in segments of steps in one process, so that the machine's noise falls
on both; the wall time of each side counts its training steps only.
"""

from __future__ import annotations

import tempfile
import time
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
from bertlab.tasks.pretraining import PretrainingObjective, evaluate
from bertlab.tokenizer import BertTokenizer
from bertlab.train.loop import linear_schedule, param_groups


def _optimizer(model: torch.nn.Module, lr: float, warmup: int, steps: int):
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.999), eps=1e-6)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, linear_schedule(warmup, steps))


def _evaluate_hf(model, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The held-out metrics of ``bertlab.train.pretrain.evaluate``, from transformers' logits."""
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
) -> dict[str, Any]:
    from transformers import BertForPreTraining as HFBertForPreTraining
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    meta = read_meta(data)
    vocab_dir = meta["vocab_dir"]
    tokenizer = BertTokenizer.from_pretrained(vocab_dir)
    vocab_size = int(meta["vocab_size"])
    warmup = steps // 100 if warmup is None else warmup

    torch.manual_seed(seed)
    ours = BertForPreTraining(BertConfig.preset(preset, vocab_size=vocab_size))
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = HFBertForPreTraining.from_pretrained(tmp, attn_implementation="sdpa")
    objective = PretrainingObjective(ours)
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

    sides = {"bertlab": ours, "transformers": hf}
    opts = {name: _optimizer(model, lr, warmup, steps) for name, model in sides.items()}
    log: dict[str, dict[str, list]] = {n: {"step": [], "loss": [], "tokens": []} for n in sides}
    evals: dict[str, list[dict]] = {n: [] for n in sides}
    seconds = dict.fromkeys(sides, 0.0)
    for model in sides.values():
        model.train()

    def step_ours(step: int) -> tuple[float, int]:
        batch = ours_data(step, 0)
        loss, m = objective(**batch)
        loss.backward()
        return float(m["loss"]), int(batch["attention_mask"].sum())

    def step_hf(step: int) -> tuple[float, int]:
        batch = hf_batch(step)
        out = hf(**batch)
        out.loss.backward()
        return float(out.loss.detach()), int(batch["attention_mask"].sum())

    run = {"bertlab": step_ours, "transformers": step_hf}
    started = time.perf_counter()
    for first in range(0, steps, segment):
        for name in sides:
            model, (opt, sched) = sides[name], opts[name]
            for step in range(first, min(steps, first + segment)):
                t0 = time.perf_counter()
                loss, tokens = run[name](step)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                seconds[name] += time.perf_counter() - t0
                for key, value in (("step", step + 1), ("loss", loss), ("tokens", tokens)):
                    log[name][key].append(value)
                if (step + 1) % eval_every == 0 or step + 1 == steps:
                    if name == "bertlab":
                        ours.eval()
                        result = evaluate(objective, batches)
                        ours.train()
                    else:
                        result = _evaluate_hf(hf, batches)
                    evals[name].append({"step": step + 1, **result})
        if progress:
            done = min(steps, first + segment)
            print(
                f"\rbench pretrain: step {done}/{steps}, bertlab {seconds['bertlab']:.0f}s, "
                f"transformers {seconds['transformers']:.0f}s, "
                f"{time.perf_counter() - started:.0f}s in all",
                end="",
                flush=True,
            )
    if progress:
        print()
    tokens = sum(log["bertlab"]["tokens"])
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
            "data": str(data),
            "long_data": str(long_data) if long_data else None,
            "eval_data": str(eval_data),
            "eval_examples": eval_examples,
            "threads": torch.get_num_threads(),
        },
        "seconds": seconds,
        "tokens_per_s": {n: sum(log[n]["tokens"]) / seconds[n] for n in sides},
        "seconds_per_step": {n: seconds[n] / steps for n in sides},
        "speedup": seconds["transformers"] / seconds["bertlab"],
        "real_tokens": tokens,
        "eval": evals,
        "final": {n: evals[n][-1] for n in sides},
        "train_loss": {n: log[n]["loss"] for n in sides},
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

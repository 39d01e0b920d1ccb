"""``bertlab bench precision {classify,tag,qa}``: a fine-tuned model's dev figures in float32,
bfloat16 and int8.

The embedding cosine of ``bench runtimes`` says how far a precision moves the vectors; this says
whether the task notices. One fine-tuned model folder (``bertlab finetune``'s output) is
evaluated on one dev file by the task's own ``evaluate`` (the figures ``finetune`` reports), once
per precision:

* float32: the model as saved;
* bfloat16: ``model.to(torch.bfloat16)``, refused by name where the CPU has no bfloat16 kernels;
* int8: ``quantize_int8`` calibrated on the first ``CALIBRATION`` features of the *training*
  file (never the dev file it is scored on), with its report of the layers kept in float32.

The training file is read for the task's labels too: they must be the model's own, in its order.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bertlab.data.batch import pad
from bertlab.nn.precision import CALIBRATION, bf16_supported, int8_supported, quantize_int8
from bertlab.tokenizer import BertTokenizer
from bertlab.train.finetune import TASKS, FinetuneConfig

PRECISIONS = ("float32", "bfloat16", "int8")


def _check_labels(model: torch.nn.Module, task: Any) -> None:
    names = getattr(task, "label_names", None)
    if not names:
        return
    have = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    if have != list(names):
        raise ValueError(
            f"the model's labels {have} are not the training file's {list(names)} in that order: "
            "evaluate the model with the file it was fine-tuned on"
        )


def bench_precision(
    config: FinetuneConfig,
    precisions: tuple[str, ...] = PRECISIONS,
    tolerance: float = 0.05,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate ``config.model`` (a fine-tuned folder) on ``config.dev`` in each precision.

    Returns {task, model, dev, precisions: {name: {dev figures, seconds} or {unavailable}},
    int8_report, differences: {name: {metric: precision - float32}}}."""
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown or not precisions:
        raise ValueError(f"precisions must be among {', '.join(PRECISIONS)}; got {unknown}")
    if config.dev is None:
        raise ValueError("bench precision needs a dev file to score (--dev)")
    tokenizer = BertTokenizer.from_pretrained(config.model)
    task, train, dev, _ = TASKS[config.task].read(config, tokenizer)
    if dev is None or not dev.features:
        raise ValueError(f"{config.dev}: no dev examples to score")
    model = task.model_class.from_pretrained(config.model, dtype=torch.float32).eval()
    _check_labels(model, task)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    calibrate = [
        {k: v for k, v in pad(train.features[i : i + 32]).items() if k in keys}
        for i in range(0, min(CALIBRATION, len(train.features)), 32)
    ]
    out: dict[str, Any] = {
        "task": config.task,
        "model": str(config.model),
        "dev": str(config.dev),
        "dev_examples": len(dev.features),
        "calibration_features": min(CALIBRATION, len(train.features)),
        "precisions": {},
    }
    for name in precisions:
        why = {"bfloat16": bf16_supported, "int8": int8_supported}.get(name, lambda: None)()
        if why is not None:
            out["precisions"][name] = {"unavailable": why}
            continue
        if name == "bfloat16":
            m = task.model_class.from_pretrained(config.model, dtype=torch.bfloat16).eval()
        elif name == "int8":
            m = quantize_int8(model, calibrate=calibrate, tolerance=tolerance)
            keys = ("kept_float32", "smoothed", "scheme")
            out["int8_report"] = {k: m.int8_report[k] for k in keys}
            out["int8_report"]["int8_layers"] = len(m.int8_report["int8"])
        else:
            m = model
        if progress:
            print(f"evaluating {name} on {len(dev.features)} dev examples", flush=True)
        start = time.perf_counter()
        figures = task.evaluate(m, dev)
        out["precisions"][name] = {**figures, "seconds": time.perf_counter() - start}
    base = out["precisions"].get("float32")
    if base is not None:
        out["differences"] = {
            name: {k: r[k] - base[k] for k in base if k != "seconds"}
            for name, r in out["precisions"].items()
            if name != "float32" and "unavailable" not in r
        }
    return out


def format_precision(r: dict[str, Any]) -> str:
    """The report as a table: one row per precision, its dev figures and seconds."""
    rows = r["precisions"]
    ran = [v for v in rows.values() if "unavailable" not in v]
    metrics = [k for k in ran[0] if k != "seconds"] if ran else []
    lines = [f"{r['task']} on {r['dev']} ({r['dev_examples']} examples), model {r['model']}"]
    lines.append(f"{'precision':<10}" + "".join(f"{m:>12}" for m in metrics) + f"{'seconds':>10}")
    for name, v in rows.items():
        if "unavailable" in v:
            lines.append(f"{name:<10}  not run: {v['unavailable']}")
            continue
        cells = "".join(f"{100 * v[m]:>12.2f}" for m in metrics)
        lines.append(f"{name:<10}{cells}{v['seconds']:>10.1f}")
    kept = r.get("int8_report", {}).get("kept_float32")
    if kept is not None:
        lines.append(
            f"int8: {len(kept)} linear layers kept in float32"
            + (f": {kept}" if kept else "")
            + f", {len(r['int8_report'].get('smoothed', {}))} smoothed"
        )
    lines.append("(figures in points: x100)")
    return "\n".join(lines)

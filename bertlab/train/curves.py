"""``bertlab plot RUN_DIR``: a run's metrics.jsonl -> loss and accuracy curves in one PNG.

Any run of ``bertlab.train.loop`` (pre-training or fine-tuning) writes one JSON line per step. The
left panel shows every metric named ``*loss*``, the right one every other score (accuracy, F1,
...); training values are drawn as lines smoothed over a window, evaluation values
(``eval_*``) as points joined by a line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SKIP = {"step", "lr", "tokens_per_s", "train_seconds", "planned_steps", "stopped_by_time"}


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}: not a bertlab run folder")
    rows = []
    for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not JSON ({e.msg})") from None
    if not rows:
        raise ValueError(f"{path} holds no steps yet")
    return rows


def smooth(values: list[float], window: int) -> list[float]:
    """The running mean over the last ``window`` values (fewer at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_run(run_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Draw the curves of ``run_dir`` to ``output`` (default RUN_DIR/curves.png); returns it."""
    rows = read_metrics(run_dir)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("plotting needs matplotlib: pip install 'bertlab[plot]'") from e
    keys = sorted({k for r in rows for k in r if k not in SKIP and isinstance(r[k], (int, float))})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    window = max(1, len(rows) // 50)
    for ax, wanted in zip(axes, (True, False), strict=True):
        for key in (k for k in keys if ("loss" in k) == wanted):
            points = [(r["step"], r[key]) for r in rows if key in r]
            steps, values = zip(*points, strict=True)
            if key.startswith("eval_"):
                ax.plot(steps, values, "o-", markersize=3, label=key)
            else:
                ax.plot(steps, smooth(list(values), window), linewidth=1, label=key)
        ax.set_xlabel("step")
        ax.set_title("loss" if wanted else "scores")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{Path(run_dir).resolve().name}: {rows[-1]['step']} steps", fontsize=10)
    fig.tight_layout()
    path = Path(output) if output else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

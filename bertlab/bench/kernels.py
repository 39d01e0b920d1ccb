"""``bertlab bench kernels``: which float32 kernel runs the model fastest on this CPU, measured
here, and (``--save``) kept as this CPU's choice.

bertlab's policy (bertlab.nn.cpu) picks the kernel of float32 products from the CPU's class:
bertlab's own (``sgemm-avx512``, ``sgemm-avx2``) where it was measured faster than oneDNN's,
oneDNN's elsewhere, including the classes no project machine belongs to (Intel's AVX2 and
AVX-512 CPUs, Zen 5). This command times the whole model on each kernel the CPU can run, on the
workloads and runner of ``bertlab bench runtimes`` (sentence embeddings of the bundled SST-2
sample, or CoNLL-2003 news from ``--data``; one sentence at a time, and sorted batches of 32),
in alternating rounds, each paired round by round with the class's kernel. A kernel other than
the class's is chosen only where it is at least MARGIN faster, the geometric mean of its paired
medians over the workloads, and no workload slower than FLOOR: on a machine whose speed drifts,
a close call keeps the class's choice.

Saved (``save``), the choice goes to ``cpu.measured_path()``: a file for this CPU as the
libraries see it and this PyTorch, which the policy of every later bertlab process on this
CPU reads (``BERTLAB_FLOAT32_KERNEL`` still forces a kernel over it; deleting the file returns
to the class's choice). The kernels give the same results up to float32 rounding (about 1e-6
relative), so the choice changes speed only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bertlab.bench.runtimes import batches, bertlab_runner, runtime_texts
from bertlab.bench.speed import alternate, machine

WORKLOADS = ("batch-1", "sorted")
MARGIN = 1.05  # a kernel other than the class's must be this much faster (geometric mean)
FLOOR = 0.97  # and no workload may be slower than this


def why_not(kernel: str) -> str | None:
    """Why ``kernel`` cannot run float32 products in this process, or None."""
    from bertlab.nn import avx2, cpu

    f = cpu.features()
    if kernel == "onednn":
        return None
    flags, name = cpu.FLOAT32_NEEDS[kernel]
    if not flags <= f.flags:
        return f"needs {name}, which this CPU does not have"
    return None if (why := avx2.load()) is None else f"cannot be built here: {why}"


def bench_kernels(
    model_dir: str | os.PathLike = "default",
    data_dir: str | os.PathLike | None = None,
    workloads: tuple[str, ...] = WORKLOADS,
    repeats: int = 5,
    threads: int | None = None,
    texts: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every float32 kernel this CPU runs, the whole model timed on each workload; the paired
    ratios to the class's kernel and the choice (``choose``). ``texts`` replaces the sentences
    (tests use a few)."""
    from bertlab.files import resolve_model_dir
    from bertlab.nn import cpu
    from bertlab.tokenizer import BertTokenizer

    bad = [w for w in workloads if w not in WORKLOADS]
    if bad or not workloads:
        raise ValueError(
            f"unknown workload {bad[0] if bad else '(none)'!r}; choose from {', '.join(WORKLOADS)}"
        )
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    policy = cpu.current()
    if policy.float32_kernel is None:
        raise ValueError(
            f"there is no float32 kernel to choose on this CPU: {policy.float32_kernel_why}"
        )
    f = policy.features
    default, _ = cpu.class_float32_kernel(f, policy.cpu_class)
    kernels, left_out = [], {}
    for kernel in cpu.FLOAT32_KERNELS:
        if (why := why_not(kernel)) is None:
            kernels.append(kernel)
        else:
            left_out[kernel] = why
    model_dir = resolve_model_dir(model_dir)
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    origin = "given texts"
    if texts is None:
        texts, origin = runtime_texts(data_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    run = bertlab_runner(model_dir, "fp32")
    report: dict[str, Any] = {
        "benchmark": "kernels",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": policy.describe(),
        "key": cpu.machine_key(f),
        "torch": torch.__version__,
        "model": str(model_dir),
        "texts": origin,
        "threads": threads,
        "repeats": repeats,
        "class_kernel": default,
        "kernels": kernels,
        "left_out": left_out,
        "workloads": {},
    }
    on = {k: dataclasses.replace(policy, float32_kernel=k) for k in kernels}
    for workload in workloads:
        progress(f"{workload}: timing {len(kernels)} kernels")
        data = batches(tokenizer, texts, workload)
        tokens = int(sum(b["attention_mask"].sum() for b in data))

        def timed(kernel: str, data: list = data) -> None:
            with cpu.using(on[kernel]), torch.inference_mode():
                for b in data:
                    run(b)

        times = alternate({k: (lambda k=k: timed(k)) for k in kernels}, repeats)
        report["workloads"][workload] = {
            "real_tokens": tokens,
            "kernels": {
                k: {
                    "tokens_per_s": tokens / statistics.median(times[k]),
                    # the class's kernel's time over this one's, round by round (> 1: faster)
                    "paired": statistics.median(
                        d / t for d, t in zip(times[default], times[k], strict=True)
                    ),
                    "round_seconds": times[k],
                }
                for k in kernels
            },
        }
    report["choice"], report["why"] = choose(report)
    return report


def choose(report: dict[str, Any]) -> tuple[str, str]:
    """(kernel, why) from a report's paired ratios: the class's kernel, unless another is at
    least MARGIN faster in the geometric mean over the workloads and no slower than FLOOR on
    any (module docstring)."""
    default, best, score = report["class_kernel"], None, MARGIN
    for kernel in report["kernels"]:
        ratios = [w["kernels"][kernel]["paired"] for w in report["workloads"].values()]
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        if kernel != default and mean >= score and min(ratios) >= FLOOR:
            best, score = kernel, mean
    if best is None:
        return default, (
            f"the class's kernel: no other was {MARGIN:.2f}x as fast on every workload together "
            f"without being slower than {FLOOR:.2f}x on one"
        )
    return best, f"{score:.2f}x the class's kernel ({default}), geometric mean over the workloads"


def save(report: dict[str, Any]) -> str:
    """Write the report's choice where the policy of later processes on this CPU reads it
    (``cpu.measured_path``), whole or not at all; returns the path."""
    from bertlab.nn import cpu

    f = cpu.features()
    if report["key"] != cpu.machine_key(f):
        raise ValueError("the report was measured on another CPU or PyTorch; it is not saved")
    path = cpu.measured_path(f)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "key": report["key"],
        "float32_kernel": report["choice"],
        "why": report["why"],
        "class_kernel": report["class_kernel"],
        "date": report["date"],
        "cpu": {k: report["cpu"][k] for k in ("model", "arch", "flags", "limits", "class")},
        "torch": report["torch"],
        "threads": report["threads"],
        "measured": {
            w: {k: round(v["paired"], 4) for k, v in r["kernels"].items()}
            for w, r in report["workloads"].items()
        },
    }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", "utf-8")
    os.replace(tmp, path)
    return str(path)


def table(report: dict[str, Any]) -> str:
    """The report as a Markdown table: each kernel's real tokens/s per workload, and its paired
    ratio to the class's kernel."""
    names = list(report["workloads"])
    head = "| kernel | " + " | ".join(f"{w}: tokens/s (vs the class's)" for w in names) + " |"
    lines = [head, "| --- |" + " --- |" * len(names)]
    for kernel in report["kernels"]:
        cells = []
        for w in names:
            row = report["workloads"][w]["kernels"][kernel]
            cells.append(f"{row['tokens_per_s']:,.0f} ({row['paired']:.2f}x)")
        label = f"{kernel} (the class's)" if kernel == report["class_kernel"] else kernel
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

"""``bertlab bench kernels``: which kernel runs the model fastest on this CPU, in float32 and in
int8, measured here, and (``--save``) kept as this CPU's choice.

bertlab's policy (bertlab.nn.cpu) picks the kernel of float32 and of int8 products from the
CPU's class: bertlab's own (``sgemm-avx512``, ``sgemm-avx2``; ``u8-vnni``, ``u8-avx2``) where
they were measured faster, oneDNN's, fbgemm's or PyTorch's elsewhere, including on the classes
no project machine belongs to (Intel's AVX2 and AVX-512 CPUs, Zen 5), chosen there without a
measurement. This command times the whole model on each kernel the CPU can run, on the
workloads and runner of ``bertlab bench runtimes`` (sentence embeddings of the bundled SST-2
sample, or CoNLL-2003 news from ``--data``; one sentence at a time, and sorted batches of 32),
in alternating rounds, each paired round by round with the class's kernel. int8 kernels compete
only with those that round the activations to as many levels as the class's (8 or 7 bits),
whose numbers differ from its only where an activation rounds the other way; the float32
kernels differ by float rounding (about 1e-6 relative). A kernel other than the class's is
chosen only where it is at least MARGIN faster, the geometric mean of its paired medians over
the workloads, no workload slower than FLOOR, and faster in at least WINS of each workload's
rounds: on a machine whose speed drifts, a close call keeps the class's. Each kernel's
embeddings are compared with the float32 model's too (the mean cosine of the texts): one
further from them than the class kernel's by more than DROP is not chosen. A choice is saved
from SAVE_ROUNDS rounds up.

Saved (``save``), the choices go to ``bertlab.nn.measured.measured_path()``: a file for this
CPU as the libraries see it and this PyTorch, which the policy of every later bertlab process
on this CPU reads (``BERTLAB_FLOAT32_KERNEL`` and ``BERTLAB_INT8_KERNEL`` still force a kernel
over it; deleting the file returns to the class's choices).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bertlab.bench.runtimes import batches, bertlab_runner, quality, runtime_texts
from bertlab.bench.speed import alternate, machine

WORKLOADS = ("batch-1", "sorted")
PRECISIONS = ("float32", "int8")
MARGIN = 1.05  # a kernel other than the class's must be this much faster (geometric mean),
FLOOR = 0.97  # no workload slower than this,
WINS = 0.75  # and faster than it in this share of the rounds of every workload,
DROP = 0.0005  # and its embeddings' mean cosine to float32's at most this below the class's
SAVE_ROUNDS = 5  # the fewest rounds whose choice is saved
FORCE = {"float32": "BERTLAB_FLOAT32_KERNEL", "int8": "BERTLAB_INT8_KERNEL"}


def candidates(precision: str) -> tuple[str | None, dict[str, Any], dict[str, str]]:
    """(the class's kernel, the policy with each other kernel this CPU runs in ``precision``
    forced, by kernel, and why each remaining kernel is left out). The class's kernel is None
    where that precision has no kernel to choose here (the reason under its own name)."""
    from bertlab.nn import avx2, cpu

    f = cpu.features()
    environ = {k: v for k, v in os.environ.items() if k not in FORCE.values()}
    own = cpu.policy(f, environ, measured=False)  # the class's own choices
    default = own.float32_kernel if precision == "float32" else own.int8_kernel
    if default is None:
        why = own.float32_kernel_why if precision == "float32" else own.int8_why
        return None, {}, {precision: str(why)}
    names = cpu.FLOAT32_KERNELS if precision == "float32" else cpu.INT8_KERNELS
    runs, left_out = {}, {}
    for kernel in names:
        try:
            forced = cpu.policy(f, {**environ, FORCE[precision]: kernel}, measured=False)
        except ValueError as e:  # (a float32 kernel this CPU lacks, refused by name)
            left_out[kernel] = str(e).split(": ", 1)[-1]
            continue
        if precision == "int8" and forced.int8_kernel is None:
            left_out[kernel] = str(forced.int8_why).split(": ", 1)[-1]
        elif precision == "int8" and forced.int8_levels != own.int8_levels:
            left_out[kernel] = (
                f"rounds the activations to {forced.int8_levels} levels, the class's "
                f"{default} to {own.int8_levels}: other numbers, not only another speed"
            )
        elif kernel in (*cpu.OWN_FLOAT32, *cpu.OWN_INT8) and (why := avx2.load()) is not None:
            left_out[kernel] = f"cannot be built here: {why}"
        else:
            runs[kernel] = forced
    return default, runs, left_out


def bench_kernels(
    model_dir: str | os.PathLike = "default",
    data_dir: str | os.PathLike | None = None,
    precisions: tuple[str, ...] = PRECISIONS,
    workloads: tuple[str, ...] = WORKLOADS,
    repeats: int = 5,
    threads: int | None = None,
    texts: list[str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every kernel this CPU runs in each precision, the whole model timed on each workload;
    the paired ratios to the class's kernel and the choice (``choose``). ``texts`` replaces
    the sentences (tests use a few)."""
    from bertlab.files import resolve_model_dir
    from bertlab.nn import cpu, measured
    from bertlab.tokenizer import BertTokenizer

    for name, given, known in (("workload", workloads, WORKLOADS),
                               ("precision", precisions, PRECISIONS)):  # fmt: skip
        bad = [x for x in given if x not in known]
        if bad or not given:
            raise ValueError(
                f"unknown {name} {bad[0] if bad else '(none)'!r}; choose from {', '.join(known)}"
            )
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    found = {p: candidates(p) for p in precisions}
    if all(default is None for default, _, _ in found.values()):
        reasons = "; ".join(next(iter(why.values())) for _, _, why in found.values())
        raise ValueError(f"there is no kernel to choose on this CPU: {reasons}")
    model_dir = resolve_model_dir(model_dir)
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    origin = "given texts"
    if texts is None:
        texts, origin = runtime_texts(data_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    f = cpu.features()
    report: dict[str, Any] = {
        "benchmark": "kernels",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu.current().describe(),
        "key": measured.machine_key(f),
        "torch": torch.__version__,
        "model": str(model_dir),
        "texts": origin,
        "threads": threads,
        "repeats": repeats,
        "precisions": {},
    }
    data = {w: batches(tokenizer, texts, w) for w in workloads}
    reference = bertlab_runner(model_dir, "fp32")  # (the embeddings every kernel is held to)
    float32 = {w: np.concatenate([reference(b) for b in batch]) for w, batch in data.items()}
    for precision, (default, policies, left_out) in found.items():
        entry: dict[str, Any] = {"class_kernel": default, "kernels": list(policies),
                                 "left_out": left_out, "workloads": {}}  # fmt: skip
        report["precisions"][precision] = entry
        if default is None:
            continue
        # one model for every kernel (int8: quantized and calibrated on the class's kernel; the
        # kernels compared round to the same levels), its weights packed for each kernel at its
        # first run and kept (products.py, precision.py); float32's is the reference's
        progress(f"{precision}: loading the model")
        run = reference if precision == "float32" else bertlab_runner(model_dir, "int8")
        for workload, batch in data.items():
            progress(f"{precision}, {workload}: timing {len(policies)} kernels")
            runs = {k: (lambda r=run, p=p, b=batch: embed(r, p, b)) for k, p in policies.items()}
            times = alternate(runs, repeats)
            tokens = int(sum(b["attention_mask"].sum() for b in batch))
            embedded = {k: embed(run, p, batch) for k, p in policies.items()}
            entry["workloads"][workload] = {
                "real_tokens": tokens,
                "kernels": {
                    k: {
                        "tokens_per_s": tokens / statistics.median(times[k]),
                        # the class's kernel's time over this one's, round by round (> 1: faster)
                        "paired": statistics.median(
                            d / t for d, t in zip(times[default], times[k], strict=True)
                        ),
                        # the share of rounds in which it was faster than the class's kernel
                        "wins": statistics.fmean(
                            t < d for d, t in zip(times[default], times[k], strict=True)
                        ),
                        "round_seconds": times[k],
                        # the texts' embeddings against the float32 model's
                        "cosine_to_float32": quality(float32[workload], embedded[k])["cosine_mean"],
                    }
                    for k in policies
                },
            }
        entry["choice"], entry["why"] = choose(entry)
    return report


def embed(run: Callable, policy: Any, batch: list) -> np.ndarray:
    """The texts of ``batch`` embedded by ``run`` with ``policy`` as the process's policy."""
    from bertlab.nn import cpu

    with cpu.using(policy):
        return np.concatenate([run(b) for b in batch])


def choose(entry: dict[str, Any]) -> tuple[str, str]:
    """(kernel, why) from one precision's paired ratios: the class's kernel, unless another is
    at least MARGIN faster in the geometric mean over the workloads, no slower than FLOOR on
    any, faster in WINS of each one's rounds, and no further than DROP below the class
    kernel's cosine to float32 (module docstring)."""
    default, best, score = entry["class_kernel"], None, MARGIN
    kept = [w["kernels"][default]["cosine_to_float32"] for w in entry["workloads"].values()]
    for kernel in entry["kernels"]:
        rows = [w["kernels"][kernel] for w in entry["workloads"].values()]
        ratios = [row["paired"] for row in rows]
        mean = math.exp(statistics.fmean(math.log(r) for r in ratios))
        steady = all(
            row["wins"] >= WINS and row["cosine_to_float32"] >= base - DROP
            for row, base in zip(rows, kept, strict=True)
        )
        if kernel != default and mean >= score and min(ratios) >= FLOOR and steady:
            best, score = kernel, mean
    if best is None:
        return default, (
            f"the class's kernel: no other was {MARGIN:.2f}x as fast over the workloads, no "
            f"slower than {FLOOR:.2f}x on one and faster in {WINS:.0%} of each one's rounds, "
            f"with embeddings as close to float32's (within {DROP} in mean cosine)"
        )
    return best, f"{score:.2f}x the class's kernel ({default}), geometric mean over the workloads"


def can_save(repeats: int) -> None:
    """Refuse, before anything is timed, to save a choice of fewer than SAVE_ROUNDS rounds, or
    into a folder that cannot be written (ValueError naming it and the variable that moves
    it)."""
    from bertlab.nn import measured

    if repeats < SAVE_ROUNDS:
        raise ValueError(
            f"--save needs at least {SAVE_ROUNDS} rounds (--repeats), got {repeats}: fewer "
            "leave the choice to the machine's drift"
        )
    folder = measured.measured_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        ok = os.access(folder, os.W_OK)
    except OSError as e:
        ok, why = False, str(e)
    else:
        why = "not writable"
    if not ok:
        raise ValueError(
            f"--save: the choices cannot be kept in {folder} ({why}); set "
            f"{measured.MEASURED_DIR} to a folder this user can write"
        )


def save(report: dict[str, Any]) -> str:
    """Write the report's choices where the policy of later processes on this CPU reads them
    (``bertlab.nn.measured.measured_path``), whole or not at all; returns the path."""
    from bertlab.nn import cpu, measured

    can_save(report["repeats"])
    f = cpu.features()
    if report["key"] != measured.machine_key(f):
        raise ValueError("the report was measured on another CPU or PyTorch; it is not saved")
    path = measured.measured_path(f)
    record: dict[str, Any] = {
        "key": report["key"],
        "date": report["date"],
        "cpu": {k: report["cpu"][k] for k in ("model", "arch", "flags", "limits", "class")},
        "torch": report["torch"],
        "threads": report["threads"],
    }
    for precision, entry in report["precisions"].items():
        if "choice" not in entry:
            continue
        record[precision] = {
            "kernel": entry["choice"],
            "why": entry["why"],
            "class_kernel": entry["class_kernel"],
            "paired": {
                w: {k: round(v["paired"], 4) for k, v in r["kernels"].items()}
                for w, r in entry["workloads"].items()
            },
        }
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", "utf-8")
    os.replace(tmp, path)
    return str(path)


def table(entry: dict[str, Any]) -> str:
    """One precision of a report as a Markdown table: each kernel's real tokens/s per workload,
    its paired ratio to the class's kernel and its texts' mean embedding cosine to float32's."""
    names = list(entry["workloads"])
    head = (
        "| kernel | "
        + " | ".join(f"{w}: tokens/s (vs the class's, cosine to float32)" for w in names)
        + " |"
    )
    lines = [head, "| --- |" + " --- |" * len(names)]
    for kernel in entry["kernels"]:
        cells = []
        for w in names:
            row = entry["workloads"][w]["kernels"][kernel]
            cells.append(
                f"{row['tokens_per_s']:,.0f} ({row['paired']:.2f}x, {row['cosine_to_float32']:.5f})"
            )
        label = f"{kernel} (the class's)" if kernel == entry["class_kernel"] else kernel
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

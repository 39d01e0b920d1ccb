"""What the paired harnesses share (few_rows.py, float32_kernels.py, int8_rows.py, int8_kernels.py):
their arguments, checked before any work, their set-up, a policy swapped in while one system
runs, and the timed rounds of each workload with their printout. Imported by those scripts from
this folder (a script's own folder is on Python's path when it runs)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertlab.bench import runtimes
from bertlab.bench.speed import alternate, machine
from bertlab.files import resolve_model_dir
from bertlab.nn import cpu
from bertlab.tokenizer import BertTokenizer


def arguments(
    doc: str, argv: list[str] | None
) -> tuple[argparse.ArgumentParser, argparse.Namespace, list[str]]:
    """The parser (for the scripts' own checks), --data, --workloads, --threads and --rounds,
    and the workloads named; exits (2) naming the bad value before any work."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data", default=None, help="folder with conll2003/ (as bench runtimes)")
    p.add_argument("--workloads", default="batch-1,sorted")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - set(runtimes.WORKLOADS):
        p.error(f"--workloads must name some of {', '.join(runtimes.WORKLOADS)}, got {workloads}")
    if args.rounds < 1 or args.threads < 1:
        p.error(f"--rounds and --threads must be at least 1, got {args.rounds}, {args.threads}")
    return p, args, workloads


def setup(args: argparse.Namespace) -> tuple[Path, Any, list[str], str]:
    """Set --threads, and give the bundled model's folder, its tokenizer, and ``bench
    runtimes``' sentences with where they came from (--data)."""
    torch.set_num_threads(args.threads)
    model = resolve_model_dir("default")
    texts, source = runtimes.runtime_texts(args.data)
    return model, BertTokenizer.from_pretrained(model), texts, source


def header(args: argparse.Namespace, what: str, source: str) -> None:
    """The run's first line: CPU, threads, torch, CPU class, what the script compares (``what``),
    the sentences' source and the rounds."""
    m = machine()
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}, class "
          f"{cpu.current().cpu_class}, {what}; {source}; "
          f"{args.rounds} alternating rounds")  # fmt: skip


def under(policy: cpu.Policy, run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` with ``policy`` as the process's policy (``cpu.current()``) while it runs."""

    def timed() -> Any:
        with cpu.using(policy):
            return run()

    return timed


def compare(
    tokenizer: Any,
    texts: list[str],
    workloads: list[str],
    rounds: int,
    runs: Callable[[list[dict]], dict[str, Callable[[], Any]]],
    peer: str,
    pairs: list[tuple[str, str]],
) -> None:
    """Each workload's batches, the timed runs ``runs`` makes of them alternating for
    ``rounds`` rounds (inference mode), then ``report``."""
    for name in workloads:
        batches, tokens = workload(tokenizer, texts, name)
        with torch.inference_mode():
            seconds = alternate(runs(batches), rounds)
        report(name, len(batches), tokens, seconds, peer, pairs)


def workload(tokenizer: Any, texts: list[str], name: str) -> tuple[list[dict], int]:
    """The workload's batches, as ``bertlab bench runtimes`` makes them, and their real tokens."""
    batches = runtimes.batches(tokenizer, texts, name)
    return batches, sum(int(b["attention_mask"].sum()) for b in batches)


def each(runner: Callable[[dict], Any], batches: list[dict]) -> Callable[[], list]:
    """One timed run: ``runner`` on every batch."""
    return lambda: [runner(b) for b in batches]


def report(
    workload: str,
    batches: int,
    tokens: int,
    seconds: dict[str, list[float]],
    peer: str,
    pairs: list[tuple[str, str]],
) -> None:
    """Each system's median tokens/s and its median ratio to ``peer`` over the rounds, then for
    each (a, b) of ``pairs`` the median of a's time over b's, round by round."""
    print(f"{workload}: {batches} batches, {tokens} real tokens")
    base = seconds[peer]
    for name, t in seconds.items():
        ratio = statistics.median(b / a for a, b in zip(t, base, strict=True))
        print(f"  {name:15} {tokens / statistics.median(t):8.0f} tokens/s   {ratio:.2f}x {peer}")
    for a, b in pairs:
        times = [x / y for x, y in zip(seconds[a], seconds[b], strict=True)]
        print(f"  {a}'s time over {b}'s: median {statistics.median(times):.3f} over the rounds "
              f"(lowest {min(times):.2f}, highest {max(times):.2f})")  # fmt: skip

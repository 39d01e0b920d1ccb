"""``bertlab bench <what>``: bertlab side by side with transformers, one subcommand per
measurement, each with its own options.

bertlab bench speed [WORKLOAD ...]     the suite: tokenizer, int8 and the network's workloads
bertlab bench tokenizer                batch tokenization throughput
bertlab bench int8                     int8 dynamic quantisation: speed and accuracy cost
bertlab bench memory                   what gradient checkpointing saves in a training step
bertlab bench runtimes                 bertlab against ONNX Runtime, OpenVINO and transformers
bertlab bench kernels [--save]         the fastest kernels on this CPU (kept with --save)
bertlab bench pretrain                 one pre-training run on each side
bertlab bench finetune TASK            one fine-tuning run on each side, same time budget
bertlab bench precision TASK           a fine-tuned model's dev figures in float32, bf16, int8
bertlab bench serve                    bertlab's HTTP server under load

``bertlab bench [WORKLOAD ...] [options]`` with no subcommand is ``bertlab bench speed``. Each
command parses, calls one function of ``bertlab.bench`` and prints; Ctrl-C during ``speed``
writes the report of what was measured, marked ``"interrupted": true``, and exits 130. A package
a command needs (transformers, matplotlib for ``--plot``, httpx ...) is checked before its work
starts, and a missing one is named with the extra that installs it.

The other HTTP servers (FastAPI + sentence-transformers, Infinity) are compared with bertlab's by
the benchmarks' harness in bertlab's repository, ``benchmarks/harness/serve_peers.py``, which
takes the options of ``bertlab bench serve`` (``add_serve_options``) and runs
``cmd_bench_serve`` with its peers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertlab.extras import require
from bertlab.files import BUNDLED_NAMES

SUBCOMMANDS = (
    "speed",
    "tokenizer",
    "int8",
    "memory",
    "runtimes",
    "kernels",
    "pretrain",
    "finetune",
    "precision",
    "serve",
)
DEFAULT = "speed"  # what `bertlab bench` runs when no subcommand is named
INTERRUPTED = 130  # the exit status of a run stopped by Ctrl-C (128 + SIGINT)


# ============================================================================ printing
HEADER = (
    f"{'model':<9}{'workload':<10}{'dtype':<10}{'bertlab tok/s':>14}{'hf tok/s':>11}"
    f"{'ratio':>8}{'peak MB b/hf':>15}{'useful/matmul b/hf':>20}"
)


def format_tokenizer(r: dict[str, Any]) -> str:
    tps = r["tokens_per_s"]
    return (
        f"tokenizer  {r['texts']:,} texts ({r['data']})\n"
        f"  bertlab {tps['bertlab']:,.0f} tokens/s, transformers "
        f"{tps['transformers']:,.0f} tokens/s: {r['ratio']:.2f}x"
    )


def format_int8(r: dict[str, Any]) -> str:
    if "unavailable" in r:
        return f"int8: not measured, it does not run on this CPU: {r['unavailable']}"
    return (
        f"int8 ({r['model']}, {r['texts']} texts): {r['speedup_over_float32']:.2f}x float32's "
        f"speed; embeddings' cosine to float32 mean {r['cosine_to_float32']['mean']:.3f} "
        f"(min {r['cosine_to_float32']['min']:.3f}); nearest neighbour kept "
        f"{r['nearest_neighbour_agreement']:.0%}"
    )


def format_row(r: dict[str, Any]) -> str:
    t, p, u = r["tokens_per_s"], r["peak_memory_mb"], r["useful_share_of_matmul"]
    return (
        f"{r['model']:<9}{r['workload']:<10}{r['dtype']:<10}{t['bertlab']:>14,.0f}"
        f"{t['transformers']:>11,.0f}{r['ratio']:>7.2f}x"
        f"{p['bertlab']:>8.0f}/{p['transformers']:<6.0f}"
        f"{u['bertlab']:>12.0%}/{u['transformers']:.0%}"
    )


def _printer() -> Callable[[str, dict[str, Any]], None]:
    """Prints each result of ``run_suite`` as it comes; the table header before the first row."""
    rows = 0

    def show(kind: str, r: dict[str, Any]) -> None:
        nonlocal rows
        if kind == "model":
            if not rows:
                print(HEADER)
            rows += 1
            print(format_row(r), flush=True)
        else:
            print(format_tokenizer(r) if kind == "tokenizer" else format_int8(r), flush=True)

    return show


def write_outputs(
    out: str | None, chart: str | None, report: dict, draw: Callable[[str], None] | None
) -> None:
    """The JSON report to ``out`` and the chart (``draw(path)``, if there is one) to ``chart``."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {out}")
    if chart and draw is not None:
        draw(chart)
        print(f"chart: {chart}")


def _csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def check_plot(args: argparse.Namespace, extra: str) -> None:
    """``--plot``: matplotlib draws the chart; a missing one is named before the run, not after
    it (``extra``: the command's own extra, which brings matplotlib)."""
    if getattr(args, "plot", None):
        require(["matplotlib"], extra, "--plot")


# ============================================================================ commands
def cmd_bench_speed(args: argparse.Namespace) -> int:
    from bertlab.bench.speed import plot, run_suite

    check_plot(args, "bench")
    report = run_suite(
        args.workloads,
        _csv(args.models),
        _csv(args.dtypes),
        repeats=args.repeats,
        device=args.device,
        kernel=args.kernel,
        draws=args.draws,
        threads=args.threads,
        data=args.data,
        on_result=_printer(),
    )
    return _finish(args, report, (lambda path: plot(report, path)) if report["results"] else None)


def cmd_bench_tokenizer(args: argparse.Namespace) -> int:
    from bertlab.bench.speed import run_suite

    report = run_suite(
        ["tokenizer"], [args.model], repeats=args.repeats, data=args.data, on_result=_printer()
    )
    return _finish(args, report, None)


def cmd_bench_int8(args: argparse.Namespace) -> int:
    from bertlab.bench.speed import run_suite

    report = run_suite(
        ["int8"],
        [args.model],
        repeats=args.repeats,
        threads=args.threads,
        data=args.data,
        on_result=_printer(),
    )
    return _finish(args, report, None)


def format_memory(report: dict[str, Any]) -> str:
    lines = [
        f"gradient checkpointing, {report['model']}, batch {report['batch_size']} x "
        f"{report['seq_len']}, {report['device']}",
        f"{'side':<14}{'checkpointing':<15}{'activations MB':>15}{'peak MB':>10}{'step s':>9}",
    ]
    for r in report["results"]:
        lines.append(
            f"{r['side']:<14}{'on' if r['checkpointing'] else 'off':<15}"
            f"{r['activation_mb']:>15.1f}{r['peak_mb']:>10.0f}{r['step_s']:>9.3f}"
            + (
                f"   gradients differ by at most {r['max_grad_difference']:.2e}"
                if "max_grad_difference" in r
                else ""
            )
        )
    return "\n".join(lines)


def cmd_bench_memory(args: argparse.Namespace) -> int:
    from bertlab.bench.memory import bench_checkpointing

    report = bench_checkpointing(
        args.model, args.batch_size, args.seq_len, repeats=args.repeats, device=args.device
    )
    print(format_memory(report))
    return _finish(args, report, None)


def cmd_bench_runtimes(args: argparse.Namespace) -> int:
    from bertlab.bench.runtimes import (
        SYSTEMS,
        WORKLOADS,
        bench_runtimes,
        cpu_line,
        markdown_table,
        paired_lines,
        plot,
        read_report,
        side_by_side,
    )

    if args.compare:
        if args.out or args.plot:
            raise ValueError("--compare reads saved reports and times nothing: no --out or --plot")
        reports = [(Path(path).name, read_report(path)) for path in args.compare]
        print("bertlab's real tokens/s over the fastest peer of each precision (ratio of the")
        print("medians), eager / through Compiled, and that peer; - where the report has no such")
        print("system")
        print(side_by_side(reports))
        return 0
    if args.plot and not Path(args.plot).parent.is_dir():
        raise FileNotFoundError(f"--plot {args.plot}: the folder does not exist")
    check_plot(args, "runtimes")
    report = bench_runtimes(
        args.model,
        args.data,
        systems=tuple(_csv(args.systems)) if args.systems else SYSTEMS,
        workloads=tuple(_csv(args.workloads)) if args.workloads else WORKLOADS,
        repeats=args.repeats,
        threads=args.threads,
        busy=args.busy,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    m = report["machine"]
    print(f"{m['cpu']}, {report['threads']} threads; {report['texts']}")
    print(cpu_line(report["cpu"]))
    print("real tokens/s relative to transformers float32 (mean embedding cosine to float32)")
    print(markdown_table(report))
    for line in paired_lines(report):
        print(line)
    for name, why in report["unavailable"].items():
        print(f"{name}: not run: {why}")
    return _finish(args, report, lambda path: plot(report, path))


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    from bertlab.bench.kernels import (
        FORCE,
        PRECISIONS,
        WORKLOADS,
        bench_kernels,
        can_save,
        save,
        table,
    )

    if args.save:
        can_save(args.repeats)
    report = bench_kernels(
        args.model,
        args.data,
        precisions=tuple(_csv(args.precisions)) if args.precisions else PRECISIONS,
        workloads=tuple(_csv(args.workloads)) if args.workloads else WORKLOADS,
        repeats=args.repeats,
        threads=args.threads,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    m = report["machine"]
    print(f"{m['cpu']} (class {report['cpu']['class']}), {report['threads']} threads; "
          f"{report['texts']}")  # fmt: skip
    for precision, entry in report["precisions"].items():
        if entry["class_kernel"] is None:
            print(f"{precision}: nothing to choose: {entry['left_out'][precision]}")
            continue
        print(f"{precision}: real tokens/s of the model on each kernel, and the class's kernel's")
        print("time over this one's, round by round (median)")
        print(table(entry))
        for kernel, why in entry["left_out"].items():
            print(f"{kernel}: not run: {why}")
        print(f"{precision} choice: {entry['choice']} ({entry['why']})")
    if args.save:
        path = save(report)
        chosen = ", ".join(f"{p} on {e['choice']}" for p, e in report["precisions"].items()
                           if "choice" in e)  # fmt: skip
        print(f"saved: {path}: bertlab's products on this CPU now run {chosen} (delete the "
              "file to return to the class's choices)")  # fmt: skip
    for precision, variable in FORCE.items():
        forced = os.environ.get(variable, "").strip().lower()
        if forced not in ("", "auto") and precision in report["precisions"]:
            print(f"{variable}={forced} is set: it forces its kernel over any choice")
    return _finish(args, report, None)


def _finish(args: argparse.Namespace, report: dict, draw: Callable[[str], None] | None) -> int:
    if report.get("interrupted"):
        print("interrupted: the report holds what was measured before Ctrl-C", file=sys.stderr)
    write_outputs(args.out, getattr(args, "plot", None), report, draw)
    return INTERRUPTED if report.get("interrupted") else 0


def cmd_bench_pretrain(args: argparse.Namespace) -> int:
    from bertlab.bench.pretrain import bench_pretrain, plot_pretrain
    from bertlab.bench.speed import check_counts, machine, require_transformers

    check_counts(steps=args.steps, threads=args.threads)
    require_transformers()
    check_plot(args, "bench")
    if args.threads:
        torch.set_num_threads(args.threads)
    r = bench_pretrain(
        args.corpus,
        args.eval_corpus,
        args.long_corpus,
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        long_batch_size=args.long_batch_size,
        lr=args.lr,
        warmup=args.warmup_steps,
        segment=args.segment,
        eval_every=args.eval_every,
        progress=sys.stdout.isatty(),
    )
    report = {"machine": machine(), "pretrain": r}
    print(f"{'':<14}{'s/step':>8}{'tokens/s':>10}{'MLM acc':>9}{'NSP acc':>9}")
    for side in ("bertlab", "transformers"):
        f = r["final"][side]
        print(
            f"{side:<14}{r['seconds_per_step'][side]:>8.3f}{r['tokens_per_s'][side]:>10,.0f}"
            f"{f['mlm_acc']:>9.4f}{f['nsp_acc']:>9.4f}"
        )
    print(f"bertlab is {r['speedup']:.2f}x faster per step")
    write_outputs(args.out, args.plot, report, lambda path: plot_pretrain(r, path))
    return 0


def cmd_bench_finetune(args: argparse.Namespace) -> int:
    from bertlab.bench.finetune import bench_finetune, format_report, plot_finetune
    from bertlab.bench.speed import check_counts, machine, require_transformers
    from bertlab.metrics import format_conlleval
    from bertlab.train.finetune import TASKS, FinetuneConfig

    if args.task not in TASKS:
        raise ValueError(
            f"bench finetune takes one task, one of {', '.join(TASKS)}; got {args.task or 'none'}"
        )
    if not args.train:
        raise ValueError("bench finetune needs --train (and --dev, or --dev-articles for qa)")
    option, model = ("--models", args.models) if args.models else ("--model", args.model)
    if "," in model:
        raise ValueError(f"bench finetune starts from one model; got {option} {model}")
    check_counts(threads=args.threads)
    require_transformers()
    check_plot(args, "bench")
    if args.threads:
        torch.set_num_threads(args.threads)
    config = FinetuneConfig(
        task=args.task,
        train=args.train,
        dev=args.dev,
        model=model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_length=args.max_length,
        max_train_examples=args.max_train_examples,
        seed=args.seed,
        dropout=args.dropout,
        dev_articles=args.dev_articles,
    )
    r = bench_finetune(config, args.seconds, progress=sys.stdout.isatty())
    print(format_report(r))
    if "dev_full" in r["bertlab"]:
        for side in ("bertlab", "transformers"):
            print(f"\n{side}, best model, entities on the dev set:")
            print(format_conlleval(r[side]["dev_full"]))
    report = {"machine": machine(), "finetune": r}
    write_outputs(args.out, args.plot, report, lambda path: plot_finetune(r, path))
    return 0


def cmd_bench_precision(args: argparse.Namespace) -> int:
    from bertlab.bench.precision import PRECISIONS, bench_precision, format_precision
    from bertlab.bench.speed import check_counts, machine
    from bertlab.train.finetune import TASKS, FinetuneConfig

    if args.task not in TASKS:
        raise ValueError(
            f"bench precision takes one task, one of {', '.join(TASKS)}; got {args.task or 'none'}"
        )
    if not (args.model and args.train and args.dev):
        raise ValueError(
            "bench precision needs --model (a fine-tuned folder), --train (the file it was "
            "fine-tuned on: labels and int8 calibration) and --dev (the file it is scored on)"
        )
    if not Path(args.model, "config.json").is_file():
        raise FileNotFoundError(f"--model {args.model}: no config.json there (a model folder?)")
    check_counts(threads=args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = FinetuneConfig(
        task=args.task, train=args.train, dev=args.dev, model=args.model, max_length=args.max_length
    )
    precisions = tuple(_csv(args.precisions)) if args.precisions else PRECISIONS
    r = bench_precision(config, precisions, tolerance=args.tolerance, progress=True)
    print(format_precision(r))
    from bertlab.nn import cpu

    report = {"machine": machine(), "cpu": cpu.current().describe(), "precision": r}
    return _finish(args, report, None)


def cmd_bench_serve(args: argparse.Namespace, peers: dict | None = None) -> int:
    """``bertlab bench serve``; with ``peers`` (name -> ``bertlab.bench.serve.PeerSpec``), the
    harness's comparison with other servers, on the same options."""
    from bertlab.bench.serve import (
        HARNESS,
        WORKLOADS,
        bench_serve,
        markdown_table,
        plot,
        summary_lines,
    )

    if getattr(args, "infinity_venv", None) and not peers:
        raise ValueError(
            f"--infinity-venv {args.infinity_venv}: bertlab bench serve measures bertlab's own "
            f"server; Infinity is compared with it by {HARNESS}, in bertlab's repository"
        )
    if args.plot and not Path(args.plot).parent.is_dir():
        raise FileNotFoundError(f"--plot {args.plot}: the folder does not exist")
    check_plot(args, "serve-bench")
    report = bench_serve(
        tuple(_csv(args.systems)) if args.systems is not None else None,
        tuple(_csv(args.workloads)) if args.workloads is not None else WORKLOADS,
        peers=peers,
        model=args.model,
        seconds=args.seconds,
        concurrency=args.concurrency,
        requests=args.requests,
        warmup=args.warmup,
        threads=args.threads,
        dtype=args.dtype,
        compile=args.compile,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    m = report["machine"]
    print(f"{m['cpu']}, {report['threads']} threads per server; {report['texts']}")
    if report["dtype"] != "float32":
        print(f"every server runs its model in {report['dtype']}")
    if report["bertlab_compiled"]:
        print("bertlab's server runs compiled (--compile)")
    print(markdown_table(report))
    for line in summary_lines(report):
        print(line)
    code = _finish(args, report, lambda path: plot(report, path))
    return 1 if report["failed"] else code  # a server that died is a failed run


# ============================================================================ parsers
def add_bench_parsers(sub: argparse._SubParsersAction) -> None:
    from bertlab.bench.speed import DRAWS, KERNELS, SUITE
    from bertlab.train.finetune import TASKS

    bench = sub.add_parser(
        "bench",
        help="measure bertlab against transformers",
        description="bertlab side by side with transformers. With no subcommand, "
        "`bertlab bench [WORKLOAD ...] [options]` is `bertlab bench speed ...`.",
    )
    what = bench.add_subparsers(
        dest="bench", required=True, metavar="{" + ",".join(SUBCOMMANDS) + "}"
    )

    def common(p: argparse.ArgumentParser, plot: bool = True) -> None:
        p.add_argument("--out", help="write the JSON report here")
        if plot:
            p.add_argument("--plot", help="write the chart here (PNG)")

    def model_and_news(p: argparse.ArgumentParser) -> None:
        """The model and sentences of the runtimes' workloads (bench.runtimes)."""
        p.add_argument("--model", default=BUNDLED_NAMES[0], help="a model folder")
        p.add_argument(
            "--data",
            metavar="DIR",
            help="a data folder holding conll2003/train.txt (default: the bundled SST-2 sample)",
        )

    def texts(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data",
            metavar="DIR",
            help="a data folder holding sst2/train.tsv, squad/train-subset-v1.1.json and "
            "wikitext-2/wiki.valid.tokens (default: the samples installed with bertlab)",
        )

    speed = what.add_parser(
        "speed",
        help="the suite: tokenizer, int8 and the network's workloads side by side",
        description="Every workload on every model and dtype, into one report.",
    )
    speed.add_argument(
        "workloads",
        nargs="*",
        metavar="WORKLOAD",
        help=f"any of {', '.join(SUITE)} (default: all)",
    )
    speed.add_argument(
        "--models",
        default="default,base",
        help="comma-separated: model folders, 'default' (bundled) or presets",
    )
    speed.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    speed.add_argument(
        "--kernel",
        default="packed",
        choices=KERNELS,
        help="bertlab's attention kernel (transformers runs SDPA)",
    )
    speed.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run")
    speed.add_argument("--threads", type=int, help="torch threads for both sides")
    texts(speed)
    speed.add_argument("--repeats", type=int, default=5, help="timed runs per side")
    speed.add_argument(
        "--draws",
        type=int,
        default=DRAWS,
        help="batches of drawn lengths in each run of the variable workload (seeds 0 to N-1)",
    )
    common(speed)
    speed.set_defaults(func=cmd_bench_speed)

    tok = what.add_parser("tokenizer", help="batch tokenization throughput")
    tok.add_argument("--model", default=BUNDLED_NAMES[0], help="the model folder's vocabulary")
    texts(tok)
    tok.add_argument("--repeats", type=int, default=5, help="timed runs per side")
    common(tok, plot=False)
    tok.set_defaults(func=cmd_bench_tokenizer)

    int8 = what.add_parser("int8", help="int8 dynamic quantisation against float32")
    int8.add_argument("--model", default=BUNDLED_NAMES[0], help="a model folder")
    texts(int8)
    int8.add_argument("--threads", type=int, help="torch threads")
    int8.add_argument("--repeats", type=int, default=5, help="timed runs per side")
    common(int8, plot=False)
    int8.set_defaults(func=cmd_bench_int8)

    mem = what.add_parser(
        "memory", help="what gradient checkpointing saves in a training step, on each side"
    )
    mem.add_argument("--model", default="base", help="a preset, a model folder or 'default'")
    mem.add_argument("--batch-size", type=int, default=8, help="sequences in the batch")
    mem.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    mem.add_argument("--repeats", type=int, default=3, help="timed steps per setting")
    mem.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run")
    common(mem, plot=False)
    mem.set_defaults(func=cmd_bench_memory)

    rt = what.add_parser(
        "runtimes",
        help="bertlab against ONNX Runtime, OpenVINO and transformers, one process",
        description="Every system on the same weights, sentences, batches and threads, in "
        "alternating rounds: real tokens/s relative to transformers float32, and each "
        "system's embedding cosine and nearest-neighbour agreement with bertlab float32. "
        "A peer that is not installed is reported by name (pip install 'bertlab[runtimes]').",
    )
    model_and_news(rt)
    rt.add_argument("--systems", help="comma-separated (default: all)")
    rt.add_argument(
        "--workloads", help="comma-separated: file-order, sorted, batch-1 (default: all)"
    )
    rt.add_argument("--threads", type=int, help="threads for every system (default: torch's)")
    rt.add_argument("--repeats", type=int, default=5, help="timed rounds")
    rt.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="also time every workload beside N processes spinning on the same cores, and "
        "report the share of quiet throughput each system keeps (default: 0, quiet only)",
    )
    rt.add_argument(
        "--compare",
        nargs="+",
        metavar="REPORT",
        help="time nothing: print saved reports (--out of earlier runs, on any machines) side "
        "by side, bertlab against the fastest peer of each precision",
    )
    common(rt)
    rt.set_defaults(func=cmd_bench_runtimes)

    kern = what.add_parser(
        "kernels",
        help="the fastest float32 and int8 kernels for the model on this CPU; --save keeps them",
        description="The model (sentence embeddings) timed on each kernel this CPU can run, in "
        "float32 (bertlab's own sgemm-avx512 and sgemm-avx2, oneDNN's) and in int8 (those "
        "rounding the activations to as many levels as the class's kernel), in alternating "
        "rounds, paired with the kernel of the CPU's class. Another kernel is chosen only "
        "where it is at least 1.05x as fast over the workloads together, no slower than "
        "0.97x on one and faster in 75% of each one's rounds. --save (at least 5 rounds) "
        "keeps the choices for this CPU: every later bertlab process on "
        "it runs its products there (BERTLAB_FLOAT32_KERNEL and BERTLAB_INT8_KERNEL still "
        "force a kernel).",
    )
    model_and_news(kern)
    kern.add_argument("--precisions", help="comma-separated: float32, int8 (default: both)")
    kern.add_argument("--workloads", help="comma-separated: batch-1, sorted (default: both)")
    kern.add_argument("--threads", type=int, help="threads (default: torch's)")
    kern.add_argument("--repeats", type=int, default=5, help="timed rounds")
    kern.add_argument(
        "--save", action="store_true", help="keep the choices for this CPU (bertlab.nn.cpu)"
    )
    common(kern, plot=False)
    kern.set_defaults(func=cmd_bench_kernels)

    pre = what.add_parser("pretrain", help="one pre-training run on each side")
    pre.add_argument("--corpus", required=True, help="prepared corpus to train on")
    pre.add_argument("--eval-corpus", required=True, help="prepared held-out corpus")
    pre.add_argument("--long-corpus", help="prepared corpus for the last 10%% of the steps")
    pre.add_argument("--preset", default="mini", help="the model's size")
    pre.add_argument("--steps", type=int, default=1000, help="optimizer steps per side")
    pre.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    pre.add_argument("--long-batch-size", type=int, help="default: --batch-size")
    pre.add_argument("--lr", type=float, default=1e-4, help="peak learning rate")
    pre.add_argument("--warmup-steps", type=int, help="default: 1%% of the steps")
    pre.add_argument("--segment", type=int, default=50, help="steps per side, alternating")
    pre.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    pre.add_argument("--threads", type=int, help="torch threads for both sides")
    common(pre)
    pre.set_defaults(func=cmd_bench_pretrain)

    fine = what.add_parser(
        "finetune", help="one fine-tuning run on each side, for the same time budget"
    )
    # The task and --train are checked by the command, which names what it got.
    fine.add_argument("task", nargs="?", metavar="{" + ",".join(TASKS) + "}", help="the task")
    fine.add_argument("--train", help="the training file (required)")
    fine.add_argument("--dev", help="the evaluation file")
    fine.add_argument("--dev-articles", type=int, default=0, help="qa: hold out N articles")
    fine.add_argument("--model", default=BUNDLED_NAMES[0], help="the model both sides start from")
    # The spelling from before the subcommands, when `bench` took --models for every command.
    fine.add_argument("--models", help=argparse.SUPPRESS)
    fine.add_argument("--seconds", type=float, default=600, help="training budget per side")
    fine.add_argument("--epochs", type=float, default=3.0, help="the planned schedule")
    fine.add_argument("--batch-size", type=int, default=32, help="examples per step")
    fine.add_argument("--lr", type=float, default=5e-5, help="peak learning rate")
    fine.add_argument("--max-length", type=int, help="tokens (default 128; qa 384)")
    fine.add_argument("--max-train-examples", type=int, help="a random subset of the training set")
    fine.add_argument("--seed", type=int, default=0, help="shuffling and initialisation")
    fine.add_argument("--dropout", type=float, help="default: the model's own")
    fine.add_argument("--threads", type=int, help="torch threads for both sides")
    common(fine)
    fine.set_defaults(func=cmd_bench_finetune)

    prec = what.add_parser(
        "precision", help="a fine-tuned model's dev figures in float32, bfloat16 and int8"
    )
    prec.add_argument("task", nargs="?", metavar="{" + ",".join(TASKS) + "}", help="the task")
    prec.add_argument("--model", help="the fine-tuned model folder (bertlab finetune's output)")
    prec.add_argument("--train", help="the file it was fine-tuned on (labels, int8 calibration)")
    prec.add_argument("--dev", help="the file it is scored on")
    prec.add_argument("--max-length", type=int, help="tokens (default 128; qa 384)")
    prec.add_argument("--precisions", help="comma-separated (default float32,bfloat16,int8)")
    prec.add_argument(
        "--tolerance", type=float, default=0.05, help="int8: layers past this error stay float32"
    )
    prec.add_argument("--threads", type=int, help="torch threads")
    common(prec, plot=False)
    prec.set_defaults(func=cmd_bench_precision)

    srv = what.add_parser(
        "serve",
        help="bertlab's HTTP embedding server under load",
        description="bertlab serve in its own process, driven over loopback by concurrent "
        "clients from this one: throughput (tokens/s, requests/s), p50/p95/p99 latency, errors "
        "and server memory; also under 4x its saturating load (429s) and over --requests "
        "requests (memory). Needs pip install 'bertlab[serve-bench]'. The comparison with other "
        "servers (FastAPI + sentence-transformers, Infinity) is the benchmarks' harness: "
        "benchmarks/harness/serve_peers.py in bertlab's repository, with these options.",
    )
    add_serve_options(srv)
    # Infinity is the harness's peer now: given here, the option is refused, saying where it went.
    srv.add_argument("--infinity-venv", help=argparse.SUPPRESS)
    srv.set_defaults(func=cmd_bench_serve)


def add_serve_options(p: argparse.ArgumentParser, systems: str = "bertlab") -> None:
    """The options of ``bertlab bench serve`` (and of the harness's ``serve_peers.py``, whose
    ``systems`` are bertlab's and its peers')."""
    p.add_argument("--model", default=BUNDLED_NAMES[0], help="the model folder every server loads")
    p.add_argument("--systems", help=f"comma-separated: {systems} (default: all)")
    p.add_argument(
        "--workloads", help="comma-separated: batch1, batch256, overload, memory (default: all)"
    )
    p.add_argument("--seconds", type=float, default=30.0, help="timed seconds per workload")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds before each, not counted")
    p.add_argument("--concurrency", type=int, default=32, help="clients of batch1 and memory")
    p.add_argument("--requests", type=int, default=100_000, help="requests of the memory workload")
    p.add_argument("--threads", type=int, help="threads of every server (default: the cores)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "int8"],
        default="float32",
        help="the precision every server runs its model in (int8: bertlab's calibrated int8)",
    )
    p.add_argument(
        "--compile", action="store_true", help="bertlab's server with --compile (float32, int8)"
    )
    p.add_argument("--out", help="write the JSON report here")
    p.add_argument("--plot", help="write the chart here (PNG)")


def default_subcommand(argv: list[str]) -> list[str]:
    """``bench [WORKLOAD ...] [options]`` -> ``bench speed ...``: commands written
    before the subcommands keep working. ``bench -h`` still lists the subcommands."""
    if argv[:1] == ["bench"] and (len(argv) == 1 or argv[1] not in (*SUBCOMMANDS, "-h", "--help")):
        return ["bench", DEFAULT, *argv[1:]]
    return argv

"""``bertlab pretrain``, ``finetune``, ``predict`` and ``plot``: the training and inference
verbs of the command line (``bertlab.cli.main`` holds the others, and ``main``)."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from bertlab.files import BUNDLED_NAMES
from bertlab.nn.config import PRESETS

if TYPE_CHECKING:
    from bertlab.train.loop import TrainingInterrupted


def seconds(text: str) -> float:
    """An argparse type: a time budget, a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text}")
    return value


def rerun_with_resume(args: argparse.Namespace, torchrun: bool = False) -> str:
    """The command line that continues a stopped run: the one given (``args.argv``, set by
    ``main``; else ``sys.argv``) without ``--overwrite`` or ``--resume [auto]``, with
    ``--resume``. Under torchrun the same launcher must start it, which it cannot see."""
    words = list(getattr(args, "argv", None) or sys.argv[1:])
    kept: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if len(name) >= 4 and "--overwrite".startswith(name):
            continue
        if len(name) >= 3 and "--resume".startswith(name):
            skip = "=" not in word and i + 1 < len(words) and words[i + 1] == "auto"
            continue
        kept.append(word)
    command = shlex.join(["bertlab", *kept, "--resume"])
    return f"torchrun (as before) ... {command}" if torchrun else command


def cmd_pretrain(args: argparse.Namespace) -> int:
    from bertlab.distributed import launched, start
    from bertlab.train.loop import TrainConfig, TrainingInterrupted
    from bertlab.train.pretrain import PretrainConfig, pretrain

    distributed = launched()  # by torchrun: one process of several
    if not distributed or int(os.environ.get("RANK", "0")) == 0:  # something at once
        print(
            f"pretrain: checking the settings, the corpus in {args.data} and the memory, then "
            f"training into {args.output}",
            file=sys.stderr,
            flush=True,
        )
    device = start(args.device, args.dist_timeout) if distributed else args.device
    try:
        steps = args.steps
        tc = TrainConfig(
            out_dir=args.output,
            steps=steps,
            lr=args.lr,
            weight_decay=args.weight_decay,
            warmup_steps=steps // 100 if args.warmup_steps is None else args.warmup_steps,
            optimizer=args.optimizer,
            max_grad_norm=args.max_grad_norm,
            grad_accum=args.grad_accum,
            precision=args.precision,
            seed=args.seed,
            log_every=args.log_every,
            save_every=args.save_every,
            device=device,
            compile=args.compile,
            max_seconds=args.max_seconds,
        )
        config = PretrainConfig(
            data=args.data,
            train=tc,
            model=args.model,
            batch_size=args.batch_size,
            long_data=args.long_data,
            long_fraction=args.long_fraction,
            long_batch_size=args.long_batch_size,
            eval_data=args.eval_data,
            eval_examples=args.eval_examples,
            eval_every=args.eval_every,
            masking=args.masking,
            mask_rate=args.mask_rate,
            max_predictions=args.max_predictions,
            whole_word=args.whole_word,
            dropout=args.dropout,
        )
        main_rank = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        try:
            metrics = pretrain(config, resume=args.resume, overwrite=args.overwrite)
        except TrainingInterrupted as stop:
            if main_rank:
                print(_stopped(stop, rerun_with_resume(args, distributed)), file=sys.stderr)
            return 130  # as a shell reports a process that SIGINT ended
        if not main_rank:
            return 0
        done = int(metrics.get("step", 0))
        shown = ", ".join(
            f"{k} {v:.4f}" for k, v in metrics.items() if k not in ("step", "planned_steps")
        )
        budget = f" of {steps} (time budget; {int(metrics['planned_steps'])} planned)"
        budget = budget if done < steps else ""
        print(f"done: step {done}{budget}, {shown}; model in {Path(args.output) / 'model'}")
        return 0
    finally:
        if distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _stopped(stop: TrainingInterrupted, command: str) -> str:
    """What a stopped run says: where it stands and the command that continues it, in full."""
    if stop.checkpoint is None:
        return "\nstopped before any checkpoint was saved: the same command starts over"
    if getattr(stop, "at_once", False):
        where = f"stopped at once; the last checkpoint is step {stop.step}, in {stop.checkpoint}"
    else:
        where = f"stopped at step {stop.step}, saved in {stop.checkpoint}"
    return f"\n{where}; continue with:\n  {command}"


def cmd_finetune(args: argparse.Namespace) -> int:
    from bertlab.train.finetune import FinetuneConfig, finetune, resume_command
    from bertlab.train.loop import TrainingInterrupted

    names = (
        "train",
        "dev",
        "model",
        "epochs",
        "batch_size",
        "lr",
        "warmup_ratio",
        "weight_decay",
        "max_length",
        "max_train_examples",
        "max_seconds",
        "seed",
        "dropout",
        "precision",
        "device",
        "text_column",
        "pair_column",
        "label_column",
        "doc_stride",
        "max_query_length",
        "max_answer_length",
        "dev_articles",
    )
    config = FinetuneConfig(task=args.task, **{n: getattr(args, n) for n in names})
    try:
        r = finetune(config, args.output, overwrite=args.overwrite, resume=args.resume)
    except TrainingInterrupted as e:
        print(_stopped(e, resume_command(config, args.output)), file=sys.stderr)
        return 130  # as a shell reports a program ended by Ctrl-C
    except KeyboardInterrupt:  # outside the training loop (reading the data, saving)
        print("\ninterrupted before training started or after it ended", file=sys.stderr)
        return 130
    where = Path(args.output) / "model"
    print(
        f"done: {r['steps']} steps, {r['seconds']:.0f} s of training (+ {r['eval_seconds']:.0f} s "
        f"evaluating; {r['wall_seconds']:.0f} s in all); model in {where}"
    )
    if r["dev"]:
        print(
            f"dev (best, step {r['best_step']}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in r["dev"].items())
        )
    if "dev_full" in r:
        from bertlab.metrics import format_conlleval

        print(format_conlleval(r["dev_full"]))
    return 0


def _inputs(args: argparse.Namespace) -> list:
    """Texts from the arguments, else --file, else standard input; one per line, each read by
    the pipeline (answer: a JSON object {"question", "context"} per line, or a question with
    --context). Each line passes the pipelines' text rules first, named by its number."""
    from bertlab.pipelines import PIPELINES
    from bertlab.pipelines.text import check_text

    if args.text:
        lines = list(args.text)
    elif args.file:
        lines = Path(args.file).read_text("utf-8").splitlines()
    else:
        lines = sys.stdin.read().splitlines()
    lines = [x for x in lines if x.strip()]
    if not lines:
        raise ValueError("no input: give texts as arguments, --file FILE, or lines on stdin")
    if args.context is not None:
        check_text(args.context, "--context")
    parse = PIPELINES[args.task].parse
    return [
        parse(check_text(line, f"input line {n}"), n, context=args.context)
        for n, line in enumerate(lines, 1)
    ]


def cmd_predict(args: argparse.Namespace) -> int:
    import os

    from bertlab.pipelines import pipeline

    if args.ray is not None:
        return _predict_ray(args)
    given = [f"--{n}" for n in ("actors", "threads", "text_column", "pair_column")
             if getattr(args, n) is not None]  # fmt: skip
    if given:
        raise ValueError(f"{', '.join(given).replace('_', '-')} goes with --ray only")
    if args.out is not None:
        return _predict_corpus(args)
    given = [
        f"--{n}"
        for n in ("format", "resume", "overwrite", "chunk_lines")
        if getattr(args, n) not in (None, False)
    ]
    if given:
        raise ValueError(f"{', '.join(given).replace('_', '-')} goes with --out FILE only")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("under torchrun, predict writes to --out (each process takes chunks)")
    items = _inputs(args)  # read and checked before the model is loaded
    pipe = pipeline(args.task, args.model, args.device, args.batch_size)
    outputs = pipe.run(
        items,
        top_k=args.top_k,
        pair=args.pair,
        max_answer_length=args.max_answer_length,
        allow_no_answer=args.allow_no_answer,
        pooling=args.pooling,
        normalize=not args.no_normalize,
    )
    line = pipe.json_line if args.json else pipe.text
    for item, result in zip(items, outputs, strict=True):
        print(line(item, result))
    return 0


def _predict_corpus(args: argparse.Namespace) -> int:
    """``--file F --out OUT``: streamed, in chunks that resume, over torchrun's processes."""
    from bertlab.heap import keep_freed_memory
    from bertlab.pipelines.corpus import CHUNK_LINES, CorpusJob, predict_corpus, torchrun_group

    if args.text or not args.file:
        raise ValueError("--out reads --file FILE (texts as arguments or on stdin cannot resume)")
    keep_freed_memory()  # a corpus is batch after batch: freed blocks stay for the next one
    job = CorpusJob(
        task=args.task,
        file=args.file,
        out=args.out,
        model=args.model,
        format=args.format,
        batch_size=args.batch_size,
        device=args.device,
        top_k=args.top_k,
        pair=args.pair,
        pooling=args.pooling,
        normalize=not args.no_normalize,
        resume=args.resume,
        overwrite=args.overwrite,
        chunk_lines=CHUNK_LINES if args.chunk_lines is None else args.chunk_lines,
    )
    with torchrun_group():
        try:
            r = predict_corpus(job)
        except KeyboardInterrupt:
            print(
                f"\ninterrupted; the finished chunks are kept in {args.out}.parts; continue "
                "with the same command and --resume",
                file=sys.stderr,
            )
            return 130
    if r.out is not None:
        again = f", {r.reused} of them found done" if r.reused else ""
        print(
            f"wrote {r.rows:,} results to {r.out} ({r.format}; {r.chunks} chunk"
            f"{'s' if r.chunks > 1 else ''}{again}; {r.processes} process"
            f"{'es' if r.processes > 1 else ''})"
        )
    return 0


def _predict_ray(args: argparse.Namespace) -> int:
    """``INPUT --out OUT --ray local|ADDRESS``: a Parquet dataset on Ray Data's actors."""
    from bertlab.pipelines.raydata import RayJob, predict_ray

    if args.out is None:
        raise ValueError("--ray writes to --out FILE (.parquet or .jsonl)")
    given = [f"--{n}" for n in ("resume", "chunk_lines") if getattr(args, n) not in (None, False)]
    if given:
        raise ValueError(
            f"{', '.join(given).replace('_', '-')} goes with --file runs; a --ray run is one "
            "Ray job, written whole or not at all"
        )
    inputs = list(args.text) + ([args.file] if args.file else [])
    if len(inputs) != 1:
        raise ValueError(
            "--ray reads one input: a Parquet file, a folder of them or a glob, as the one "
            f"argument after the task or --file (got {len(inputs)})"
        )
    options = {
        "embed": {"pooling": args.pooling, "normalize": not args.no_normalize},
        "answer": {
            "max_answer_length": args.max_answer_length,
            "allow_no_answer": args.allow_no_answer,
        },
        "fill-mask": {"top_k": args.top_k or 5},
    }.get(args.task, {})
    job = RayJob(
        task=args.task,
        input=inputs[0],
        out=args.out,
        ray=args.ray,
        model=args.model,
        column=args.text_column,
        pair_column=args.pair_column,
        format=args.format,
        actors=1 if args.actors is None else args.actors,
        threads=args.threads,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        options=options,
    )
    r = predict_ray(job)
    failed = f", {r.errors:,} of them as error rows" if r.errors else ""
    print(
        f"wrote {r.rows:,} results to {r.out} ({r.format}{failed}; {r.actors} Ray actor"
        f"{'s' if r.actors > 1 else ''} of {r.threads} thread{'s' if r.threads > 1 else ''})"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from bertlab.train.curves import plot_run

    print(f"wrote {plot_run(args.run, args.output)}")
    return 0


def add_task_parsers(sub: argparse._SubParsersAction) -> None:
    pt = sub.add_parser("pretrain", help="masked LM + next sentence prediction pre-training")
    pt.add_argument("--data", required=True, help="a prepared corpus (bertlab prepare)")
    pt.add_argument("-o", "--output", required=True, help="the run folder")
    pt.add_argument(
        "--model",
        default="mini",
        help=f"a preset ({', '.join(PRESETS)}), a config.json, or a model folder to continue from",
    )
    pt.add_argument("--steps", type=int, default=1000, help="optimizer steps in all")
    pt.add_argument("--batch-size", type=int, default=32, help="global, per step")
    pt.add_argument("--long-data", help="the long phase's corpus (e.g. prepared at 512)")
    pt.add_argument("--long-fraction", type=float, default=0.1, help="share of steps on it")
    pt.add_argument("--long-batch-size", type=int, help="default: --batch-size")
    pt.add_argument("--eval-data", help="a held-out prepared corpus")
    pt.add_argument("--eval-examples", type=int, default=512)
    pt.add_argument("--eval-every", type=int, default=0, help="default: 10 times a run")
    pt.add_argument("--masking", choices=["dynamic", "static"], default="dynamic")
    pt.add_argument("--mask-rate", type=float, default=0.15)
    pt.add_argument("--max-predictions", type=int, help="per sequence (default 15%% of length)")
    pt.add_argument("--whole-word", action="store_true", help="mask whole words")
    pt.add_argument("--lr", type=float, default=1e-4)
    pt.add_argument("--warmup-steps", type=int, help="default: 1%% of the steps")
    pt.add_argument("--weight-decay", type=float, default=0.01)
    pt.add_argument("--optimizer", choices=["adamw", "lamb"], default="adamw")
    pt.add_argument("--max-grad-norm", type=float, default=1.0)
    pt.add_argument("--grad-accum", type=int, default=1)
    pt.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    pt.add_argument("--dropout", type=float, help="override the model's dropout")
    pt.add_argument("--compile", action="store_true", help="torch.compile the model")
    pt.add_argument("--device", default="cpu", help="cpu or cuda (one per process)")
    pt.add_argument(
        "--max-seconds",
        type=seconds,
        help="a budget for the whole run: setting up, training, evaluations and checkpoints "
        "all count. The steps that fit are planned after a few timed ones, warm-up and decay "
        "are fitted to them, and no step starts unless it (predicted from the slowest recent "
        "steps) and the final evaluation and checkpoint still fit",
    )
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--log-every", type=int, default=10)
    pt.add_argument("--save-every", type=int, default=500)
    pt.add_argument(
        "--resume",
        nargs="?",
        const=True,
        choices=["auto"],
        default=False,
        help="continue the run in --output; --resume auto: continue it if it has a checkpoint, "
        "else start it (a process torchrun restarts does this by itself)",
    )
    pt.add_argument(
        "--dist-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="under torchrun: how long a process waits for the others in a collective before "
        "it stops with an error",
    )
    pt.add_argument("--overwrite", action="store_true", help="replace the run in --output")
    pt.set_defaults(func=cmd_pretrain)

    ft = sub.add_parser("finetune", help="fine-tune on labelled data: classify, tag, qa")
    ft.add_argument("task", choices=["classify", "tag", "qa"])
    ft.add_argument("--train", required=True, help="TSV/CSV/JSONL, CoNLL, or SQuAD JSON")
    ft.add_argument("--dev", help="the evaluation file, same format")
    ft.add_argument("-o", "--output", required=True, help="the run folder")
    ft.add_argument("--model", default=BUNDLED_NAMES[0], help="a BERT folder (default: bundled)")
    ft.add_argument("--epochs", type=float, default=3.0)
    ft.add_argument("--batch-size", type=int, default=32)
    ft.add_argument("--lr", type=float, default=5e-5)
    ft.add_argument("--warmup-ratio", type=float, default=0.1)
    ft.add_argument("--weight-decay", type=float, default=0.01)
    ft.add_argument("--max-length", type=int, help="tokens (default 128; qa 384)")
    ft.add_argument("--max-train-examples", type=int, help="a random subset of the training set")
    ft.add_argument(
        "--max-seconds",
        type=seconds,
        help="a budget for the whole run: reading the data, training, dev evaluations and the "
        "checkpoint all count (the final evaluation's time is measured on a dev batch "
        "first and kept free). The learning-rate schedule is planned to the steps that fit, and "
        "no step starts unless it (predicted from the slowest recent steps) and the final "
        "evaluation still fit",
    )
    ft.add_argument("--seed", type=int, default=0)
    ft.add_argument(
        "--dropout", type=float, help="hidden and attention dropout (default: the model's)"
    )
    ft.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    ft.add_argument("--device", default="cpu")
    ft.add_argument("--text-column", help="classify: the text column (default: detected)")
    ft.add_argument("--pair-column", help="classify: the second text column")
    ft.add_argument("--label-column", help="classify: the label column")
    ft.add_argument("--doc-stride", type=int, default=128, help="qa: window step in tokens")
    ft.add_argument("--max-query-length", type=int, default=64)
    ft.add_argument("--max-answer-length", type=int, default=30)
    ft.add_argument(
        "--dev-articles",
        type=int,
        default=0,
        help="qa: hold out the last N articles of --train for evaluation",
    )
    ft.add_argument("--resume", action="store_true", help="continue the stopped run in --output")
    ft.add_argument("--overwrite", action="store_true", help="replace the run in --output")
    ft.set_defaults(func=cmd_finetune)

    from bertlab.pipelines.corpus import CHUNK_LINES, FORMATS

    pr = sub.add_parser("predict", help="fill-mask, embed, classify, tag or answer")
    pr.add_argument("task", choices=["fill-mask", "embed", "classify", "tag", "answer"])
    pr.add_argument("text", nargs="*", help="inputs (default: --file, else standard input)")
    pr.add_argument("--model", default=BUNDLED_NAMES[0], help="a model folder")
    pr.add_argument("--file", help="one input per line")
    pr.add_argument("--json", action="store_true", help="JSON lines out")
    pr.add_argument("--top-k", type=int, help="candidates per input")
    pr.add_argument("--pair", help="classify: a second text for every input")
    pr.add_argument("--context", help="answer: the passage every question is asked about")
    pr.add_argument("--max-answer-length", type=int, default=30, help="answer: in tokens")
    pr.add_argument("--allow-no-answer", action="store_true", help="answer: SQuAD 2.0 models")
    pr.add_argument("--pooling", choices=["mean", "cls"], default="mean", help="embed")
    pr.add_argument("--no-normalize", action="store_true", help="embed: keep the length")
    pr.add_argument("--batch-size", type=int, default=32)
    pr.add_argument("--device", default="cpu", help="cpu or cuda (under torchrun: one per process)")
    pr.add_argument(
        "--out",
        help="embed, classify, tag: stream --file into this file, in chunks that --resume "
        "continues; torchrun spreads the chunks over its processes",
    )
    pr.add_argument(
        "--format",
        choices=FORMATS,
        help="--out's format: JSON lines as --json, or embed's vectors as an (N, H) float32 "
        ".npy or Parquet (default: from --out's suffix, else jsonl)",
    )
    pr.add_argument("--resume", action="store_true", help="continue an interrupted --out run")
    pr.add_argument("--overwrite", action="store_true", help="replace --out and its parts")
    pr.add_argument(
        "--chunk-lines",
        type=int,
        help=f"input lines per part file of --out (default: {CHUNK_LINES})",
    )
    pr.add_argument(
        "--ray",
        metavar="local|ADDRESS",
        help="run on Ray Data: the one input is a Parquet file, folder or glob, --out a .parquet "
        "or .jsonl file; local starts Ray here, an ADDRESS joins a cluster",
    )
    pr.add_argument("--actors", type=int, help="--ray: actors, each with the model (default: 1)")
    pr.add_argument(
        "--threads", type=int, help="--ray: torch threads per actor (default: the CPUs / actors)"
    )
    pr.add_argument("--text-column", help="--ray: the texts (default: text; answer: question)")
    pr.add_argument("--pair-column", help="--ray: classify's second texts, answer's contexts")
    pr.set_defaults(func=cmd_predict)

    plot = sub.add_parser("plot", help="a run's loss and accuracy curves to PNG")
    plot.add_argument("run", help="a run folder (holding metrics.jsonl)")
    plot.add_argument("-o", "--output", help="PNG path (default RUN/curves.png)")
    plot.set_defaults(func=cmd_plot)

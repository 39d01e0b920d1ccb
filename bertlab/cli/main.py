"""``bertlab <verb>``: command-line arguments -> the library functions.

bertlab demo                          the bundled real checkpoint: parameters, a sentence run
bertlab summary [SOURCE] --head H     layer-by-layer parameter table of any size and head
bertlab inspect embeddings TEXT       the embedding layer taken apart, token by token
bertlab explore TEXT -o page.html     a page of every layer and head for one sentence
bertlab tokenize TEXT [--pair TEXT]   what the model receives: tokens, ids, types, offsets
bertlab train-vocab FILES -o DIR      a WordPiece vocabulary from raw text
bertlab prepare FILES -o DIR          raw text -> sentence-pair shards for pre-training
bertlab pretrain --data DIR -o RUN    masked LM + NSP pre-training (torchrun for many processes)
bertlab plot RUN                      a run's loss and accuracy curves to PNG
bertlab finetune {classify,tag,qa}    fine-tune on labelled data, evaluate, keep the best
bertlab predict TASK [TEXT ...]       fill-mask, embed, classify, tag, answer: args, file or stdin
bertlab bench {speed,tokenizer,int8,pretrain,finetune}  side by side with transformers
bertlab convert SRC DEST              an original TensorFlow BERT checkpoint -> a model folder
bertlab serve MODEL [MODEL ...]       an HTTP inference server with dynamic packed batching
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import torch

from bertlab.cli.bench import add_bench_parsers, default_subcommand
from bertlab.cli.convert import add_parsers as add_convert_parsers
from bertlab.cli.explore import add_parsers as add_explore_parsers
from bertlab.cli.export import add_parsers as add_export_parsers
from bertlab.cli.serve import add_parsers as add_serve_parsers
from bertlab.cli.tasks import add_task_parsers, seconds
from bertlab.extras import extra_for, missing_message
from bertlab.files import BUNDLED_NAMES, resolve_model_dir
from bertlab.nn.config import PRESETS, resolve_source
from bertlab.train.demo import CAP_SECONDS

DEMO_TEXT = "The quick brown fox jumps over the lazy dog."
DEMO_REVIEW = "A warm, funny and beautifully acted film that stays with you."
DEMO_COMPARE = (
    "A fast auburn fox leaps above a sleepy hound.",
    "Stock markets fell sharply today.",
)


def _vec(t: torch.Tensor, dims: int) -> str:
    return " ".join(f"{float(x):+.4f}" for x in t[:dims]) + (" ..." if t.numel() > dims else "")


# ============================================================================ demo
def cmd_demo(args: argparse.Namespace) -> int:
    from bertlab.explore.summary import format_table, parameter_table
    from bertlab.nn.model import BertModel
    from bertlab.tokenizer import BertTokenizer

    directory = resolve_model_dir(args.model)
    print(f"bertlab demo: the checkpoint in {directory}\n")
    model = BertModel.from_pretrained(directory)
    tokenizer = BertTokenizer.from_pretrained(directory)
    print(format_table(parameter_table(model), f"BertModel from {directory.name}", model.config))

    texts = [args.text, *DEMO_COMPARE]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    n = int(batch["attention_mask"][0].sum())
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0, :n].tolist())
    print(f"\nSentence: {args.text!r}")
    print(f"Tokens ({n}): {' '.join(tokens)}")
    print(f"Ids: {batch['input_ids'][0, :n].tolist()}")
    print(
        f"last_hidden_state: {tuple(out.last_hidden_state.shape)}  "
        f"pooler_output: {tuple(out.pooler_output.shape)}"
    )
    print(f"[CLS] vector: {_vec(out.last_hidden_state[0, 0], 6)}")

    # Sentence embeddings as the checkpoint was trained to give them: mean over real tokens,
    # unit length (the pooling of all-MiniLM-L6-v2).
    mask = batch["attention_mask"].unsqueeze(-1).float()
    emb = (out.last_hidden_state * mask).sum(1) / mask.sum(1)
    emb = torch.nn.functional.normalize(emb, dim=-1)
    print(f"Sentence embedding (mean-pooled, normalised): {_vec(emb[0], 6)}")
    for other, vec in zip(DEMO_COMPARE, emb[1:], strict=True):
        print(f"  cosine similarity to {other!r}: {float(emb[0] @ vec):.4f}")
    if args.no_finetune:
        return 0
    return _demo_finetune(args, directory)


def _demo_finetune(args: argparse.Namespace, directory: Path) -> int:
    """The rest of the journey: fine-tune a sentiment classifier on the bundled SST-2 sample,
    planned to this machine's measured speed so that it fits in ``--seconds``
    (``bertlab.train.demo``), report dev accuracy, classify a sentence the user types."""
    import dataclasses
    import tempfile

    from bertlab.pipelines import pipeline
    from bertlab.train import demo, loop
    from bertlab.train.finetune import FinetuneConfig, finetune, prepare

    started = loop.clock()
    samples = Path(__file__).parents[1] / "data" / "samples"
    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bertlab-demo-"))
    print(
        f"\nFine-tuning a sentiment classifier on the bundled SST-2 sample within {args.seconds:g} "
        f"s (--seconds), into {out}; first, a few steps timed on this machine",
        flush=True,
    )
    config = FinetuneConfig(
        task="classify",
        train=str(samples / "sst2_train.tsv"),
        dev=str(samples / "sst2_dev.tsv"),
        model=str(directory),
        epochs=args.epochs,
        batch_size=32,
        max_length=64,
        lr=1e-4,
    )
    prepared = prepare(config)
    assert prepared.dev is not None, "the demo's config names a dev file"
    speed = demo.measure(prepared)
    left = args.seconds - (loop.clock() - started)
    if left <= 0:
        raise ValueError(
            f"--seconds {args.seconds:g} went on timing this machine ({loop.clock() - started:.0f}"
            " s); give the demo more seconds"
        )
    n_train, n_dev = len(prepared.train.features), len(prepared.dev.features)
    plan = demo.plan(speed, left, n_train, n_dev, args.epochs)
    epochs = plan.epochs(n_train)
    whole = "the whole" if plan.full else "what fits of the"
    print(
        f"Timed: a step of 32 sentences {speed.step(32):.2f} s, of 16 {speed.step(16):.2f} s; "
        f"{speed.per_dev * 1000:.1f} ms a dev sentence. Plan: {plan.steps} steps of "
        f"{plan.batch_size} ({whole} {args.epochs:g} epochs: {epochs:.2f}), scored on "
        f"{plan.dev_examples:,} dev sentences, about {plan.seconds:.0f} s",
        flush=True,
    )
    dev = samples / "sst2_dev.tsv"
    if plan.dev_examples < n_dev:  # the first sentences: a sample the evaluation has time for
        lines = dev.read_text("utf-8").splitlines(keepends=True)[: plan.dev_examples + 1]
        sample = tempfile.TemporaryDirectory(prefix="bertlab-demo-dev-")  # gone when done
        dev = Path(sample.name) / "sst2_dev.tsv"
        dev.write_text("".join(lines), "utf-8")
    config = dataclasses.replace(
        config,
        dev=str(dev),
        batch_size=plan.batch_size,
        epochs=epochs,
        max_seconds=args.seconds - (loop.clock() - started),  # the cap holds whatever happens
    )
    result = finetune(config, out, overwrite=args.output is not None)
    dev_figures = result["dev"]
    if dev_figures is None:
        print(f"No step fitted in {args.seconds:g} s on this machine; give it more (--seconds)")
        return 1
    print(
        f"Dev accuracy: {dev_figures['accuracy']:.4f} on {plan.dev_examples:,} held-out SST-2 "
        f"sentences (F1 {dev_figures['f1']:.4f}, MCC {dev_figures['mcc']:.4f}), after "
        f"{result['steps']} steps in {result['wall_seconds']:.0f} s; the model is in "
        f"{out / 'model'}"
    )
    classify = pipeline("classify", str(out / "model"))
    sentence = args.sentence if args.sentence is not None else demo_sentence(sys.stdin)
    best = classify(sentence)[0]
    print(f"{sentence!r} -> {best['label']} ({best['score']:.3f})")
    return 0


def demo_sentence(stdin: TextIO | None) -> str:
    """The sentence the demo classifies when none was given: typed at a terminal, else the first
    line of standard input (``echo "..." | bertlab demo``); the example when that is empty."""
    if stdin is None or stdin.closed:
        return DEMO_REVIEW
    if stdin.isatty():
        line = input("\nType a sentence to classify (Enter for an example): ")
    else:
        line = stdin.readline()
    return line.strip() or DEMO_REVIEW


# ============================================================================ summary
def cmd_summary(args: argparse.Namespace) -> int:
    from bertlab.explore.summary import HEADS, build_for_summary, format_table, parameter_table

    source = resolve_source(args.source)
    config, origin = source.config, source.description
    overrides = {}
    if args.vocab_size is not None:
        overrides["vocab_size"] = args.vocab_size
    if args.num_labels is not None:
        overrides["num_labels"] = args.num_labels
    if overrides:
        config = config.replace(**overrides)
    model = build_for_summary(config, args.head)
    title = f"{HEADS[args.head].__name__} ({origin})"
    print(format_table(parameter_table(model), title, config, collapse_layers=args.collapse))
    return 0


# ============================================================================ inspect
def cmd_inspect_embeddings(args: argparse.Namespace) -> int:
    from bertlab.explore.dissect import dissect_embeddings
    from bertlab.nn.model import BertModel
    from bertlab.tokenizer import BertTokenizer

    directory = resolve_model_dir(args.model)
    model = BertModel.from_pretrained(directory)
    tokenizer = BertTokenizer.from_pretrained(directory)
    enc = tokenizer(args.text, args.pair, return_tensors="pt")
    ids, types = enc["input_ids"][0], enc["token_type_ids"][0]
    d = dissect_embeddings(model.embeddings, ids, types)
    H = model.config.hidden_size
    print(
        f"Embedding layer of {directory} for {args.text!r}"
        + (f" / {args.pair!r}" if args.pair else "")
    )
    print(f"Each row shows the first {args.dims} of {H} dimensions.\n")
    parts = (
        ("word", d.word, "word_embeddings(input_id)"),
        ("position", d.position, "position_embeddings(position)"),
        ("token_type", d.token_type, "token_type_embeddings(segment)"),
        ("sum", d.summed, "word + position + token_type"),
        ("LayerNorm", d.normalized, "embeddings.LayerNorm(sum)"),
        ("embeddings", d.module_output, "model.embeddings(input_ids) (eval)"),
    )
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    for t, token in enumerate(tokens):
        print(f"[{t}] {token}  id={int(ids[t])}  position={t}  segment={int(types[t])}")
        for name, values, what in parts:
            print(f"    {name:<11}{_vec(values[t], args.dims):<48} {what}")
    ok = d.max_abs_diff <= 1e-5
    print(
        f"\nCheck: LayerNorm(word + position + token_type) == model.embeddings(input_ids): "
        f"max |difference| = {d.max_abs_diff:.2e} -> {'identical' if ok else 'DIFFERENT'}"
    )
    return 0 if ok else 1


# ============================================================================ tokenize
def cmd_tokenize(args: argparse.Namespace) -> int:
    from bertlab.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(args.model)
    enc = tok(
        args.text,
        args.pair,
        truncation=args.max_length is not None,
        max_length=args.max_length,
        return_offsets_mapping=True,
    )
    sources = (args.text, args.pair)
    rows = [("#", "token", "id", "type", "word", "offsets", "text")]
    for i, (token, id_, type_, word, seq, (a, b)) in enumerate(
        zip(
            enc.tokens(),
            enc["input_ids"],
            enc["token_type_ids"],
            enc.word_ids(),
            enc.sequence_ids(),
            enc["offset_mapping"],
            strict=True,
        )
    ):
        special = seq is None
        text = "" if special else sources[seq][a:b]
        where = "" if special else f"{a}:{b}"
        rows.append(
            (str(i), token, str(id_), str(type_), "" if special else str(word), where, text)
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(
        f"\n{len(enc['input_ids'])} tokens; type 0 = first segment, 1 = second; offsets are "
        "character positions in the segment's text"
    )
    return 0


def cmd_train_vocab(args: argparse.Namespace) -> int:
    from bertlab.tokenizer import BertTokenizer, train_vocab

    path = train_vocab(
        args.files,
        args.vocab_size,
        args.output,
        lowercase=not args.cased,
        min_frequency=args.min_frequency,
    )
    tok = BertTokenizer.from_pretrained(args.output)
    print(f"wrote {path} ({tok.vocab_size} tokens, {'cased' if args.cased else 'uncased'})")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from bertlab.data.corpus import prepare, read_meta

    try:
        out = prepare(
            args.files,
            args.model,
            args.output,
            max_seq_length=args.max_seq_length,
            short_seq_prob=args.short_seq_prob,
            dupe_factor=args.dupe_factor,
            nsp=not args.no_nsp,
            seed=args.seed,
            workers=args.workers,
            shard_size=args.shard_size,
            overwrite=args.overwrite,
            resume=args.resume,
            text_column=args.text_column,
            text_field=args.text_field,
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; the shards written so far are kept in {args.output}; continue "
            "with the same command and --resume",
            file=sys.stderr,
        )
        return 130
    meta = read_meta(out)
    print(
        f"wrote {out}: {meta['num_examples']:,} examples, {meta['num_tokens']:,} tokens "
        f"({meta['random_next']:,} with a random next segment) in {len(meta['shards'])} "
        f"shard(s); {meta['documents']:,} documents, {meta['documents_skipped']:,} empty ones "
        f"skipped, {meta['chunks_dropped']:,} pieces too short for a pair dropped"
    )
    return 0


# ============================================================================ main
class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, where it has one (not None, not a switch's
    False) and the help does not already say it; an option with no help gets the default alone."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _shows_default(action):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if _shows_default(action) and "(default" not in text and "default:" not in text:
            text += " (default: %(default)s)"
        return text


def _shows_default(action: argparse.Action) -> bool:
    return (
        bool(action.option_strings)
        and action.default not in (None, False, argparse.SUPPRESS)
        and action.help is not argparse.SUPPRESS
    )


class ArgumentParser(argparse.ArgumentParser):
    """bertlab's parser, for the top level and every subcommand: defaults shown in ``--help``
    (``HelpFormatter``), and positionals before, between or after options at a leaf command
    (``predict embed --model default "a text"``, ``tokenize "a text" --pair ...``): argparse's
    intermixed parsing, which it supports only on parsers without subcommands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back into this method
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False
        if extras:  # named by the command that refused them, with its own usage
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        namespace._command = self.prog  # "bertlab bench speed": the name errors are given under
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    from bertlab import __version__
    from bertlab.explore.summary import HEADS

    p = ArgumentParser(prog="bertlab", description="A complete BERT in PyTorch.")
    p.add_argument("--version", action="version", version=f"bertlab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    demo = sub.add_parser("demo", help="run the bundled real checkpoint on a sentence")
    demo.add_argument("--model", default=BUNDLED_NAMES[0], help="model folder (default: bundled)")
    demo.add_argument("--text", default=DEMO_TEXT, help="the sentence to run")
    demo.add_argument("--sentence", help="the sentence to classify (default: ask, or an example)")
    demo.add_argument(
        "--epochs", type=float, default=2.0, help="fine-tuning epochs, where the cap holds them"
    )
    demo.add_argument(
        "--seconds",
        type=seconds,
        default=CAP_SECONDS,
        help="the cap on the fine-tuning, timing the machine and evaluating included: the run "
        f"is planned to the measured speed to fit in it (default {CAP_SECONDS:g})",
    )
    demo.add_argument("--output", help="fine-tuning run folder (default: a new temporary one)")
    demo.add_argument("--no-finetune", action="store_true", help="stop after the sentence run")
    demo.set_defaults(func=cmd_demo)

    summ = sub.add_parser("summary", help="layer-by-layer parameter table")
    summ.add_argument(
        "source",
        nargs="?",
        default="base",
        help=f"a preset ({', '.join(PRESETS)}), a config.json, or a model folder",
    )
    summ.add_argument("--head", default="base", choices=sorted(HEADS), help="which model")
    summ.add_argument("--vocab-size", type=int, help="override the vocabulary size")
    summ.add_argument("--num-labels", type=int, help="override the number of labels")
    summ.add_argument("--collapse", action="store_true", help="show one layer, then a subtotal")
    summ.set_defaults(func=cmd_summary)

    insp = sub.add_parser("inspect", help="take a part of the model apart")
    insp_sub = insp.add_subparsers(dest="what", required=True)
    emb = insp_sub.add_parser("embeddings", help="word + position + type = embedding, per token")
    emb.add_argument("text")
    emb.add_argument("--pair", help="a second segment (token type 1)")
    emb.add_argument("--model", default=BUNDLED_NAMES[0], help="model folder (default: bundled)")
    emb.add_argument("--dims", type=int, default=4, help="dimensions shown per vector")
    emb.set_defaults(func=cmd_inspect_embeddings)

    tokz = sub.add_parser("tokenize", help="show what the model receives for a text")
    tokz.add_argument("text")
    tokz.add_argument("--pair", help="a second segment (token type 1)")
    tokz.add_argument("--model", default=BUNDLED_NAMES[0], help="model folder (default: bundled)")
    tokz.add_argument("--max-length", type=int, help="truncate to this many tokens")
    tokz.set_defaults(func=cmd_tokenize)

    tv = sub.add_parser("train-vocab", help="train a WordPiece vocabulary on raw text")
    tv.add_argument("files", nargs="+", help="UTF-8 text files")
    tv.add_argument("-o", "--output", required=True, help="folder for vocab.txt")
    tv.add_argument("--vocab-size", type=int, default=30522)
    tv.add_argument("--min-frequency", type=int, default=2)
    tv.add_argument("--cased", action="store_true", help="keep case and accents")
    tv.set_defaults(func=cmd_train_vocab)

    prep = sub.add_parser("prepare", help="raw text -> sentence-pair shards for pre-training")
    prep.add_argument(
        "files",
        nargs="+",
        help="text, WikiText (.tokens) or JSON-lines files, raw or .gz/.zst; Parquet files; Arrow "
        "datasets (datasets' save_to_disk folders); folders of Parquet files; or globs of these",
    )
    prep.add_argument("-o", "--output", required=True, help="folder for the shards")
    prep.add_argument("--model", default=BUNDLED_NAMES[0], help="folder with the vocabulary")
    prep.add_argument("--max-seq-length", type=int, default=128)
    prep.add_argument("--short-seq-prob", type=float, default=0.1)
    prep.add_argument("--dupe-factor", type=int, default=1)
    prep.add_argument("--no-nsp", action="store_true", help="single segments, MLM only")
    prep.add_argument("--seed", type=int, default=12345)
    prep.add_argument("--workers", type=int, default=1)
    prep.add_argument("--shard-size", type=int, default=100_000, help="examples per shard")
    prep.add_argument("--text-column", default="text", help="Parquet and Arrow: the text column")
    prep.add_argument("--text-field", default="text", help="JSON lines: the text field")
    prep.add_argument("--overwrite", action="store_true")
    prep.add_argument(
        "--resume", action="store_true", help="continue an interrupted preparation in --output"
    )
    prep.set_defaults(func=cmd_prepare)

    add_task_parsers(sub)
    add_export_parsers(sub)
    add_convert_parsers(sub)
    add_explore_parsers(sub)
    add_serve_parsers(sub)

    add_bench_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """``bertlab ARGS``: the exit status is the command's (0 done, 1 a check failed), 2 for bad
    input (named on standard error before any work) and for a missing optional package (named
    with the extra that installs it), 130 for Ctrl-C, 141 when the reader of standard output
    went away (``bertlab tokenize ... | head -1``): quietly, as other tools."""
    argv = default_subcommand(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    args.argv = argv  # as given, for the command that resumes a stopped run
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit, where it can't be caught
        return code
    except ModuleNotFoundError as e:
        # An optional package a command reached without checking for it first: named, with
        # the extra that installs it. Any other missing module is a fault, and says so in full.
        module = (e.name or "").partition(".")[0]
        extra = extra_for(module)
        if extra is None:
            raise
        print(f"{args._command}: error: {missing_message([module], extra)}", file=sys.stderr)
        return 2
    except (
        ValueError,
        IndexError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
    ) as e:
        print(f"{args._command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Nothing more can reach the reader: point standard output at /dev/null so that the
        # interpreter's final flush finds nowhere to fail, and end as a process stopped by
        # SIGPIPE would (128 + 13).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"{args._command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

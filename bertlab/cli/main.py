"""``bertlab <verb>``: command-line arguments -> the library functions.

bertlab demo                          the bundled real checkpoint: parameters, a sentence run
bertlab summary [SOURCE] --head H     layer-by-layer parameter table of any size and head
bertlab inspect embeddings TEXT       the embedding layer taken apart, token by token
bertlab tokenize TEXT [--pair TEXT]   what the model receives: tokens, ids, types, offsets
bertlab train-vocab FILES -o DIR      a WordPiece vocabulary from raw text
bertlab prepare FILES -o DIR          raw text -> sentence-pair shards for pre-training
bertlab pretrain --data DIR -o RUN    masked LM + NSP pre-training (torchrun for many processes)
bertlab plot RUN                      a run's loss and accuracy curves to PNG
bertlab finetune {classify,tag,qa}    fine-tune on labelled data, evaluate, keep the best
bertlab predict TASK [TEXT ...]       fill-mask, embed, classify, tag, answer: args, file or stdin
bertlab bench [WORKLOAD ...]          speed side by side with transformers
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from bertlab.cli.tasks import add_task_parsers
from bertlab.files import BUNDLED_NAMES, resolve_model_dir
from bertlab.nn.config import PRESETS, resolve_source

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
    report dev accuracy, classify a sentence the user types."""
    import tempfile

    from bertlab.pipelines import pipeline
    from bertlab.train.finetune import FinetuneConfig, finetune

    samples = Path(__file__).parents[1] / "data" / "samples"
    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bertlab-demo-"))
    print(
        f"\nFine-tuning a sentiment classifier on the bundled SST-2 sample ({args.epochs:g} "
        f"epochs, at most {args.seconds:g} s of training), into {out}"
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
        max_seconds=args.seconds,
    )
    result = finetune(config, out, overwrite=args.output is not None)
    dev = result["dev"]
    print(
        f"Dev accuracy: {dev['accuracy']:.4f} on 1,000 held-out SST-2 sentences "
        f"(F1 {dev['f1']:.4f}, MCC {dev['mcc']:.4f}), after {result['steps']} steps in "
        f"{result['seconds']:.0f} s; the model is in {out / 'model'}"
    )
    classify = pipeline("classify", str(out / "model"))
    sentence = args.sentence
    if sentence is None and sys.stdin.isatty():
        sentence = input("\nType a sentence to classify (Enter for an example): ").strip()
    sentence = sentence or DEMO_REVIEW
    best = classify(sentence)[0]
    print(f"{sentence!r} -> {best['label']} ({best['score']:.3f})")
    return 0


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
    )
    meta = read_meta(out)
    print(
        f"wrote {out}: {meta['num_examples']:,} examples, {meta['num_tokens']:,} tokens "
        f"({meta['random_next']:,} with a random next segment) in {len(meta['shards'])} "
        f"shard(s); {meta['documents']:,} documents, {meta['documents_skipped']:,} empty ones "
        f"skipped, {meta['chunks_dropped']:,} pieces too short for a pair dropped"
    )
    return 0


# ============================================================================ bench
def cmd_bench(args: argparse.Namespace) -> int:
    from bertlab.bench.speed import (
        WORKLOADS,
        bench_int8,
        bench_model,
        bench_tokenizer,
        check_counts,
        machine,
        plot,
        tokenizer_texts,
    )

    check_counts(repeats=args.repeats, draws=args.draws, threads=args.threads)
    if args.workloads == ["pretrain"]:
        return _bench_pretrain(args)
    if args.workloads[:1] == ["finetune"]:
        return _bench_finetune(args)
    report: dict = {"machine": machine(), "results": []}
    workloads = args.workloads or ["tokenizer", "int8", *WORKLOADS]
    unknown = [w for w in workloads if w not in WORKLOADS and w not in ("tokenizer", "int8")]
    if unknown:
        raise ValueError(
            f"unknown workload {unknown[0]!r}; choose from tokenizer, {', '.join(WORKLOADS)}"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
        report["machine"]["torch_threads"] = args.threads
    device = "cuda" if args.device == "cuda" else "cpu"
    report["machine"]["device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    root = Path(__file__).resolve().parents[2]
    data = Path(args.data) if args.data else root.parent / "shared" / "data"
    texts, origin = tokenizer_texts(data if data.is_dir() else None, root / "tests" / "fixtures")
    folders = [m for m in args.models.split(",") if m not in PRESETS]
    folder = folders[0] if folders else "default"  # a real checkpoint and its vocabulary
    if "tokenizer" in workloads:
        r = bench_tokenizer(folder, texts, repeats=args.repeats)
        report["tokenizer"] = {"data": origin, **r}
        tps = r["tokens_per_s"]
        print(f"tokenizer  {r['texts']:,} texts ({origin})")
        print(
            f"  bertlab {tps['bertlab']:,.0f} tokens/s, transformers "
            f"{tps['transformers']:,.0f} tokens/s: {r['ratio']:.2f}x"
        )
    if "int8" in workloads:
        sample = list(dict.fromkeys(texts))[:1000]
        r = bench_int8(folder, sample, repeats=args.repeats)
        report["int8"] = {"model": folder, "data": origin, **r}
        print(
            f"int8 ({folder}, {len(sample)} texts): {r['speedup_over_float32']:.2f}x float32's "
            f"speed; embeddings' cosine to float32 mean {r['cosine_to_float32']['mean']:.3f} "
            f"(min {r['cosine_to_float32']['min']:.3f}); nearest neighbour kept "
            f"{r['nearest_neighbour_agreement']:.0%}"
        )
    header = f"{'model':<9}{'workload':<10}{'dtype':<10}{'bertlab tok/s':>14}{'hf tok/s':>11}"
    header += f"{'ratio':>8}{'peak MB b/hf':>15}{'useful/matmul b/hf':>20}"
    for model in args.models.split(","):
        for workload in (w for w in workloads if w in WORKLOADS):
            for dtype in args.dtypes.split(","):
                if not report["results"]:
                    print(header)
                r = bench_model(
                    model, workload, dtype, args.repeats, device, args.kernel, args.draws
                )
                report["results"].append(r)
                t, p, u = r["tokens_per_s"], r["peak_memory_mb"], r["useful_share_of_matmul"]
                print(
                    f"{model:<9}{workload:<10}{dtype:<10}{t['bertlab']:>14,.0f}"
                    f"{t['transformers']:>11,.0f}{r['ratio']:>7.2f}x"
                    f"{p['bertlab']:>8.0f}/{p['transformers']:<6.0f}"
                    f"{u['bertlab']:>12.0%}/{u['transformers']:.0%}",
                    flush=True,
                )
    _write_outputs(args, report, (lambda path: plot(report, path)) if report["results"] else None)
    return 0


def _write_outputs(args: argparse.Namespace, report: dict, draw) -> None:
    """The JSON report to --out and the chart (``draw(path)``, if there is one) to --plot."""
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.out}")
    if args.plot and draw is not None:
        draw(args.plot)
        print(f"chart: {args.plot}")


def _bench_pretrain(args: argparse.Namespace) -> int:
    from bertlab.bench.pretrain import bench_pretrain, plot_pretrain
    from bertlab.bench.speed import machine

    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.corpus and args.eval_corpus):
        raise ValueError("bench pretrain needs --corpus and --eval-corpus (bertlab prepare)")
    r = bench_pretrain(
        args.corpus,
        args.eval_corpus,
        args.long_corpus,
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        long_batch_size=args.long_batch_size,
        lr=args.lr or 1e-4,
        warmup=args.warmup_steps,
        segment=args.segment,
        eval_every=args.eval_every,
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
    _write_outputs(args, report, lambda path: plot_pretrain(r, path))
    return 0


def _bench_finetune(args: argparse.Namespace) -> int:
    from bertlab.bench.finetune import bench_finetune, format_report, plot_finetune
    from bertlab.bench.speed import machine
    from bertlab.metrics import format_conlleval
    from bertlab.train.finetune import TASKS, FinetuneConfig

    if len(args.workloads) != 2 or args.workloads[1] not in TASKS:
        raise ValueError(
            f"bench finetune takes one task, one of {', '.join(TASKS)}; got "
            f"{' '.join(args.workloads[1:]) or 'none'}"
        )
    if not args.train:
        raise ValueError("bench finetune needs --train (and --dev, or --dev-articles for qa)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = "default" if args.models == "default,base" else args.models  # one model here
    if "," in model:
        raise ValueError(f"bench finetune starts from one model; got --models {args.models}")
    config = FinetuneConfig(
        task=args.workloads[1],
        train=args.train,
        dev=args.dev,
        model=model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr or 5e-5,
        max_length=args.max_length,
        max_train_examples=args.max_train_examples,
        seed=args.seed,
        dropout=args.dropout,
        dev_articles=args.dev_articles,
    )
    r = bench_finetune(config, args.seconds)
    print(format_report(r))
    if "dev_full" in r["bertlab"]:
        for side in ("bertlab", "transformers"):
            print(f"\n{side}, best model, entities on the dev set:")
            print(format_conlleval(r[side]["dev_full"]))
    report = {"machine": machine(), "finetune": r}
    _write_outputs(args, report, lambda path: plot_finetune(r, path))
    return 0


# ============================================================================ main
def build_parser() -> argparse.ArgumentParser:
    from bertlab.bench.speed import DRAWS
    from bertlab.explore.summary import HEADS

    p = argparse.ArgumentParser(prog="bertlab", description="A complete BERT in PyTorch.")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the bundled real checkpoint on a sentence")
    demo.add_argument("--model", default=BUNDLED_NAMES[0], help="model folder (default: bundled)")
    demo.add_argument("--text", default=DEMO_TEXT, help="the sentence to run")
    demo.add_argument("--sentence", help="the sentence to classify (default: ask, or an example)")
    demo.add_argument("--epochs", type=float, default=2.0, help="fine-tuning epochs")
    demo.add_argument("--seconds", type=float, default=180.0, help="fine-tuning time budget")
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
    prep.add_argument("files", nargs="+", help="text, WikiText (.tokens) or JSON-lines files")
    prep.add_argument("-o", "--output", required=True, help="folder for the shards")
    prep.add_argument("--model", default=BUNDLED_NAMES[0], help="folder with the vocabulary")
    prep.add_argument("--max-seq-length", type=int, default=128)
    prep.add_argument("--short-seq-prob", type=float, default=0.1)
    prep.add_argument("--dupe-factor", type=int, default=1)
    prep.add_argument("--no-nsp", action="store_true", help="single segments, MLM only")
    prep.add_argument("--seed", type=int, default=12345)
    prep.add_argument("--workers", type=int, default=1)
    prep.add_argument("--shard-size", type=int, default=100_000, help="examples per shard")
    prep.add_argument("--overwrite", action="store_true")
    prep.set_defaults(func=cmd_prepare)

    add_task_parsers(sub)

    bench = sub.add_parser("bench", help="measure bertlab against transformers")
    bench.add_argument(
        "workloads",
        nargs="*",
        help="any of tokenizer, int8, variable, fixed128, fixed512, latency, "
        "train (default: all); or pretrain alone: a pre-training run on each "
        "side; or finetune TASK (classify, tag, qa): a fine-tuning run on each "
        "side for the same time budget",
    )
    bench.add_argument(
        "--models",
        default="default,base",
        help="comma-separated: model folders, 'default' (bundled) or presets",
    )
    bench.add_argument("--dtypes", default="float32,bfloat16")
    bench.add_argument(
        "--kernel",
        default="packed",
        choices=["packed", "sdpa", "eager"],
        help="bertlab's attention kernel (transformers runs SDPA)",
    )
    bench.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    bench.add_argument("--threads", type=int, help="torch threads for both sides")
    bench.add_argument("--data", help="shared data folder (default: ../shared/data if present)")
    bench.add_argument("--repeats", type=int, default=5)
    bench.add_argument(
        "--draws",
        type=int,
        default=DRAWS,
        help="batches of drawn lengths in each run of the variable workload "
        f"(seeds 0 to N-1; default {DRAWS})",
    )
    bench.add_argument("--out", help="write the JSON report here")
    bench.add_argument("--plot", help="write a bar chart of the ratios here (PNG)")
    pre = bench.add_argument_group("bench pretrain")
    pre.add_argument("--corpus", help="prepared corpus to train on")
    pre.add_argument("--long-corpus", help="prepared corpus for the last 10%% of the steps")
    pre.add_argument("--eval-corpus", help="prepared held-out corpus")
    pre.add_argument("--preset", default="mini")
    pre.add_argument("--steps", type=int, default=1000)
    pre.add_argument("--batch-size", type=int, default=32)
    pre.add_argument("--long-batch-size", type=int)
    pre.add_argument("--lr", type=float, help="default 1e-4 (pretrain), 5e-5 (finetune)")
    pre.add_argument("--warmup-steps", type=int, help="default: 1%% of the steps")
    pre.add_argument("--segment", type=int, default=50, help="steps per side, alternating")
    pre.add_argument("--eval-every", type=int, default=100)
    fine = bench.add_argument_group("bench finetune (also --models, --lr, --batch-size)")
    fine.add_argument("--train", help="the training file")
    fine.add_argument("--dev", help="the evaluation file")
    fine.add_argument("--dev-articles", type=int, default=0, help="qa: hold out N articles")
    fine.add_argument("--seconds", type=float, default=600, help="training budget per side")
    fine.add_argument("--epochs", type=float, default=3.0, help="the planned schedule")
    fine.add_argument("--max-length", type=int, help="tokens (default 128; qa 384)")
    fine.add_argument("--max-train-examples", type=int)
    fine.add_argument("--seed", type=int, default=0)
    fine.add_argument("--dropout", type=float, help="default: the model's own")
    bench.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"bertlab {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

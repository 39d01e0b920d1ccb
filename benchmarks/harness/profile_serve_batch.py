"""Where a 256-sentence embedding request's time goes in ``bertlab serve``: the model's batch
(``ServedModel.forward``) split into its parts, and the request's own CPU work beside it
(tokenizing, finishing the vectors, writing the JSON answer). The output of one run is kept in
benchmarks/profile-serve-batch-<cpu class>.txt, one file per class of CPU.
int8 is the uncompiled int8 server's model, calibrated on the bundled sample (``--calibration``
sentences of it, the server's 128 by default).

    python benchmarks/harness/profile_serve_batch.py [--dtype bfloat16|float32|int8] [--threads 2]
        [--sentences 256] [--repeat 20] [--plain TOKENS_PER_S [--ratio 3]] [--calibration 128]

The request is the one ``bertlab bench serve --workloads batch256`` sends first: the first
``--sentences`` bundled SST-2 dev sentences. The parts are timed by a wall-clock timer around
each call (every product, attention call and LayerNorm of the encoder, and the embeddings where
bertlab's AVX2 kernel computes them in one call), not by torch.profiler,
which on this workload reported the feed-forward's first product at three times its time. The
process keeps freed memory as the server does (``bertlab.heap.keep_freed_memory``).

``--plain`` takes another server's batch-256 throughput on this machine (tokens/s, from
``serve_peers.py`` beside this script) and gives the budget of a batch served ``--ratio`` times
as fast: its CPU time on the threads, less the products at the rates of the plain calls and the
request's own work, is what is left for everything else (attention, LayerNorm, the activations,
rounding to int8, embeddings, pooling, HTTP), set beside what everything else takes in the batch
now.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import torch.nn.functional as F

from bertlab.bench.speed import machine
from bertlab.data import sample_sentences
from bertlab.files import bundled_model_dir
from bertlab.heap import keep_freed_memory
from bertlab.nn import attention, avx2, cpu, precision
from bertlab.nn import products as seam
from bertlab.nn.activations import activation_of
from bertlab.nn.precision import CALIBRATION
from bertlab.serve.engine import MIN_CALIBRATION, ServedModel, calibration_texts

spent: dict[str, float] = collections.defaultdict(float)  # part -> seconds, summed
inside: list[str] = []  # the timed part now running, if any


def timed(name: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its wall time added to spent[name(*args, **kw)]; a timed part called from
    inside another is the outer part's time only (on the module route, for one, the attention
    projections are three seam.linear calls inside seam.projections), so no time counts twice."""

    def call(*args: Any, **kw: Any) -> Any:
        if inside:
            return fn(*args, **kw)
        inside.append("")
        start = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            spent[name(*args, **kw)] += time.perf_counter() - start
            inside.pop()

    return call


def product_name(
    layer: Any, x: torch.Tensor, act=None, dropout=None, residual=None, norm=None
) -> str:
    """The part a call of seam.linear(layer, x, act, dropout, residual, norm) is timed under:
    its product, with the activation, the residual sum or the layer norm applied inside it or
    right after."""
    spec = None if act is None else activation_of(act)  # (the pooler's tanh is in no table)
    extra = "" if act is None else f" + {spec.name if spec is not None else type(act).__name__}"
    extra += " + residual" if residual is not None else ""
    extra += " + LayerNorm" if norm is not None else ""
    return f"product {layer.in_features} -> {layer.out_features}{extra}"


def projections_name(layers: Any, x: torch.Tensor) -> str:
    """The part a call of seam.projections(layers, x) is timed under: one product."""
    return f"product {layers[0].in_features} -> {sum(lin.out_features for lin in layers)}"


def median_seconds(
    fn: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter, warmup=0
) -> float:
    """Median time of ``fn`` over ``repeat`` calls after ``warmup`` untimed ones, in seconds of
    ``clock`` (time.process_time: the CPU time of all the process's threads)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def product_shapes(config: Any) -> list[tuple[int, int]]:
    """(in, out) of each distinct product of an encoder layer: query/key/value together, the
    attention's output, the feed-forward's two."""
    h, i = config.hidden_size, config.intermediate_size
    return [(h, 3 * h), (h, h), (h, i), (i, h)]


def int8_call(tokens: int, k: int, n: int, g: torch.Generator) -> Callable[[], Any]:
    """One int8 product of ``tokens`` rows, ``k`` -> ``n``, on random values, as the model
    computes it on this CPU: an ``Int8Linear`` layer, whose weight ``precision.int8_weight``
    puts in the form the policy's kernel reads, the activations' rounding and scaling
    included."""
    if (why := precision.int8_supported()) is not None:
        raise SystemExit(f"int8 cannot run here: {why}")
    linear = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=g))
    layer = precision.Int8Linear(linear)
    x = torch.randn(tokens, k, generator=g)
    return lambda: layer(x)


def products_alone(model: ServedModel, tokens: int, dtype: str, repeat: int) -> dict[str, float]:
    """Each product shape of the encoder alone, as one plain call on ``tokens`` rows of random
    values in the served precision (for int8, bertlab's int8 product on this CPU's kernel:
    ``int8_call``; in float32 and bfloat16 the fastest of three weight layouts): seconds a
    call, by (in, out)."""
    seconds = {}
    g = torch.Generator().manual_seed(0)
    for k, n in product_shapes(model.config):
        if dtype == "int8":
            calls = [int8_call(tokens, k, n, g)]
        else:
            a = torch.randn(tokens, k, generator=g).to(getattr(torch, dtype))
            w = torch.randn(n, k, generator=g).to(a.dtype)
            wt = w.t().contiguous()
            calls = [
                lambda a=a, w=w: a @ w.t(),
                lambda a=a, wt=wt: a @ wt,
                lambda a=a, w=w: torch.nn.functional.linear(a, w),
            ]
        seconds[k, n] = min(median_seconds(call, repeat, warmup=3) for call in calls)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--plain", type=float, help="another server's tokens/s: the budget to beat it")
    p.add_argument("--ratio", type=float, default=3.0, help="times --plain (default 3)")
    p.add_argument(
        "--calibration",
        type=int,
        default=CALIBRATION,
        help=f"int8: bundled SST-2 sentences calibrated on (the server's {CALIBRATION})",
    )
    args = p.parse_args()
    if args.sentences < 1 or args.repeat < 1:
        p.error(f"--sentences and --repeat must be at least 1: {args.sentences}, {args.repeat}")
    if args.plain is not None and not (args.plain > 0 and args.ratio > 0):
        p.error(f"--plain and --ratio must be above 0: {args.plain}, {args.ratio}")
    if not MIN_CALIBRATION <= args.calibration <= CALIBRATION:
        p.error(f"--calibration must be between {MIN_CALIBRATION} and {CALIBRATION} sentences, "
                f"got {args.calibration}")  # fmt: skip
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    calibration = calibration_texts(None, args.calibration) if args.dtype == "int8" else None
    model = ServedModel("default", bundled_model_dir(), dtype=args.dtype, calibration=calibration)
    texts = sample_sentences(name="sst2_dev.tsv")[: args.sentences]
    rows = [row for e in model.encode(texts, "mean") for row in e.rows]
    tokens = sum(len(r) for r in rows)

    with torch.inference_mode():
        for _ in range(5):
            model.forward(rows)
        start = time.perf_counter()
        for _ in range(args.repeat):
            model.forward(rows)
        plain = (time.perf_counter() - start) / args.repeat
        # the same batches again, each part timed
        seam.linear = timed(product_name, seam.linear)
        seam.projections = timed(projections_name, seam.projections)
        kernel = attention.BACKENDS["packed"]
        attention.BACKENDS["packed"] = timed(lambda *a, **k: "attention (packed)", kernel)
        F.layer_norm = timed(lambda *a, **k: "LayerNorm", F.layer_norm)
        avx2.embed = timed(lambda *a, **k: "embeddings + LayerNorm", avx2.embed)
        start = time.perf_counter()
        for _ in range(args.repeat):
            model.forward(rows)
        whole = (time.perf_counter() - start) / args.repeat

    width = model.config.hidden_size  # the answer's vectors: one per sentence
    vectors = np.random.default_rng(0).standard_normal((len(texts), width)).astype(np.float32)
    work = {
        "tokenize (ServedModel.encode)": lambda: model.encode(texts, "mean"),
        "write the JSON answer (orjson)": lambda: orjson.dumps(
            vectors, option=orjson.OPT_SERIALIZE_NUMPY
        ),
    }

    m = machine()
    amx = "amx_bf16" in Path("/proc/cpuinfo").read_text()
    print(
        f"{m['cpu']} ({m['cores']} cores{', AMX' if amx else ''}), {args.threads} threads, "
        f"torch {m['torch']}, {args.dtype}"
    )
    print(f"{len(texts)} bundled SST-2 dev sentences, {tokens:,} tokens")
    print(f"the batch (ServedModel.forward): {1000 * plain:.1f} ms, {tokens / plain:,.0f} tokens/s")
    print(f"with every part timed: {1000 * whole:.1f} ms a batch")
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        ms = 1000 * seconds / args.repeat
        print(f"  {name:40s} {ms:7.2f} ms  {100 * ms / (1000 * whole):5.1f}%")
    rest = whole - sum(spent.values()) / args.repeat
    print(f"  {'the rest (embeddings, pooling, plan)':40s} {1000 * rest:7.2f} ms")
    print("the request's own CPU work (all threads), beside the batch:")
    own = 0.0  # the request's own work, CPU seconds
    for name, fn in work.items():
        seconds = median_seconds(fn, args.repeat, time.process_time)
        own += seconds
        print(f"  {name:40s} {1000 * seconds:7.2f} ms")
    alone = products_alone(model, tokens, args.dtype, args.repeat)
    layers = model.config.num_hidden_layers
    per_token = 2 * layers * sum(k * n for k, n in alone)  # the encoder's products, per token
    kind = f"int8 ({cpu.current().int8_kernel})" if args.dtype == "int8" else args.dtype
    print(f"each product shape alone, one plain call on {tokens:,} rows of random {kind}:")
    for (k, n), seconds in alone.items():
        print(f"  {f'one call {k} -> {n}':40s} {2 * tokens * k * n / seconds / 1e9:9.2f} GOP/s")
    floor = layers * sum(alone.values())
    print(
        f"the batch's products ({per_token / 1e6:.1f} MOP a token) at those rates: "
        f"{1000 * floor:.1f} ms, {tokens / floor:,.0f} tokens/s with nothing else taking time"
    )
    if args.plain is not None:
        products = sum(s for name, s in spent.items() if name.startswith("product")) / args.repeat
        budget(tokens, args, floor, own, products, whole)


def budget(
    tokens: int, args: argparse.Namespace, floor: float, own: float, products: float, whole: float
) -> None:
    """What a batch served ``args.ratio`` times as fast as ``args.plain`` leaves for everything
    but the products (see the module's docstring). Seconds in, milliseconds out; CPU time is wall
    time times the threads (the products and attention keep every thread busy)."""
    threads, target = args.threads, args.ratio * args.plain
    wall = tokens / target
    left = threads * (wall - floor) - own
    print(
        f"{args.ratio:g}x the plain server's {args.plain:,.0f} tokens/s: {target:,.0f} tokens/s, "
        f"this batch in {1000 * wall:.1f} ms on {threads} threads"
    )
    for name, seconds in (
        ("CPU time of the batch at that speed", threads * wall),
        ("the products at the plain calls' rates", threads * floor),
        ("the request's own work (above)", own),
        ("left for everything else", left),
        ("everything else in the batch now", threads * (whole - products)),
    ):
        print(f"  {name:40s} {1000 * seconds:7.1f} ms")


if __name__ == "__main__":
    main()

"""Data-parallel pre-training, measured on this machine and modelled for many: the
``pretrain-scaling-<machine class>.json`` records and the scaling table of the cluster guide
(docs/guides/cluster.md).

    python benchmarks/harness/pretrain_scaling.py --nproc 1,2 --rounds 3 \\
        --out benchmarks/pretrain-scaling-xeon-amx.json
    python benchmarks/harness/pretrain_scaling.py --model-only      # the model's full table
    python benchmarks/harness/pretrain_scaling.py --markdown        # the guide's table

Measured: ``bertlab pretrain`` under ``torchrun --standalone --nproc-per-node N`` (gloo, the
loopback), at the same global batch for every N, the machine's cores shared out
(``OMP_NUM_THREADS`` = cores / N), with the rounds of N taking turns so that the machine's
noise falls on all of them. The seconds of a step come from the run's own metrics (its
training seconds, steps after the first few); the run's checkpoints are sharded ones, written in
the background every ``--save-every`` steps. Then an all-reduce of the model's gradient bytes
over 2 gloo processes, alone, timed. On one machine the processes share its cores: this
shows that the processes give the same run and what the exchange costs, not a speedup.

Modelled (``scaling_model``): a step of data-parallel pre-training on N GPUs, one NIC each,
for BERT-base and BERT-large, with float32 and bfloat16 gradients: compute 6 x parameters x
tokens at a stated share of the H100's bfloat16 peak, a ring all-reduce of 2 (N - 1) / N x the
gradient bytes through the NIC, overlapped with the backward pass (2/3 of the compute), and a
cap on the global batch past which more GPUs shrink each GPU's batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "wikitext2_sample.tokens"

# ============================================================================ the model
PEAK_FLOPS = 989e12  # H100 SXM, bfloat16 dense (NVIDIA's datasheet; 1,979 with sparsity)
MFU = 0.40  # the share of the peak a tuned BERT step reaches (a stated assumption)
LINKS_GBIT = (25, 100, 400)  # one NIC per GPU: 25 and 100 Gb/s Ethernet, 400 Gb/s InfiniBand NDR
TOKENS_PER_GPU = 256 * 128  # phase 1: 256 sequences of 128 tokens per GPU per step
BATCH_CAP = 65_536  # sequences: the largest global batch BERT was trained at (LAMB, You et al.)
SEQ = 128
OVERLAP = 2 / 3  # the backward pass's share of the compute, which DDP's all-reduce can hide
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket
# Latency: each bucket's all-reduce also pays a latency per step of its algorithm. A flat ring
# takes 2 (N - 1) steps, which at hundreds of GPUs would cost more than its bytes; NCCL then
# uses trees (2 log2 N steps) with the same 2 x bytes / bandwidth, so the model does too.
HOP_LATENCY_S = 10e-6  # per step and bucket: NIC, switch and NCCL's software
NODES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def parameter_counts() -> dict[str, int]:
    """BERT-base and BERT-large with the pre-training heads (tied embeddings counted once),
    counted from bertlab's own modules (on the meta device: no memory)."""
    from bertlab.nn.config import BertConfig
    from bertlab.nn.heads import BertForPreTraining

    counts = {}
    for name in ("base", "large"):
        with torch.device("meta"):
            model = BertForPreTraining(BertConfig.preset(name))
        counts[f"bert-{name}"] = sum(p.numel() for p in model.parameters())
    return counts


def step_times(params: int, grad_bytes: int, n: int, gbit: float) -> dict[str, float]:
    """One data-parallel step on ``n`` GPUs (seconds): compute, all-reduce, exposed
    all-reduce, step, and the efficiency against perfect scaling."""
    sequences = min(TOKENS_PER_GPU // SEQ, BATCH_CAP // n)  # per GPU, under the global cap
    tokens = sequences * SEQ
    compute = 6 * params * tokens / (PEAK_FLOPS * MFU)
    size = params * grad_bytes
    buckets = math.ceil(size / BUCKET_BYTES)
    latency = 2 * math.ceil(math.log2(n)) * buckets * HOP_LATENCY_S
    ring = 2 * (n - 1) / n * size / (gbit * 1e9 / 8) + latency
    exposed = max(0.0, ring - OVERLAP * compute) if n > 1 else 0.0
    step = compute + exposed
    return {
        "sequences_per_gpu": sequences,
        "compute_s": compute,
        "allreduce_s": ring,
        "exposed_s": exposed,
        "step_s": step,
        "efficiency": compute / step,
        "tokens_per_s": n * tokens / step,
    }


def scaling_model() -> dict:
    """The table of the cluster guide: for each model, gradient precision, link and N."""
    counts = parameter_counts()
    rows = []
    for model, params in counts.items():
        for grads, width in (("float32", 4), ("bfloat16", 2)):
            for gbit in LINKS_GBIT:
                for n in NODES:
                    rows.append(
                        {"model": model, "gradients": grads, "gbit_s": gbit, "gpus": n}
                        | step_times(params, width, n, gbit)
                    )
    return {
        "assumptions": {
            "peak_flops": PEAK_FLOPS,
            "mfu": MFU,
            "tokens_per_gpu": TOKENS_PER_GPU,
            "seq": SEQ,
            "global_batch_cap_sequences": BATCH_CAP,
            "overlap_share_of_compute": OVERLAP,
            "bucket_bytes": BUCKET_BYTES,
            "hop_latency_s": HOP_LATENCY_S,
        },
        "parameters": counts,
        "rows": rows,
    }


def print_model(model: dict) -> None:
    print(f"{'model':<11}{'grads':<10}{'Gb/s':>5}{'GPUs':>6}{'seq/GPU':>8}{'compute':>9}"
          f"{'all-red.':>9}{'exposed':>9}{'eff.':>6}{'M tok/s':>9}")  # fmt: skip
    for r in model["rows"]:
        print(
            f"{r['model']:<11}{r['gradients']:<10}{r['gbit_s']:>5}{r['gpus']:>6}"
            f"{r['sequences_per_gpu']:>8}{r['compute_s'] * 1e3:>7.1f}ms"
            f"{r['allreduce_s'] * 1e3:>7.1f}ms{r['exposed_s'] * 1e3:>7.1f}ms"
            f"{r['efficiency']:>6.0%}{r['tokens_per_s'] / 1e6:>9.2f}"
        )


def markdown_table(model: dict, gpus: tuple[int, ...] = (2, 8, 64, 256, 1024)) -> str:
    """The cluster guide's table: per model, gradient precision and link, the compute of a step,
    the all-reduce at the largest N, and the efficiency (compute / step) at each N in ``gpus``;
    bold where the all-reduce alone takes longer than the step's compute."""
    head = "| model | gradients | link | compute / step | all-reduce (N large) | "
    head += " | ".join(f"N = {n}" for n in gpus) + " |"
    lines = [head, "| " + " | ".join(["---"] * (5 + len(gpus))) + " |"]
    by = {(r["model"], r["gradients"], r["gbit_s"], r["gpus"]): r for r in model["rows"]}
    for name in model["parameters"]:
        for grads in ("float32", "bfloat16"):
            for gbit in LINKS_GBIT:
                cells = []
                for n in gpus:
                    r = by[(name, grads, gbit, n)]
                    cell = f"{r['efficiency']:.0%}"
                    cells.append(f"**{cell}**" if r["allreduce_s"] > r["compute_s"] else cell)
                first, last = by[(name, grads, gbit, 1)], by[(name, grads, gbit, gpus[-1])]
                lines.append(
                    f"| {name} | {grads} | {gbit} Gb/s | {first['compute_s'] * 1e3:.1f} ms | "
                    f"{last['allreduce_s'] * 1e3:.1f} ms | " + " | ".join(cells) + " |"
                )
    return "\n".join(lines)


# ============================================================================ the measurement
def prepare_corpus(folder: Path, shards: int) -> Path:
    """The test fixture (WikiText-2's first articles) at 128 tokens, in ``shards`` shards."""
    import bertlab
    from bertlab.data.corpus import prepare

    probe = prepare(
        FIXTURE, bertlab.bundled_model_dir(), folder / "probe", max_seq_length=SEQ,
        shard_size=10**6, progress=False,
    )  # fmt: skip
    examples = json.loads((probe / "meta.json").read_text())["shards"][0]["examples"]
    size = math.ceil(examples / shards)
    while math.ceil(examples / size) != shards:
        size += 1
    return prepare(
        FIXTURE, bertlab.bundled_model_dir(), folder / "data", max_seq_length=SEQ,
        shard_size=size, progress=False,
    )  # fmt: skip


def run_pretrain(nproc: int, data: Path, out: Path, args: argparse.Namespace) -> dict:
    """One ``bertlab pretrain`` on ``nproc`` processes: seconds per step (steps after
    ``args.skip``), tokens per second, and its losses."""
    cores = os.cpu_count() or 1
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // nproc)), "PYTHONWARNINGS": "ignore"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "bertlab"]  # fmt: skip
    command += ["pretrain", "--data", str(data), "--model", args.model, "-o", str(out)]
    command += ["--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    command += ["--lr", "5e-4", "--dropout", "0", "--log-every", "1000"]
    command += ["--save-every", str(args.save_every), "--precision", args.precision]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ends = [r["train_seconds"] for r in rows]
    per_step = (ends[-1] - ends[args.skip - 1]) / (len(ends) - args.skip)
    tokens = rows[-1]["tokens_per_s"] * ends[-1]  # the run's real tokens
    return {
        "seconds_per_step": per_step,
        "tokens_per_s": tokens / len(rows) / per_step,
        "losses": [r["loss"] for r in rows],
    }


ALLREDUCE_WORKER = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
n, dtype, repeats = int(sys.argv[1]), getattr(torch, sys.argv[2]), int(sys.argv[3])
t = torch.ones(n, dtype=dtype)
dist.all_reduce(t)
dist.barrier()
t0 = time.perf_counter()
for _ in range(repeats):
    dist.all_reduce(t)
seconds = (time.perf_counter() - t0) / repeats
if dist.get_rank() == 0:
    print(seconds)
dist.destroy_process_group()
"""


def time_allreduce(numel: int, dtype: str, repeats: int) -> float:
    """Seconds of one all-reduce of ``numel`` values over 2 gloo processes on the loopback."""
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "allreduce.py"
        worker.write_text(ALLREDUCE_WORKER)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(worker)]  # fmt: skip
        command += [str(numel), dtype, str(repeats)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace) -> dict:
    from bertlab.bench.speed import machine
    from bertlab.nn import cpu
    from bertlab.nn.config import BertConfig
    from bertlab.nn.heads import BertForPreTraining

    nprocs = [int(n) for n in args.nproc.split(",")]
    shards = math.lcm(*nprocs) * 2
    with torch.device("meta"):
        params = sum(
            p.numel() for p in BertForPreTraining(BertConfig.preset(args.model)).parameters()
        )
    runs: dict[int, list[dict]] = {n: [] for n in nprocs}
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare_corpus(Path(tmp), shards)
        for r in range(args.rounds):
            order = nprocs[r % len(nprocs) :] + nprocs[: r % len(nprocs)]
            for n in order:
                out = Path(tmp) / f"run-{n}-{r}"
                runs[n].append(run_pretrain(n, data, out, args))
                seconds = runs[n][-1]["seconds_per_step"]
                print(f"round {r + 1}: {n} process(es) {seconds:.3f} s/step", flush=True)
    result = {n: {
        "seconds_per_step": [x["seconds_per_step"] for x in rs],
        "tokens_per_s": [x["tokens_per_s"] for x in rs],
        "median_seconds_per_step": statistics.median(x["seconds_per_step"] for x in rs),
        "median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in rs),
    } for n, rs in runs.items()}  # fmt: skip
    base = runs[nprocs[0]][0]["losses"]
    for n, rs in runs.items():  # every run, on any number of processes, is the same run
        result[n]["max_relative_loss_difference"] = max(
            abs(a - b) / abs(a) for x in rs for a, b in zip(base, x["losses"], strict=True)
        )
    allreduce = {}
    for dtype, width in (("float32", 4), ("bfloat16", 2)):
        seconds = time_allreduce(params, dtype, args.allreduce_repeats)
        allreduce[dtype] = {
            "bytes": params * width,
            "seconds": seconds,
            "bus_gbyte_s": 2 * (2 - 1) / 2 * params * width / seconds / 1e9,
        }
    return {
        "benchmark": "pretrain-scaling",
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", "benchmarks/harness/pretrain_scaling.py", *sys.argv[1:]]),
        "machine": machine()
        | {"cpu_flags": sorted(cpu.features().flags), "load_average_at_end": os.getloadavg()},
        "settings": {
            "model": args.model,
            "parameters": params,
            "steps": args.steps,
            "timed_steps": f"{args.skip + 1}..{args.steps}",
            "batch_size": args.batch_size,
            "seq": SEQ,
            "precision": args.precision,
            "save_every": args.save_every,
            "rounds": args.rounds,
            "shards": shards,
            "threads_per_process": {n: max(1, (os.cpu_count() or 1) // n) for n in nprocs},
            "backend": "gloo, loopback (torchrun --standalone)",
        },
        "processes": result,
        "allreduce_2_processes": allreduce,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", default="1,2", help="numbers of processes, comma-separated")
    p.add_argument("--model", default="mini", help="a preset")
    p.add_argument("--batch-size", type=int, default=16, help="global, per step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="first steps left out of the timing")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--allreduce-repeats", type=int, default=20)
    p.add_argument("--out", help="write the JSON record here")
    p.add_argument("--model-only", action="store_true", help="print the scaling model only")
    p.add_argument("--markdown", action="store_true", help="print the cluster guide's table")
    args = p.parse_args()
    model = scaling_model()
    if args.markdown:
        print(f"parameters: {model['parameters']}")
        print(markdown_table(model))
        return
    if args.model_only:
        print_model(model)
        return
    report = measure(args) | {"model": model}
    for n, r in report["processes"].items():
        print(f"{n} process(es): {r['median_seconds_per_step']:.3f} s/step, "
              f"{r['median_tokens_per_s']:,.0f} tokens/s; losses within "
              f"{r['max_relative_loss_difference']:.1e} of the first run")  # fmt: skip
    for dtype, r in report["allreduce_2_processes"].items():
        print(f"all-reduce of {r['bytes'] / 2**20:.1f} MiB ({dtype}) over 2 processes: "
              f"{r['seconds'] * 1e3:.1f} ms")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""int8's quality on the CPU at hand, on each int8 kernel it has: the mean embedding cosine of
the bundled model's int8 copy to its float32 self on real sentences, and, given a fine-tuned
classifier, its dev accuracy in float32 and int8 (``bertlab bench precision``). The record
holds the CPU's class and its limits (``bertlab.nn.cpu``), so a run under the libraries'
instruction-set limits (an AVX2 CPU simulated on a newer one) says so.

    python benchmarks/harness/int8_quality.py [--texts 1000] [--threads 2]
        [--model FINE_TUNED --train TRAIN.tsv --dev DEV.tsv --max-length 64] --out FILE.json

The int8 model is calibrated as ``bertlab bench runtimes`` calibrates it (128 bundled SST-2 dev
sentences); the sentences scored are the bundled SST-2 training sample's first ``--texts``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import calibration_batches
from bertlab.bench.speed import machine
from bertlab.data import sample_sentences
from bertlab.files import resolve_model_dir
from bertlab.nn import cpu
from bertlab.nn.precision import quantize_int8
from bertlab.pipelines import pipeline


def embeddings(texts: list[str], threads: int) -> dict:
    """Cosine of the int8 embeddings to float32's, on each int8 kernel this CPU has."""
    path = resolve_model_dir("default")
    tokenizer = BertTokenizer.from_pretrained(path)
    model = BertModel.from_pretrained(path).eval()
    reference = pipeline("embed", model, tokenizer=tokenizer, batch_size=32)(texts)
    here = cpu.current()
    kernels = {}
    for kernel in cpu.INT8_KERNELS:
        cpu._CURRENT[:] = [cpu.policy(cpu.features(), {"BERTLAB_INT8_KERNEL": kernel})]
        if cpu.current().int8_kernel is None:
            kernels[kernel] = {"unavailable": cpu.current().int8_why}
            continue
        start = time.perf_counter()
        q = quantize_int8(model, calibrate=calibration_batches(tokenizer))
        got = pipeline("embed", q, tokenizer=tokenizer, batch_size=32)(texts)
        cos = torch.nn.functional.cosine_similarity(
            torch.as_tensor(got), torch.as_tensor(reference)
        )
        kernels[kernel] = {
            "chosen_by_default": kernel == here.int8_kernel,
            "report_kernel": q.int8_report["kernel"],
            "int8_layers": len(q.int8_report["int8"]),
            "kept_float32": q.int8_report["kept_float32"],
            "cosine_mean": float(cos.mean()),
            "cosine_min": float(cos.min()),
            "share_at_least_0.995": float((cos >= 0.995).float().mean()),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(kernel, json.dumps(kernels[kernel]), file=sys.stderr, flush=True)
    cpu._CURRENT[:] = [here]
    return {"model": str(path), "texts": len(texts), "threads": threads, "kernels": kernels}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=1000, help="bundled SST-2 sentences scored")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="a fine-tuned SST-2 classifier folder (bench precision)")
    p.add_argument("--train", help="its training file (labels, calibration)")
    p.add_argument("--dev", help="its dev file, scored")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    if args.texts < 1:
        p.error(f"--texts must be at least 1, got {args.texts}")
    if bool(args.model) != bool(args.train and args.dev):
        p.error("--model, --train and --dev go together")
    torch.set_num_threads(args.threads)
    report = {
        "benchmark": "int8 quality",
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "cpu": cpu.current().describe(),
        "embeddings": embeddings(sample_sentences(args.texts, "sst2_train.tsv"), args.threads),
    }
    if args.model:
        from bertlab.bench.precision import bench_precision
        from bertlab.train.finetune import FinetuneConfig

        config = FinetuneConfig(task="classify", train=args.train, dev=args.dev,
                                model=args.model, max_length=args.max_length)  # fmt: skip
        report["classifier"] = bench_precision(config, ("float32", "int8"), progress=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("machine",)}, indent=1)[:4000])


if __name__ == "__main__":
    main()

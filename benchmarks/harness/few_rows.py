"""bertlab float32 with its products of few rows on MKL's packed product against the same model
with them on oneDNN's, and ONNX Runtime float32 beside both: the whole model, on the workloads
and runners of ``bertlab bench runtimes`` (real tokens per second, bundled model, sentence
embeddings), alternating in one process (``bertlab.bench.speed.alternate``), so the choice
bertlab's policy makes on this CPU (``cpu.current().few_rows``) is measured against the other
within one run.

    bertlab-mkl      the float32 model, products of at most FEW_ROWS rows on MKL's packed product
    bertlab-onednn   the same model, every product on oneDNN's (BERTLAB_FEW_ROWS=onednn)
    onnxruntime      ONNX Runtime float32 through its BERT optimizer, as in bench runtimes

Prints the process's resident memory with oneDNN's packed copy of the weights and with MKL's
beside it, then each system's median tokens/s and its median ratio to ONNX Runtime over the
rounds, per workload, and the median ratio of the two bertlab rows' times, round by round. The
record of a run is kept in benchmarks/few-rows-<cpu class>.txt.

    python benchmarks/harness/few_rows.py [--data ../shared/data] [--workloads batch-1,sorted]
        [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import paired
import torch

from bertlab.bench import runtimes
from bertlab.nn import cpu


def on_kernel(kernel: str, run):
    """``run`` with the policy's few-rows kernel set to ``kernel`` while it runs."""
    return paired.under(dataclasses.replace(cpu.current(), few_rows=kernel), run)


def resident_mib() -> float:
    """This process's resident memory (Linux), in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: list[str] | None = None) -> None:
    p, args, workloads = paired.arguments(__doc__, argv)
    if cpu.current().few_rows is None:
        p.error(f"float32 products do not take oneDNN's route here ({cpu.current().few_rows_why})")
    if not cpu.features().mkl:
        p.error("this PyTorch has no MKL packed product (torch.ops.mkl._mkl_linear)")
    model, tokenizer, texts, source = paired.setup(args)
    folder = tempfile.TemporaryDirectory(prefix="few-rows-")  # removed when main returns
    work = Path(folder.name)
    bertlab = runtimes.make_runner("bertlab-fp32", model, work, args.threads)
    ort = runtimes.make_runner("onnxruntime-fp32", model, work, args.threads)
    first = runtimes.batches(tokenizer, texts[:1], "batch-1")[0]
    with torch.inference_mode():
        on_kernel("onednn", lambda: bertlab(first))()
        onednn_only = resident_mib()
        on_kernel("mkl", lambda: bertlab(first))()
        both = resident_mib()
    paired.header(args, f"policy's few-rows kernel {cpu.current().few_rows}", source)
    print(f"resident memory: {onednn_only:.0f} MiB with oneDNN's packed weights, {both:.0f} MiB "
          f"with MKL's beside them (+{both - onednn_only:.0f} MiB)")  # fmt: skip

    def runs(batches: list[dict]) -> dict:
        return {
            "bertlab-mkl": on_kernel("mkl", paired.each(bertlab, batches)),
            "bertlab-onednn": on_kernel("onednn", paired.each(bertlab, batches)),
            "onnxruntime": paired.each(ort, batches),
        }

    against = [("bertlab-mkl", "bertlab-onednn")]
    paired.compare(tokenizer, texts, workloads, args.rounds, runs, "onnxruntime", against)


if __name__ == "__main__":
    main()

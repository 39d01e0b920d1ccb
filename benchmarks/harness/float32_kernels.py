"""bertlab float32 on bertlab's AVX2 kernels (sgemm-avx2: the products, GELU inside them, and the
attention of sequences of at most 64 tokens) against the same model on oneDNN's products and
PyTorch's attention and GELU, and ONNX Runtime float32 beside both: the whole model, on the
workloads and runners of ``bertlab bench runtimes`` (real tokens per second, bundled model,
sentence embeddings), alternating in one process (``bertlab.bench.speed.alternate``), so the choice
bertlab's policy makes on this CPU (``cpu.current().float32_kernel``) is measured against the
other within one run.

    bertlab-sgemm    the float32 model on bertlab's AVX2 kernels (bertlab.nn.avx2)
    bertlab-sgemm512 the same, its products in the kernel's AVX-512F blocks (sgemm-avx512; where
                     the CPU has AVX-512F, else left out, saying so)
    bertlab-onednn   the same model, its products on oneDNN's (BERTLAB_FLOAT32_KERNEL=onednn),
                     its attention and GELU on PyTorch's
    onnxruntime      ONNX Runtime float32 through its BERT optimizer, as in bench runtimes

Prints each system's median tokens/s and its median ratio to ONNX Runtime over the rounds, per
workload, and the median ratio of the bertlab rows' times, round by round. The record of a
run is kept in benchmarks/float32-kernels-<cpu class>.txt.

    python benchmarks/harness/float32_kernels.py [--data ../shared/data]
        [--workloads batch-1,sorted] [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import paired
import torch

from bertlab.bench import runtimes
from bertlab.nn import avx2, cpu


def on_kernel(kernel: str, run):
    """``run`` with the policy's float32 kernel set to ``kernel`` while it runs."""
    return paired.under(dataclasses.replace(cpu.current(), float32_kernel=kernel), run)


def main(argv: list[str] | None = None) -> None:
    p, args, workloads = paired.arguments(__doc__, argv)
    if cpu.current().float32_kernel is None:
        p.error(f"float32 products do not take oneDNN's route here "
                f"({cpu.current().float32_kernel_why})")  # fmt: skip
    if (why := avx2.load()) is not None:
        p.error(f"the sgemm-avx2 kernel cannot run here: {why}")
    model, tokenizer, texts, source = paired.setup(args)
    folder = tempfile.TemporaryDirectory(prefix="float32-kernels-")  # removed when main returns
    work = Path(folder.name)
    bertlab = runtimes.make_runner("bertlab-fp32", model, work, args.threads)
    ort = runtimes.make_runner("onnxruntime-fp32", model, work, args.threads)
    paired.header(args, f"policy's float32 kernel {cpu.current().float32_kernel}", source)
    systems = {"bertlab-sgemm": "sgemm-avx2", "bertlab-onednn": "onednn"}
    against = [("bertlab-sgemm", "bertlab-onednn")]
    if "avx512_f" in cpu.features().flags:
        systems = {"bertlab-sgemm512": "sgemm-avx512", **systems}
        against = [("bertlab-sgemm512", "bertlab-sgemm"), ("bertlab-sgemm512", "bertlab-onednn"),
                   *against]  # fmt: skip
    else:
        print("bertlab-sgemm512 left out: this CPU has no AVX-512F")

    def runs(batches: list[dict]) -> dict:
        each = {name: on_kernel(kernel, paired.each(bertlab, batches))
                for name, kernel in systems.items()}  # fmt: skip
        return {**each, "onnxruntime": paired.each(ort, batches)}

    with torch.inference_mode():  # (each kernel's weights packed before the rounds)
        first = runtimes.batches(tokenizer, texts[:1], "batch-1")[0]
        for kernel in systems.values():
            on_kernel(kernel, lambda: bertlab(first))()
    paired.compare(tokenizer, texts, workloads, args.rounds, runs, "onnxruntime", against)


if __name__ == "__main__":
    main()

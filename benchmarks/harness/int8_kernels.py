"""bertlab int8 on every int8 kernel this CPU can run, and ONNX Runtime int8 beside them: the
whole model, on the workloads and runners of ``bertlab bench runtimes`` (real tokens per second,
bundled model calibrated as there, sentence embeddings), alternating in one process
(``bertlab.bench.speed.alternate``), so the kernel the policy chooses for this CPU class
(``cpu.current().int8_kernel``) is measured against the others within one run.

    bertlab-<kernel>  the int8 model, its products on that kernel (``BERTLAB_INT8_KERNEL``), with
                      the activation bits the policy gives that kernel here; one model each, so
                      each keeps its own prepacked weights
    onnxruntime       ONNX Runtime int8 (dynamic quantization), as in bench runtimes

Kernels this CPU cannot run are listed with the reason and not timed. Prints each system's
median tokens/s and its median ratio to ONNX Runtime over the rounds, per workload, and each
other kernel's time over the chosen one's, round by round. The record of a run is kept in
benchmarks/int8-kernels-<cpu class>.txt.

    python benchmarks/harness/int8_kernels.py [--data ../shared/data] [--workloads batch-1,sorted]
        [--threads 2] [--rounds 9]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import paired

from bertlab.bench import runtimes
from bertlab.nn import cpu


def kernels() -> tuple[dict[str, cpu.Policy], dict[str, str]]:
    """The policy with each int8 kernel this CPU runs forced, by kernel, and why each other
    kernel cannot run here."""
    runnable, refused = {}, {}
    for kernel in cpu.INT8_KERNELS:
        policy = cpu.policy(cpu.features(), {"BERTLAB_INT8_KERNEL": kernel})
        if policy.int8_kernel is None:
            refused[kernel] = policy.int8_why or "no int8 kernel"
        else:
            runnable[kernel] = policy
    return runnable, refused


def main(argv: list[str] | None = None) -> None:
    p, args, workloads = paired.arguments(__doc__, argv)
    chosen = cpu.current().int8_kernel
    if chosen is None:
        p.error(f"int8 cannot run here: {cpu.current().int8_why}")
    runnable, refused = kernels()
    model, tokenizer, texts, source = paired.setup(args)
    with tempfile.TemporaryDirectory(prefix="int8-kernels-") as folder:
        work = Path(folder)
        make = runtimes.make_runner
        runners = {
            k: paired.under(policy, lambda: make("bertlab-int8", model, work, args.threads))()
            for k, policy in runnable.items()
        }
        ort = runtimes.make_runner("onnxruntime-int8", model, work, args.threads)
        paired.header(args, f"the policy's int8 kernel {chosen}", source)
        for k, policy in runnable.items():
            print(f"  {k}: activations -{policy.int8_levels}..{policy.int8_levels}")
        for k, why in refused.items():
            print(f"  {k}: not run: {why}")

        def runs(batches: list[dict]) -> dict:
            timed = {
                f"bertlab-{k}": paired.under(policy, paired.each(runners[k], batches))
                for k, policy in runnable.items()
            }
            return {**timed, "onnxruntime": paired.each(ort, batches)}

        against = [(f"bertlab-{k}", f"bertlab-{chosen}") for k in runnable if k != chosen]
        paired.compare(tokenizer, texts, workloads, args.rounds, runs, "onnxruntime", against)


if __name__ == "__main__":
    main()

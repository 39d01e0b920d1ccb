"""``bertlab bench memory``: what gradient checkpointing saves in a training step, on bertlab
and on transformers, with the same weights and batch.

Three figures per side and setting: the activation memory autograd holds for the backward pass
(every tensor saved for it, plus, with checkpointing, each layer's input, which the checkpoint
keeps), the peak memory of the whole step (a fresh process's peak resident set on the CPU,
``torch.cuda.max_memory_allocated`` on a GPU), and the median step time. The gradients with and
without checkpointing are compared too (largest absolute difference).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bertlab.bench.speed import _load_pair, check_counts, machine, require_transformers


def make_training_batch(vocab_size: int, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Random ids, 15% of the positions as MLM targets, NSP labels: a fixed pre-training batch."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(
        1000 if vocab_size > 2000 else 5, vocab_size, (batch_size, seq_len), generator=g
    )
    chosen = torch.rand(batch_size, seq_len, generator=g) < 0.15
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": torch.where(chosen, ids, torch.full_like(ids, -100)),
        "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g),
    }


def step_activations(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[int, Any]:
    """One training forward: (bytes autograd keeps for the backward pass, the output)."""
    params = {p.data_ptr() for p in model.parameters()}
    held: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            held[t.data_ptr()] = t.untyped_storage().nbytes()
        return t

    inputs: dict[int, int] = {}

    def keep_input(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        inputs[x.data_ptr()] = x.untyped_storage().nbytes()

    checkpointing = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    hooks = []
    if checkpointing:  # the checkpoint keeps each layer's input (not through autograd's hooks)
        layers = [m for m in model.modules() if type(m).__name__ == "BertLayer"]
        hooks = [layer.register_forward_pre_hook(keep_input) for layer in layers]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch)
    for h in hooks:
        h.remove()
    return sum(held.values()) + sum(inputs.values()), out


# One training step in a fresh interpreter; prints its peak resident set (MB).
_CHILD = """
import resource, sys, torch
from bertlab.bench.memory import make_training_batch
torch.set_num_threads(1)
directory, side, checkpointing, batch_size, seq_len = sys.argv[1:]
if side == "bertlab":
    from bertlab.nn.heads import BertForPreTraining
else:
    from transformers import BertForPreTraining
model = BertForPreTraining.from_pretrained(directory).train()
if checkpointing == "on":
    model.gradient_checkpointing_enable()
batch = make_training_batch(model.config.vocab_size, int(batch_size), int(seq_len))
model(**batch).loss.backward()
try:  # this process's own high-water mark (ru_maxrss would also count the parent's at fork)
    status = open("/proc/self/status").read()
    print(int(status.split("VmHWM:")[1].split()[0]) / 1024)
except (OSError, IndexError):
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def peak_rss_mb(
    directory: Path, side: str, checkpointing: bool, batch_size: int, seq_len: int
) -> float:
    """The peak resident set (MB) of a fresh process that loads the model from ``directory``
    and runs one training step: weights, gradients and the step's activations."""
    args = [str(directory), side, "on" if checkpointing else "off", str(batch_size), str(seq_len)]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def bench_checkpointing(
    model: str = "base",
    batch_size: int = 8,
    seq_len: int = 128,
    repeats: int = 3,
    device: str = "cpu",
) -> dict[str, Any]:
    require_transformers()
    check_counts(batch_size=batch_size, seq_len=seq_len, repeats=repeats)
    ours, ref = _load_pair(model, "training", "packed")
    if seq_len > ours.config.max_position_embeddings:
        raise ValueError(
            f"seq_len {seq_len} is longer than the model's max_position_embeddings "
            f"({ours.config.max_position_embeddings})"
        )
    folder = tempfile.TemporaryDirectory(prefix="bertlab-bench-memory-")  # gone on return
    directory = Path(folder.name)
    ours.save_pretrained(directory)
    batch = make_training_batch(ours.config.vocab_size, batch_size, seq_len)
    on_device = {k: v.to(device) for k, v in batch.items()}
    rows = []
    for side, m in (("bertlab", ours), ("transformers", ref)):
        m.to(device).train()
        grads = {}
        for checkpointing in (False, True):
            if checkpointing:
                m.gradient_checkpointing_enable()
            else:
                m.gradient_checkpointing_disable()
            m.zero_grad()
            torch.manual_seed(0)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            held, out = step_activations(m, on_device)
            out.loss.backward()
            grads[checkpointing] = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
            if device == "cuda":
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**20
            else:
                peak = peak_rss_mb(directory, side, checkpointing, batch_size, seq_len)
            times = []
            for _ in range(repeats):
                m.zero_grad()
                start = time.perf_counter()
                m(**on_device).loss.backward()
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            rows.append(
                {
                    "side": side,
                    "checkpointing": checkpointing,
                    "activation_mb": held / 2**20,
                    "peak_mb": peak,
                    "step_s": statistics.median(times),
                }
            )
        m.gradient_checkpointing_disable()
        diff = max((grads[True][n] - g).abs().max().item() for n, g in grads[False].items())
        rows[-1]["max_grad_difference"] = diff
    return {
        "benchmark": "gradient checkpointing: one training step (MLM + NSP)",
        "model": model,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "device": device,
        "machine": machine(),
        "results": rows,
    }

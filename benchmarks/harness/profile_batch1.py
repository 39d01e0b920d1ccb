"""Where the time goes in one short sentence (batch 1) through the bundled model: the median
latency over 200 calls and torch.profiler's operator table over 50. Prints both; the before and
after of the batch-1 work are kept in benchmarks/ (profile-batch1-*.txt).

Where bertlab's AVX2 kernels run (bertlab/nn/avx2.py: its C functions are called through
ctypes, out of the profiler's sight), it also prints the time spent inside them a run, by
kernel, and the median of the same forward with every kernel call returning at once (its
outputs left unwritten): what the forward costs around the kernels, in Python and PyTorch's
operators.

    python benchmarks/harness/profile_batch1.py [--threads 2] [--dtype float32|bfloat16|int8]
        [--compiled] [--batch 1] [--onnxruntime]

int8 is the model quantize_int8 makes, calibrated as ``bertlab bench runtimes`` calibrates it.
``--compiled`` times bertlab.nn.compiled.Compiled(model) instead. Its program's kernels are
called from C++, out of the profiler's sight, so the operator table is taken on the same graph
built by torch.compile without the C++ wrapper (the same kernels, called from Python, each
generated one named in the table; its per-call overhead is not Compiled's).
Uncompiled, it then replaces each product kernel's call by a read of its weights (one byte a
cache line, by a few lines of C built here with ``cc``), in alternating rounds against the real
forward, the forward whose kernel calls return at once, and the same reads alone: what the
Python and PyTorch code between the kernels costs once the weights, streamed from memory by
every product, have pushed its code and data out of the caches.
Then it times the forward's first stages (the input checks, the layout, the
embeddings) and the encoder inside 300 back-to-back forwards and each alone, called again and
again on the same inputs, and then alone after a sweep of 64 MiB of memory before each call:
what an operation costs when the products before it have pushed its code and data out of the
CPU's caches.
``--onnxruntime`` times ONNX Runtime instead, on the file ``bertlab bench runtimes`` gives it
(float32 through its BERT optimizer, or int8 quantized dynamically), and sums its own profile
per operator type over 50 calls: the same sentence, the same threads, the other side's table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch._inductor import config as inductor_config
from torch.profiler import ProfilerActivity, profile

from bertlab import BertModel, BertTokenizer
from bertlab.bench.runtimes import calibration_batches, onnxruntime_runner
from bertlab.bench.speed import machine
from bertlab.nn import avx2, products
from bertlab.nn import model as model_module
from bertlab.nn.compiled import Compiled
from bertlab.nn.packing import aligned_export
from bertlab.nn.precision import quantize_int8

SWEEP_MIB = 64  # more than the L3 cache a core of the project's machines can hold
SENTENCE = (
    "The European Commission said on Thursday it disagreed with German advice to consumers "
    "to shun British lamb."
)


def onnxruntime_profile(tok, threads: int, precision: str, batch: int) -> None:
    """The median latency and ONNX Runtime's own profile, summed per operator type."""
    import onnxruntime as ort

    from bertlab.files import resolve_model_dir

    inputs = {k: v.numpy() for k, v in tok([SENTENCE] * batch, return_tensors="pt").items()}
    with tempfile.TemporaryDirectory() as tmp:
        onnxruntime_runner(resolve_model_dir("default"), Path(tmp), precision, threads)
        path = Path(tmp) / ("ort-int8.onnx" if precision == "int8" else "ort-optimized.onnx")

        def session(profiled: bool) -> ort.InferenceSession:  # as bench runtimes opens it
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
            options.enable_profiling = profiled
            options.profile_file_prefix = str(Path(tmp) / "ort-profile")
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        timed = session(profiled=False)
        feed = {i.name: inputs[i.name] for i in timed.get_inputs()}
        for _ in range(20):
            timed.run(None, feed)
        times = []
        for _ in range(200):
            start = time.perf_counter()
            timed.run(None, feed)
            times.append(time.perf_counter() - start)
        profiling = session(profiled=True)
        for _ in range(50):
            profiling.run(None, feed)
        events = json.loads(Path(profiling.end_profiling()).read_text())
    per_op: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]].append(e["dur"])
    m = machine()
    print(f"{m['cpu']}, {threads} threads, onnxruntime {ort.__version__}, {precision}")
    median = statistics.median(times) * 1e3
    print(f"{batch} x {inputs['input_ids'].shape[1]} tokens: median {median:.2f} ms")
    total = sum(sum(v) for v in per_op.values())
    print(f"{'operator type':>28}  {'share':>6}  {'us per run':>15}  {'calls per run':>18}")
    for op, durations in sorted(per_op.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"{op:>28}  {sum(durations) / total:6.1%}  {sum(durations) / 50:15.1f}  "
            f"{len(durations) / 50:18.0f}"
        )
    print(f"{'all operators':>28}  {1:6.1%}  {total / 50:15.1f}")


def median_ms(run, batch: dict, calls: int = 200) -> float:
    """The median time of ``run(**batch)`` over ``calls`` calls after 20 untimed ones, in ms."""
    with torch.inference_mode():
        for _ in range(20):
            run(**batch)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            run(**batch)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernels_share(run, batch: dict) -> None:
    """The time inside bertlab's AVX2 kernels a run (each C function wrapped in a timer), and
    the forward's median with their calls returning at once."""
    why = avx2.load()
    if why is not None:
        print(f"bertlab's AVX2 kernels do not run here: {why}")
        return
    lib = avx2._kernels()
    names = ("sgemm", "qgemm", "attention")
    real = {name: getattr(lib, name) for name in names}
    spent = {name: [0.0, 0] for name in names}

    def timed(name: str):
        def call(*args):
            start = time.perf_counter()
            result = real[name](*args)
            spent[name][0] += time.perf_counter() - start
            spent[name][1] += 1
            return result

        return call

    try:
        for name in names:
            setattr(lib, name, timed(name))
        with torch.inference_mode():
            for _ in range(10):
                run(**batch)
            spent.update({name: [0.0, 0] for name in names})
            for _ in range(100):
                run(**batch)
        for name in names:
            setattr(lib, name, lambda *args: 0)
        idle = median_ms(run, batch)
    finally:
        for name in names:
            setattr(lib, name, real[name])
    parts = ", ".join(
        f"{name} {t * 10:.2f} ms in {n // 100} calls" for name, (t, n) in spent.items() if n
    )
    total = sum(t for t, _ in spent.values()) * 10
    print(f"inside bertlab's AVX2 kernels: {total:.2f} ms a run ({parts or 'none called'})")
    print(f"the same forward with the kernels' calls returning at once: median {idle:.2f} ms")


READER = r"""
#include <stdint.h>
/* one byte of every 64-byte cache line of n bytes at p, summed so that no load is dropped */
int64_t bertlab_read(const unsigned char *p, int64_t n) {
  int64_t s = 0;
  for (int64_t i = 0; i < n; i += 64) s += p[i];
  return s;
}
"""


def weights_read(run, batch: dict, rounds: int = 15, calls: int = 30) -> None:
    """The forward with each product's kernel call replaced by a read of that product's weights
    (sgemm: ceil(n/16)*16 x k floats; qgemm: ceil(n/16)*16 x ceil(k/4)*4 bytes; attention,
    which reads no weights, returning at once; the embeddings' kernel runs as it is), against
    the real forward, the forward whose calls return at once, and the same reads alone,
    replayed in the same order, in ``rounds`` alternating rounds of ``calls`` calls each
    (medians). Around the kernels, cache-cold: the reads within the forward less the reads
    alone."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or avx2.load() is not None:
        print("weights read in place of the kernels: not measured (no C compiler, or no kernels)")
        return
    lib = avx2._kernels()
    names = ("sgemm", "qgemm", "attention")
    real = {name: getattr(lib, name) for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        source, built = Path(tmp) / "read.c", Path(tmp) / "read.so"
        source.write_text(READER)
        subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(built), str(source)],
                       check=True)  # fmt: skip
        read = ctypes.CDLL(str(built)).bertlab_read
    read.argtypes, read.restype = (ctypes.c_void_p, ctypes.c_int64), ctypes.c_int64
    reads: list[tuple[int, int]] = []  # (address, bytes) of every product's call so far

    def sgemm(x, rows, k, panels, n, *rest):
        reads.append((panels, -(-n // 16) * 16 * k * 4))
        read(*reads[-1])
        return 0

    def qgemm(x, rows, k, unsmooth, levels, vnni, panels, corr, scale, n, *rest):
        reads.append((panels, -(-n // 16) * 16 * -(-k // 4) * 4))
        read(*reads[-1])
        return 0

    at_once = {name: (lambda *args: 0) for name in names}
    reading = {"sgemm": sgemm, "qgemm": qgemm, "attention": at_once["attention"]}

    def timed(kernels: dict | None) -> float:
        for name in names:
            setattr(lib, name, real[name] if kernels is None else kernels[name])
        return median_ms(run, batch, calls)

    def replay() -> None:
        for address, size in one:
            read(address, size)

    times: dict[str, list[float]] = defaultdict(list)
    try:
        timed(reading)
        one = reads[-(len(reads) // (20 + calls)) :]  # (the last forward's reads)
        for _ in range(rounds):
            times["forward"].append(timed(None))
            times["at once"].append(timed(at_once))
            times["reads within"].append(timed(reading))
            times["reads alone"].append(median_ms(lambda **_: replay(), batch, calls))
    finally:
        for name in names:
            setattr(lib, name, real[name])
    cold = [w - a for w, a in zip(times["reads within"], times["reads alone"], strict=True)]
    mib = sum(size for _, size in one) / 2**20
    print(
        f"weights read in place of the kernels ({len(one)} reads, {mib:.1f} MiB a forward; "
        f"{rounds} rounds of {calls} calls, medians, ms; quartiles of the rounds):"
    )
    rows = [*times.items(), ("around the kernels, cache-cold (within - alone)", cold)]
    for name, values in rows:
        q = statistics.quantiles(values, n=4)
        print(f"  {name:>48}  {statistics.median(values):6.2f}  ({q[0]:.2f}-{q[2]:.2f})")
    extra = [c - a for c, a in zip(cold, times["at once"], strict=True)]
    print(f"  {'cache-cold less at once, round by round':>48}  {statistics.median(extra):6.2f}")


def stages(model, batch: dict) -> None:
    """The forward's stages inside back-to-back forwards, alone, and alone after a sweep of
    SWEEP_MIB of memory: medians in microseconds."""
    config, ids = model.config, batch["input_ids"]
    mask, types = batch["attention_mask"], batch["token_type_ids"]
    B, T = ids.shape
    spare = products.row_rounding(model.embeddings.word_embeddings.weight)
    kernel = config.attn_implementation
    with torch.inference_mode():
        layout = model_module.enter(kernel, mask, B, T, ids.device, spare)
        tokens = layout.inputs(ids, types, None, None)
        x = layout.grow(model.embeddings(*tokens))
    alone = {
        "input checks": lambda: model_module.check_inputs(config, ids, mask, types, None, None),
        "layout": lambda: model_module.enter(kernel, mask, B, T, ids.device, spare),
        "embeddings": lambda: model.embeddings(*tokens),
        "encoder": lambda: model.encoder(x, layout, False, False),
    }
    inside: dict[str, list[float]] = defaultdict(list)

    def timed(name: str, f):
        def call(*args, **kwargs):
            start = time.perf_counter()
            result = f(*args, **kwargs)
            inside[name].append((time.perf_counter() - start) * 1e6)
            return result

        return call

    saved = (model_module.check_inputs, model_module.enter)
    model_module.check_inputs = timed("input checks", saved[0])
    model_module.enter = timed("layout", saved[1])
    model.embeddings.forward = timed("embeddings", model.embeddings.forward)
    model.encoder.forward = timed("encoder", model.encoder.forward)
    try:
        with torch.inference_mode():
            for _ in range(300):
                start = time.perf_counter()
                model(**batch)
                inside["forward"].append((time.perf_counter() - start) * 1e6)
    finally:
        model_module.check_inputs, model_module.enter = saved
        del model.embeddings.forward, model.encoder.forward  # (the instances' own again)
    sweep = torch.zeros(SWEEP_MIB * 2**20 // 4)

    def median_us(f, swept: bool, calls: int) -> float:
        times = []
        with torch.inference_mode():
            for i in range(calls + 20):
                if swept:
                    sweep.add_(1.0)
                start = time.perf_counter()
                f()
                if i >= 20:
                    times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)

    print(f"stage (us): inside 300 forwards, alone, alone after a {SWEEP_MIB} MiB sweep")
    for name, f in alone.items():
        calls = 50 if name == "encoder" else 300
        hot, cold = median_us(f, False, calls), median_us(f, True, calls)
        within = statistics.median(inside[name][20:])
        print(f"{name:>14}  {within:8.1f}  {hot:8.1f}  {cold:8.1f}  ({within / hot:.1f}x alone)")
    print(f"{'forward':>14}  {statistics.median(inside['forward'][20:]):8.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--compiled", action="store_true", help="time Compiled(model)")
    p.add_argument("--batch", type=int, default=1, help="the sentence this many times (1)")
    p.add_argument("--onnxruntime", action="store_true", help="profile ONNX Runtime instead")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained("default")
    if args.onnxruntime:
        if args.dtype == "bfloat16" or args.compiled:
            p.error("--onnxruntime runs float32 or int8, uncompiled")
        return onnxruntime_profile(tok, args.threads, args.dtype, args.batch)
    dtype = "float32" if args.dtype == "int8" else args.dtype
    model = BertModel.from_pretrained("default", dtype=dtype, add_pooling_layer=False)
    if args.dtype == "int8":
        model = quantize_int8(model, calibrate=calibration_batches(tok))
    if args.batch < 1:
        p.error(f"--batch must be at least 1, got {args.batch}")
    batch = tok([SENTENCE] * args.batch, return_tensors="pt")
    run = Compiled(model) if args.compiled else model
    median = median_ms(run, batch)
    with torch.inference_mode():
        if args.compiled:  # the same kernels called from Python through torch.compile, to see them
            options = {**run._options, "cpp_wrapper": False, "cpp.enable_kernel_profile": True}
            with inductor_config.patch(options), aligned_export():
                run = torch.compile(model, dynamic=True)
                for _ in range(20):
                    run(**batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                run(**batch)
    m = machine()
    how = ", compiled" if args.compiled else ""
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}, {args.dtype}{how}")
    print(f"{args.batch} x {batch['input_ids'].shape[1]} tokens: median {median:.2f} ms")
    if not args.compiled:
        kernels_share(run, batch)
        weights_read(run, batch)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    if not args.compiled:
        stages(model, batch)


if __name__ == "__main__":
    main()

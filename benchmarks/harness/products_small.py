"""The float32 products of one short sentence, alone: where batch 1's time goes before anything
else in the model runs. The bundled model's 24 products (6 layers: query-key-value 384 -> 1152,
attention output 384 -> 384, feed-forward 384 -> 1536 and 1536 -> 384) on random weights and
inputs of ``--rows`` rows, one chain after another, each way below timed in alternating rounds
in one process (``bertlab.bench.speed.alternate``, as the benchmarks time systems: the order
turns each round, and each run starts after a pause in which the idle threads of the run before
stop spinning), so the machine's drift falls on every way alike:

    onednn           oneDNN's fused linear on the weight reordered for PACK_ROWS (bertlab's
                     route for float32 products of more than FEW_ROWS rows)
    mkl-few-rows     MKL's packed product on the weight packed once for MKL_PACK_ROWS rows and
                     told the actual row count (bertlab's route for float32 products of at most
                     FEW_ROWS rows on Intel CPUs)
    onednn-exact     the same, reordered for exactly --rows rows
    onednn-1-thread  bertlab's route on one thread (how much of the time the second one saves)
    sgemm-avx2       bertlab's AVX2 kernel (bertlab.nn.sgemm) on its packed panels, where it
                     runs here (bertlab's route for float32 products on AMD's AVX2 CPUs)
    mkl-packed       MKL's packed product (torch.ops.mkl._mkl_linear), packed for exactly --rows
    mkl-packed-pad   the same packed for --pad rows, the input padded to them (PyTorch's operator
                     computes on the packed copy when told the count it was packed for, on the
                     unpacked weight otherwise; mkl-few-rows tells it the actual count instead)
    pytorch          F.linear (PyTorch's BLAS, unpacked)
    onnxruntime      the same 24 MatMul + Add nodes as one ONNX Runtime graph (MLAS), if installed

Prints each way's median milliseconds a chain and its median ratio to ``onednn`` over the rounds.
The record of a run is kept in benchmarks/products-batch1-<cpu class>.txt.

    python benchmarks/harness/products_small.py [--rows 21] [--pad 32] [--mkl-pack-rows 128]
        [--threads 2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bertlab.bench.speed import alternate, machine
from bertlab.nn import avx2
from bertlab.nn.products import MKL_PACK_ROWS, PACK_ROWS

SHAPES = [(384, 1152), (384, 384), (384, 1536), (1536, 384)] * 6  # (in, out), layer by layer


def chains(
    rows: int, pad: int, threads: int, mkl_pack_rows: int = MKL_PACK_ROWS
) -> dict[str, Callable[[], object]]:
    """name -> one chain of the 24 products at ``rows`` rows."""
    g = torch.Generator().manual_seed(0)
    weights = [
        (torch.randn(n, k, generator=g) / k**0.5, torch.randn(n, generator=g)) for k, n in SHAPES
    ]
    x = {k: torch.randn(rows, k, generator=g) for k in (384, 1536)}
    xp = {k: F.pad(v, (0, 0, 0, pad - rows)) for k, v in x.items()}
    fused, reorder = torch.ops.mkldnn._linear_pointwise, torch.ops.mkldnn._reorder_linear_weight
    mkl_pack, mkl = torch.ops.mkl._mkl_reorder_linear_weight, torch.ops.mkl._mkl_linear

    def onednn(hint: int) -> Callable[[], None]:
        packed = [(reorder(w, hint), b) for w, b in weights]
        return lambda: [
            fused(x[k], w, b, "none", [], "") for (k, _), (w, b) in zip(SHAPES, packed, strict=True)
        ]

    def mkl_packed(m: int, inputs: dict[int, torch.Tensor], told: int) -> Callable[[], None]:
        packed = [(mkl_pack(w, m), w, b) for w, b in weights]
        return lambda: [
            mkl(inputs[k], p, w, b, told) for (k, _), (p, w, b) in zip(SHAPES, packed, strict=True)
        ]

    bertlab = onednn(PACK_ROWS)

    def one_thread() -> None:
        torch.set_num_threads(1)
        bertlab()
        torch.set_num_threads(threads)

    ways = {
        "onednn": bertlab,
        "onednn-exact": onednn(rows),
        "onednn-1-thread": one_thread,
        "mkl-few-rows": mkl_packed(mkl_pack_rows, x, rows),
        "mkl-packed": mkl_packed(rows, x, rows),
        "mkl-packed-pad": mkl_packed(pad, xp, pad),
        "pytorch": lambda: [
            F.linear(x[k], w, b) for (k, _), (w, b) in zip(SHAPES, weights, strict=True)
        ],
    }
    if (why := avx2.load()) is None:
        panels = [(avx2.pack(w), b) for w, b in weights]
        ways["sgemm-avx2"] = lambda: [
            avx2.product(x[k], p, b, n) for (k, n), (p, b) in zip(SHAPES, panels, strict=True)
        ]
    else:
        print(f"sgemm-avx2: not run ({why})")
    ort = onnxruntime_chain(weights, x, threads)
    if ort is not None:
        ways["onnxruntime"] = ort
    return ways


def onnxruntime_chain(weights, x, threads: int) -> Callable[[], object] | None:
    """The 24 products as MatMul + Add nodes of one ONNX Runtime session (None if not installed)."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        print("onnxruntime: not run (pip install 'bertlab[runtimes]')")
        return None
    nodes, inits, outputs = [], [], []
    for i, ((k, _), (w, b)) in enumerate(zip(SHAPES, weights, strict=True)):
        inits += [numpy_helper.from_array(w.t().contiguous().numpy(), f"w{i}"),
                  numpy_helper.from_array(b.numpy(), f"b{i}")]  # fmt: skip
        nodes += [helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"p{i}"]),
                  helper.make_node("Add", [f"p{i}", f"b{i}"], [f"y{i}"])]  # fmt: skip
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [None, k]) for k in x]
    graph = helper.make_graph(nodes, "products", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "products.onnx"
        onnx.save(model, path)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {f"x{k}": v.numpy() for k, v in x.items()}
    return lambda: session.run(None, feed)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=21, help="rows of each product's input (21)")
    p.add_argument("--pad", type=int, default=32, help="rows mkl-packed-pad pads to (32)")
    p.add_argument("--mkl-pack-rows", type=int, default=MKL_PACK_ROWS,
                   help=f"rows mkl-few-rows packs for ({MKL_PACK_ROWS}, bertlab's)")  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=10, help="chains a round (10)")
    args = p.parse_args(argv)
    if args.rows < 1 or args.pad < args.rows:
        p.error(f"--rows must be at least 1 and --pad at least --rows, got {args.rows}, {args.pad}")
    if args.mkl_pack_rows < 1:
        p.error(f"--mkl-pack-rows must be at least 1, got {args.mkl_pack_rows}")
    if args.rounds < 1 or args.calls < 1:
        p.error(f"--rounds and --calls must be at least 1, got {args.rounds}, {args.calls}")
    torch.set_num_threads(args.threads)
    ways = chains(args.rows, args.pad, args.threads, args.mkl_pack_rows)
    runs = {name: (lambda f=f: [f() for _ in range(args.calls)]) for name, f in ways.items()}
    with torch.inference_mode():  # (alternate: warm once, then the rounds, each run after a pause)
        seconds = alternate(runs, args.rounds)
    times = {name: [s / args.calls * 1e3 for s in t] for name, t in seconds.items()}
    m = machine()
    print(f"{m['cpu']}, {args.threads} threads, torch {m['torch']}: 24 float32 products at "
          f"{args.rows} rows, {args.rounds} alternating rounds of {args.calls} chains")  # fmt: skip
    base = times["onednn"]
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, base, strict=True))
        print(f"  {name:<16} {statistics.median(t):6.2f} ms a chain   {ratio:4.2f}x onednn")


if __name__ == "__main__":
    main()

"""bertlab's AVX2 kernels as built from an earlier revision against the working tree's: the
bundled model's four product shapes (query-key-value 384 -> 1152, attention output
384 -> 384, feed-forward 384 -> 1536 with GELU and 1536 -> 384), in float32 (sgemm) and int8
(qgemm, on the layers quantize_int8 makes), and its attention (one sequence, 12 heads of 32),
at each row count asked. The two libraries run in alternating rounds in one process; each line
gives both medians, the median of the per-round ratios and whether the two outputs have the
same bits.

    python benchmarks/harness/kernel_builds.py --base HEAD~1 [--rows 7,13,21,40] [--threads 2]
        [--rounds 60] [--sentences 40]

With ``--sentences N`` it then times the whole bundled model, float32 and int8, on the first N
sentences of the bundled SST-2 dev sample one by one (batch 1), the two libraries' products
swapped in alternating rounds (a fifth of --rounds, bertlab.bench.speed.alternate), and prints
tokens a second and the median ratio of the rounds' times (the products and the attention of
each library).

The revision's C sources and headers (every .c and .h file of bertlab/nn there) are read with
``git show`` and built with that revision's flags (its avx2.FLAGS) and the working tree's
compiler, into a temporary folder. A revision from before sgemm's ``wide`` argument is called
without it, through a Python wrapper (about a microsecond a call more on its side).
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from bertlab import BertModel, BertTokenizer
from bertlab.bench.speed import alternate, machine
from bertlab.nn import avx2, cpu, products
from bertlab.nn.precision import quantize_int8

ROOT = Path(avx2.__file__).resolve().parents[2]
SENTENCE = "The European Commission said on Thursday it disagreed with German advice."


def build(revision: str, folder: Path) -> ctypes.CDLL:
    """The library from ``revision``'s C sources and headers (every .c and .h file of
    bertlab/nn there), with the compiler flags of that revision's avx2.FLAGS."""
    nn = Path(avx2.__file__).parent.relative_to(ROOT).as_posix()

    def show(name: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{nn}/{name}"],
                              capture_output=True, check=True).stdout  # fmt: skip

    command = ["git", "-C", str(ROOT), "ls-tree", "--name-only", revision, f"{nn}/"]
    listing = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    names = [Path(line).name for line in listing.split() if line.endswith((".c", ".h"))]
    for name in names:
        (folder / name).write_bytes(show(name))
    flags = next(
        ast.literal_eval(node.value)
        for node in ast.parse(show("avx2.py")).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "FLAGS"
    )
    target = folder / "base.so"
    sources = [str(folder / name) for name in names if name.endswith(".c")]
    subprocess.run([avx2._compiler(), *flags, *sources, "-o", str(target)], check=True)
    lib = ctypes.CDLL(str(target))
    ours = avx2._kernels()
    for name in ("sgemm", "qgemm", "attention"):
        theirs = getattr(lib, f"bertlab_{name}")
        theirs.argtypes, theirs.restype = getattr(ours, name).argtypes, getattr(ours, name).restype
    if b"int wide" not in show("sgemm_avx2.c"):  # (before sgemm-avx512: no wide argument)
        return SimpleNamespace(bertlab_sgemm=narrow_sgemm(lib.bertlab_sgemm),
                               bertlab_qgemm=lib.bertlab_qgemm,
                               bertlab_attention=lib.bertlab_attention)  # fmt: skip
    return lib


def narrow_sgemm(sgemm):
    """A revision's sgemm from before its ``wide`` argument (the last but one), called with the
    working tree's arguments: ``wide`` dropped (those blocks are AVX2's), 0 returned."""
    sgemm.argtypes, sgemm.restype = avx2._kernels().sgemm.argtypes[:-2] + [ctypes.c_int], None

    def call(*args):
        sgemm(*args[:-2], args[-1])
        return 0

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the git revision to build the other side from")
    p.add_argument("--rows", default="7,13,21,40")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--sentences", type=int, default=0, help="then the model on N sentences")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if any(r < 1 for r in rows) or args.threads < 1 or args.rounds < 1:
        p.error(f"--rows {args.rows}, --threads {args.threads}, --rounds {args.rounds}: each >= 1")
    why = avx2.load()
    if why is not None:
        raise SystemExit(f"bertlab's AVX2 kernels do not run here: {why}")
    torch.set_num_threads(args.threads)
    tok = BertTokenizer.from_pretrained("default")
    model = BertModel.from_pretrained("default").eval()
    int8 = quantize_int8(model, [tok([SENTENCE], return_tensors="pt")])
    print(f"{machine()['cpu']}, {args.threads} threads, torch {torch.__version__}; base "
          f"{args.base}, {args.rounds} rounds")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        base, work = build(args.base, Path(tmp)), avx2._kernels()
        for m in rows:
            for kind, net in (("float32", model), ("int8", int8)):
                layer = net.encoder.layer[0]
                a = layer.attention
                shapes = {"384 -> 1152": (a.self.query, a.self.key, a.self.value),
                          "384 -> 384": (a.output.dense,),
                          "384 -> 1536 + GELU": (layer.intermediate.dense,),
                          "1536 -> 384": (layer.output.dense,)}  # fmt: skip
                for shape, layers in shapes.items():
                    time_shape(kind, shape, layers, m, args, base, work)
            time_attention(m, args, base, work)
        if args.sentences:
            for kind, net in (("float32", model), ("int8", int8)):
                time_model(kind, net, tok, args, base, work)


def time_model(kind, net, tok, args, base, work) -> None:
    """The model on single sentences, with each library's kernels swapped in by turns."""
    samples = Path(avx2.__file__).resolve().parents[1] / "data" / "samples" / "sst2_dev.tsv"
    lines = samples.read_text(encoding="utf-8").splitlines()[1 : args.sentences + 1]
    batches = [tok([line.split("\t")[0]], return_tensors="pt") for line in lines]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    theirs = SimpleNamespace(**vars(work))
    theirs.sgemm, theirs.qgemm = base.bertlab_sgemm, base.bertlab_qgemm
    theirs.attention = base.bertlab_attention

    def run(kernels: SimpleNamespace) -> None:
        avx2._LOADED[0] = kernels  # (the loaded library's functions: avx2._kernels)
        for batch in batches:
            net(**batch)

    with torch.inference_mode():
        try:
            runs = {"base": lambda: run(theirs), "work": lambda: run(work)}
            spent = alternate(runs, repeats=max(args.rounds // 5, 1), warmup=2)
        finally:
            avx2._LOADED[0] = work
    ratio = float(np.median(np.array(spent["work"]) / np.array(spent["base"])))
    rate = {side: tokens / float(np.median(t)) for side, t in spent.items()}
    print(
        f"{kind:7s} model, {len(batches)} SST-2 sentences one by one ({tokens} tokens): base "
        f"{rate['base']:,.0f} tokens/s, work {rate['work']:,.0f}, time work/base {ratio:.3f}"
    )


def time_attention(m, args, base, work) -> None:
    """The attention of one sequence of m tokens, 12 heads of 32, as the model calls it."""
    qkv = torch.randn(m, 3, 12, 32, generator=torch.Generator().manual_seed(m))
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    starts = torch.tensor([0, m], dtype=torch.int32)
    scratch = torch.empty(4 * args.threads * 34 * (-(-m // 32) * 32), dtype=torch.uint8)
    outs = {"base": torch.empty(m, 12, 32), "work": torch.empty(m, 12, 32)}
    libs = {"base": base.bertlab_attention, "work": work.attention}

    def call(side: str) -> None:
        status = libs[side](q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(),
                            v.stride(0), outs[side].data_ptr(), 384, starts.data_ptr(), 1, m, m,
                            12, 32, 32**-0.5, scratch.data_ptr(), args.threads)  # fmt: skip
        if status:
            raise RuntimeError(f"attention returned {status}")

    report(f"float32 {m:4d} rows {'attention':18s}", call, outs, args)


def report(what: str, call, outs, args) -> None:
    """Both sides once, their bits compared, then --rounds alternating rounds of 10 calls."""
    for side in outs:
        call(side)
    same = torch.equal(outs["base"], outs["work"])
    spent: dict[str, list[float]] = {"base": [], "work": []}
    for r in range(args.rounds):
        for side in ("base", "work") if r % 2 == 0 else ("work", "base"):
            start = time.perf_counter()
            for _ in range(10):
                call(side)
            spent[side].append((time.perf_counter() - start) / 10 * 1e6)
    ratio = float(np.median(np.array(spent["work"]) / np.array(spent["base"])))
    print(f"{what} base {np.median(spent['base']):7.1f} us, work {np.median(spent['work']):7.1f} "
          f"us, work/base {ratio:.3f}, same bits: {same}")  # fmt: skip


def time_shape(kind, shape, layers, m, args, base, work) -> None:
    gelu = "GELU" in shape
    if kind == "float32":
        panels, bias = products.packed(layers, torch.float32, kernel="sgemm")
        n, k = sum(layer.out_features for layer in layers), panels.shape[1]
    else:
        packed = products.int8_weight(layers)[0].packed
        n, k = packed.corr.shape[0], packed.inputs
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    outs = {"base": torch.empty(m, n), "work": torch.empty(m, n)}
    width = -(-k // avx2.QGROUP) * avx2.QGROUP
    scratch = torch.empty(m * (width + 4), dtype=torch.uint8)
    libs = {"base": (base.bertlab_sgemm, base.bertlab_qgemm), "work": (work.sgemm, work.qgemm)}

    def call(side: str) -> None:
        sgemm, qgemm = libs[side]
        out = outs[side].data_ptr()
        if kind == "float32":
            wide = cpu.current().float32_kernel == "sgemm-avx512"  # (as avx2.product calls it)
            sgemm(x.data_ptr(), m, k, panels.data_ptr(), n, bias.data_ptr(), gelu, None, None,
                  None, 0.0, out, wide, args.threads)  # fmt: skip
            return
        q, at = packed, scratch.data_ptr()
        status = qgemm(x.data_ptr(), m, k, None if q.unsmooth is None else q.unsmooth.data_ptr(),
                       q.levels, q.vnni, q.panels.data_ptr(), q.corr.data_ptr(),
                       q.scale.data_ptr(), n, q.bias.data_ptr(), gelu, None, None, None, 0.0,
                       out, at, at + m * width, args.threads)  # fmt: skip
        if status:
            raise RuntimeError(f"qgemm returned {status}")

    report(f"{kind:7s} {m:4d} rows {shape:18s}", call, outs, args)


if __name__ == "__main__":
    main()

"""``bertlab bench runtimes``: bertlab against the runtimes a user would deploy instead, in one
process, on the same weights, texts, batches and thread count.

Systems: bertlab (float32, bfloat16, int8; each also as ``-compiled``: behind
bertlab.nn.compiled.Compiled, which runs every batch-1 text and the batches with little padding
as one compiled graph, the rest as the model does), transformers (float32, SDPA), ONNX Runtime
(float32 with its BERT graph optimizer; int8 with dynamic per-channel weights) and OpenVINO (f32 and
bf16 precision hints), the last two reading one ONNX file written by ``bertlab export onnx``.
A peer that is not installed, or a precision the machine cannot run, is reported as such by
name; nothing falls back silently. So is a bertlab precision this CPU runs otherwise: bfloat16
without bfloat16 instructions (its products would run in float32, the float32 row), and a
``-compiled`` system in a precision where ``Compiled`` calls the model itself on this CPU (the
row would repeat the uncompiled one).

The report records the CPU's class and the kernels bertlab chose on it (``cpu``:
``bertlab.nn.cpu.current().describe()``: model, flags, the libraries' instruction-set limits
if any were set, oneDNN's instruction set, the int8 kernel, the bfloat16 route, the compiled
precisions), and the command prints it above its table; ``date`` is when the run started (UTC).

Workloads, fixed before any result: real sentences (CoNLL-2003 news from ``--data``, else the
bundled SST-2 sample), tokenized to at most 128 tokens,
* ``file-order``: batches of 32 in the order of the file (much padding),
* ``sorted``: the same texts sorted by length, batches of 32 (what a serving batcher does),
* ``batch-1``: one sentence at a time, the first 64 texts.
Every system returns sentence embeddings (the mean of the last hidden states over real tokens,
normalised); their cosine to bertlab float32's is the quality figure, with the share of texts
whose nearest other text stays the same. Speed is real tokens per second (padding not counted),
medians over alternating rounds, relative to transformers float32. Each workload also pairs
every bertlab system with the fastest peer of its precision round by round (``paired``: the
median and quartiles of the per-round ratios), which a machine whose speed drifts moves less.

Contention (``busy``, ``--busy N``): each workload is timed a second time while N neighbour
processes spin in pure Python on the same cores, the state a server's tokenizing and writing
threads put the model in. Each system's row then holds ``busy_tokens_per_s`` and ``kept``,
the share of its quiet throughput it keeps.

Side by side (``side_by_side``, ``--compare REPORT ...``): saved reports, from machines of
different classes, read back into one table of bertlab against the fastest peer of each
precision, eager and through ``Compiled``, a row per report and workload; nothing is timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertlab.bench.speed import alternate, machine
from bertlab.data import sample_sentences

WORKLOADS = ("file-order", "sorted", "batch-1")
SYSTEMS = (
    "bertlab-fp32",
    "bertlab-bf16",
    "bertlab-int8",
    "bertlab-fp32-compiled",
    "bertlab-bf16-compiled",
    "bertlab-int8-compiled",
    "transformers-fp32",
    "onnxruntime-fp32",
    "onnxruntime-int8",
    "openvino-f32",
    "openvino-bf16",
)
BATCH, BATCH1_TEXTS, MAX_LEN, TEXTS = 32, 64, 128, 1024
# the peers of each bertlab precision, against which its rounds are paired (``paired``)
PEERS = {
    "fp32": ("transformers-fp32", "onnxruntime-fp32", "openvino-f32"),
    "bf16": ("openvino-bf16",),
    "int8": ("onnxruntime-int8",),
}


class Unavailable(Exception):
    """A system this machine or environment cannot run: the reason is reported, not hidden."""


def runtime_texts(data_dir: str | os.PathLike | None = None) -> tuple[list[str], str]:
    """The benchmark's sentences: CoNLL-2003 train (news) from ``data_dir``/conll2003, else the
    bundled SST-2 sample; the first ``TEXTS`` in file order."""
    if data_dir is not None:
        path = Path(data_dir) / "conll2003" / "train.txt"
        if not path.is_file():
            raise FileNotFoundError(f"--data {data_dir}: no {path}")
        texts, words = [], []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.startswith("-DOCSTART-"):
                if words:
                    texts.append(" ".join(words))
                words = []
            else:
                words.append(line.split(" ", 1)[0])
        return texts[:TEXTS], f"{path}: CoNLL-2003 train sentences (news), the first {TEXTS}"
    texts = sample_sentences(TEXTS, "sst2_train.tsv")
    return texts, f"bertlab's bundled SST-2 sample, the first {TEXTS} sentences"


def batches(tokenizer: Any, texts: list[str], workload: str) -> list[dict[str, np.ndarray]]:
    """The padded batches of one workload, as int64 arrays (every system gets these)."""
    if workload == "batch-1":
        groups = [[t] for t in texts[:BATCH1_TEXTS]]
    else:
        if workload == "sorted":
            ids = tokenizer(texts, truncation=True, max_length=MAX_LEN)["input_ids"]
            lengths = [len(x) for x in ids]
            texts = [t for _, t in sorted(zip(lengths, texts, strict=True), key=lambda p: p[0])]
        groups = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    out = []
    for g in groups:
        enc = tokenizer(g, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="np")
        out.append(
            {
                k: np.asarray(enc[k], dtype=np.int64)
                for k in ("input_ids", "attention_mask", "token_type_ids")
            }
        )
    return out


def pool(hidden: np.ndarray | torch.Tensor, mask: np.ndarray) -> np.ndarray:
    """(B, T, H) hidden states -> (B, H) normalised means over real tokens."""
    from bertlab.nn.packing import mean_pool

    means = mean_pool(torch.as_tensor(hidden).float(), torch.as_tensor(mask))
    return torch.nn.functional.normalize(means, dim=-1).numpy()


# ============================================================================ the systems
Runner = Callable[[dict[str, np.ndarray]], np.ndarray]  # a batch -> (B, H) embeddings


def bertlab_runner(model_dir: Path, precision: str, compiled: bool = False) -> Runner:
    from bertlab.nn import cpu
    from bertlab.nn.compiled import Compiled
    from bertlab.nn.model import BertModel
    from bertlab.nn.precision import bf16_supported, int8_supported, quantize_int8

    if compiled and (why := Compiled.available()) is not None:
        raise Unavailable(why)
    if precision == "int8" and (why := int8_supported()) is not None:
        raise Unavailable(why)  # (Arm, x86 without AVX2: the kernel's missing feature named)
    full = {"fp32": "float32", "bf16": "bfloat16"}.get(precision, precision)
    if compiled and (why := cpu.current().not_compiled.get(full)) is not None:
        raise Unavailable(f"Compiled runs the {full} model itself on this CPU: {why}")
    model = BertModel.from_pretrained(model_dir, dtype=torch.float32, add_pooling_layer=False)
    if precision == "bf16":
        why = bf16_supported()
        if why is not None:
            raise Unavailable(f"{why}: bfloat16 products would run in float32 (the fp32 row)")
        model = model.to(torch.bfloat16)
    elif precision == "int8":
        from bertlab.tokenizer import BertTokenizer

        model = quantize_int8(
            model, calibrate=calibration_batches(BertTokenizer.from_pretrained(model_dir))
        )
    if compiled:
        return torch_runner(Compiled(model))
    return torch_runner(model)


def calibration_batches(tokenizer: Any) -> list[dict[str, torch.Tensor]]:
    """int8's calibration inputs: the first CALIBRATION sentences of the bundled SST-2 dev
    sample (film reviews), never the benchmark's own texts, in batches of 32."""
    from bertlab.nn.precision import CALIBRATION, text_batches

    return text_batches(tokenizer, sample_sentences(CALIBRATION))


def torch_runner(model: Callable[..., Any]) -> Runner:
    """A PyTorch model (bertlab's or transformers') as a Runner."""

    def run(b: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            inputs = {k: torch.from_numpy(v) for k, v in b.items()}
            return pool(model(**inputs).last_hidden_state, b["attention_mask"])

    return run


def transformers_runner(model_dir: Path) -> Runner:
    try:
        from transformers import BertModel as HFBertModel
    except ImportError as e:
        raise Unavailable("transformers is not installed (pip install 'bertlab[runtimes]')") from e
    model = HFBertModel.from_pretrained(
        model_dir, attn_implementation="sdpa", add_pooling_layer=False
    )
    return torch_runner(model.eval())


def onnx_file(model_dir: Path, work: Path) -> Path:
    """``bertlab export onnx`` of the base model, once per benchmark."""
    target = work / "onnx"
    if not (target / "model.onnx").is_file():
        try:
            from bertlab.io.export import export_onnx
        except ImportError as e:  # pragma: no cover
            raise Unavailable(f"the ONNX export needs the export extra: {e}") from e
        export_onnx(model_dir, target, head="base")
    return target / "model.onnx"


def onnxruntime_runner(model_dir: Path, work: Path, precision: str, threads: int) -> Runner:
    try:
        import onnxruntime as ort
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as e:
        raise Unavailable("onnxruntime is not installed (pip install 'bertlab[runtimes]')") from e
    from bertlab.nn.config import BertConfig

    config = BertConfig.from_pretrained(model_dir)
    optimized = work / "ort-optimized.onnx"
    if not optimized.is_file():
        opt = optimize_model(
            str(onnx_file(model_dir, work)),
            model_type="bert",
            num_heads=config.num_attention_heads,
            hidden_size=config.hidden_size,
        )
        opt.save_model_to_file(str(optimized))
    path = optimized
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        path = work / "ort-int8.onnx"
        if not path.is_file():
            quantize_dynamic(
                str(optimized), str(path), per_channel=True, weight_type=QuantType.QInt8
            )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(b: dict[str, np.ndarray]) -> np.ndarray:
        hidden = session.run(None, {k: v for k, v in b.items() if k in names})[0]
        return pool(hidden, b["attention_mask"])

    return run


def openvino_runner(model_dir: Path, work: Path, precision: str, threads: int) -> Runner:
    try:
        import openvino as ov
    except ImportError as e:
        raise Unavailable("openvino is not installed (pip install 'bertlab[runtimes]')") from e
    core = ov.Core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise Unavailable("OpenVINO reports no bfloat16 on this CPU")
    compiled = core.compile_model(
        str(onnx_file(model_dir, work)),
        "CPU",
        {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads},
    )
    names = {i.get_any_name() for i in compiled.inputs}

    def run(b: dict[str, np.ndarray]) -> np.ndarray:
        hidden = compiled({k: v for k, v in b.items() if k in names})[compiled.output(0)]
        return pool(hidden, b["attention_mask"])

    return run


def make_runner(name: str, model_dir: Path, work: Path, threads: int) -> Runner:
    family, precision, *compiled = name.split("-")
    if family == "bertlab":
        return bertlab_runner(model_dir, precision, compiled=bool(compiled))
    if family == "transformers":
        return transformers_runner(model_dir)
    if family == "onnxruntime":
        return onnxruntime_runner(model_dir, work, precision, threads)
    return openvino_runner(model_dir, work, precision, threads)


# ============================================================================ the benchmark
def quality(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """Cosine of each text's embedding to the reference's, and the nearest-neighbour agreement."""
    cos = (reference * other).sum(-1)
    sa, sb = reference @ reference.T, other @ other.T
    np.fill_diagonal(sa, -2)
    np.fill_diagonal(sb, -2)
    return {
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "nearest_neighbour_kept": float((sa.argmax(1) == sb.argmax(1)).mean()),
    }


@contextlib.contextmanager
def neighbours(count: int):
    """``count`` processes spinning in pure Python until the block ends (never left behind)."""
    spinning = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield spinning
    finally:
        for proc in spinning:
            proc.kill()
        for proc in spinning:
            proc.wait()


def bench_runtimes(
    model_dir: str | os.PathLike = "default",
    data_dir: str | os.PathLike | None = None,
    systems: tuple[str, ...] = SYSTEMS,
    workloads: tuple[str, ...] = WORKLOADS,
    repeats: int = 5,
    threads: int | None = None,
    texts: list[str] | None = None,
    busy: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every system on every workload: real tokens/s, the ratio to transformers float32, and the
    embeddings' agreement with bertlab float32; with ``busy`` neighbour processes, each
    workload again under that contention. ``texts`` replaces the workload's sentences (tests
    use a few)."""
    from bertlab.files import resolve_model_dir
    from bertlab.nn import cpu
    from bertlab.tokenizer import BertTokenizer

    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system {unknown[0]!r}; choose from {', '.join(SYSTEMS)}")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        raise ValueError(f"unknown workload {bad[0]!r}; choose from {', '.join(WORKLOADS)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not 0 <= busy <= 64:
        raise ValueError(f"busy must be between 0 and 64 neighbour processes, got {busy}")
    model_dir = resolve_model_dir(model_dir)
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    origin = "given texts"
    if texts is None:
        texts, origin = runtime_texts(data_dir)
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    report: dict[str, Any] = {
        "benchmark": "runtimes",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),  # (when the run started)
        "cpu": cpu.current().describe(),
        "model": str(model_dir),
        "texts": origin,
        "threads": threads,
        "repeats": repeats,
        "busy_neighbours": busy,
        "unavailable": {},
        "workloads": {},
    }
    with tempfile.TemporaryDirectory(prefix="bertlab-runtimes-") as tmp:
        runners: dict[str, Runner] = {}
        for name in ("bertlab-fp32", *[s for s in systems if s != "bertlab-fp32"]):
            progress(f"loading {name}")
            try:
                runners[name] = make_runner(name, model_dir, Path(tmp), threads)
            except Unavailable as e:
                report["unavailable"][name] = str(e)
        for workload in workloads:
            progress(f"{workload}: timing {len(runners)} systems")
            data = batches(tokenizer, texts, workload)
            tokens = int(sum(b["attention_mask"].sum() for b in data))
            padded = int(sum(b["attention_mask"].size for b in data))
            runs = {name: (lambda r=r, d=data: [r(b) for b in d]) for name, r in runners.items()}
            times = alternate(runs, repeats)
            med = {k: statistics.median(v) for k, v in times.items()}
            embeddings = {name: np.concatenate([r(b) for b in data]) for name, r in runners.items()}
            reference = embeddings["bertlab-fp32"]
            rows = {
                name: {
                    "tokens_per_s": tokens / med[name],
                    "seconds": med[name],
                    "round_seconds": times[name],
                    **quality(reference, emb),
                }
                for name, emb in embeddings.items()
            }
            if busy:
                progress(f"{workload}: timing {len(runners)} systems beside {busy} busy processes")
                with neighbours(busy):
                    loaded = alternate(runs, repeats)
                for name, row in rows.items():
                    row["busy_tokens_per_s"] = tokens / statistics.median(loaded[name])
                    row["kept"] = row["busy_tokens_per_s"] / row["tokens_per_s"]
            base = rows.get("transformers-fp32", {}).get("tokens_per_s")
            for row in rows.values():
                row["relative_to_transformers_fp32"] = (
                    None if base is None else row["tokens_per_s"] / base
                )
            report["workloads"][workload] = {
                "batches": len(data),
                "real_tokens": tokens,
                "padding_share": 1 - tokens / padded,
                "systems": rows,
                "paired": paired(times),
            }
    return report


def paired(times: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each bertlab system against the fastest peer of its precision (``PEERS``, by median),
    round by round: in round i every system ran once, back to back, so the ratio of the peer's
    time to bertlab's in that round (bertlab's throughput relative to the peer's) sees the same
    state of the machine on both sides. The median of those ratios and their quartiles; on a
    machine whose speed drifts between rounds they move far less than the ratio of the medians.
    Nothing for a system without a peer in ``times``."""
    out = []
    for name in [s for s in SYSTEMS if s in times and s.startswith("bertlab-")]:
        precision = name.split("-")[1]
        peers = [p for p in PEERS[precision] if p in times]
        if not peers:
            continue
        peer = min(peers, key=lambda p: statistics.median(times[p]))
        ratios = sorted(t / b for t, b in zip(times[peer], times[name], strict=True))
        low, high = (
            (ratios[0], ratios[0]) if len(ratios) < 2 else statistics.quantiles(ratios, n=4)[::2]
        )
        out.append(
            {
                "system": name,
                "peer": peer,
                "median": statistics.median(ratios),
                "low": low,
                "high": high,
            }
        )
    return out


def paired_lines(report: dict[str, Any]) -> list[str]:
    """One line per workload and bertlab system with a peer: ``paired``'s figures."""
    return [
        f"{workload}: {p['system']} {p['median']:.2f}x {p['peer']} round by round "
        f"(quartiles {p['low']:.2f}-{p['high']:.2f})"
        for workload, w in report["workloads"].items()
        for p in w.get("paired", ())  # (records from before it was kept have none)
    ]


def against_peers(report: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each workload of a report and each precision it measured: bertlab's real tokens/s
    over the fastest peer's of that precision (``PEERS``; ratio of the medians), eager
    (``eager``) and through Compiled (``compiled``; None where the report has no such system),
    and which peer (``peer``). A precision without a peer or a bertlab system is left out."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for workload, w in report["workloads"].items():
        rows, cells = w["systems"], {}
        for precision, peers in PEERS.items():
            present = [p for p in peers if p in rows]
            ours = [rows.get(f"bertlab-{precision}"), rows.get(f"bertlab-{precision}-compiled")]
            if not present or ours == [None, None]:
                continue
            peer = max(present, key=lambda p: rows[p]["tokens_per_s"])
            rate = rows[peer]["tokens_per_s"]
            eager, compiled = (None if r is None else r["tokens_per_s"] / rate for r in ours)
            cells[precision] = {"peer": peer, "eager": eager, "compiled": compiled}
        out[workload] = cells
    return out


def read_report(path: str | os.PathLike) -> dict[str, Any]:
    """A report ``bertlab bench runtimes --out`` wrote (ValueError naming the file where it is
    not one)."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such report") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a JSON report ({e})") from None
    if not isinstance(report, dict) or report.get("benchmark") != "runtimes":
        found = report.get("benchmark") if isinstance(report, dict) else type(report).__name__
        raise ValueError(
            f"{path}: not a report of bertlab bench runtimes (its benchmark is {found!r})"
        )
    return report


def side_by_side(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """A markdown table of ``against_peers`` for each (name, report): a row per report and
    workload, a column per precision, each cell eager / Compiled against the fastest peer."""
    out = [
        "| record | CPU class | workload | float32 | bfloat16 | int8 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, report in reports:
        for workload, cells in against_peers(report).items():
            when = f" ({report['date'][:10]})" if report.get("date") else ""  # (since 2026-11-29)
            row = [f"`{name}`{when}", report.get("cpu", {}).get("class", "not recorded"), workload]
            for precision in PEERS:
                cell = cells.get(precision)
                if cell is None:
                    row.append("not run")
                    continue
                eager, compiled = (
                    "-" if x is None else f"{x:.2f}x" for x in (cell["eager"], cell["compiled"])
                )
                row.append(f"{eager} / {compiled} {cell['peer']}")
            out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def cpu_line(described: dict[str, Any]) -> str:
    """One line for a report's ``cpu`` (Policy.describe()): the class and what bertlab runs on
    it."""
    limits = f", limited by {' '.join(described['limits'])}" if described["limits"] else ""
    kernel = described["int8_kernel"]
    prepacked = described.get("int8_prepacked")  # (records from before it was kept have none)
    here = " (measured on this machine: bertlab bench kernels --save)"
    int8 = (
        f"int8 on {kernel} ({described['int8_activation_bits']}-bit activations"
        + (", prepacked above few rows" if prepacked else "")
        + ")"
        + (here if str(described.get("int8_kernel_why", "")).startswith("measured here") else "")
        if kernel
        else f"no int8 ({described['int8_why']})"
    )
    bf16 = "bfloat16 native" if described["bf16_native"] else "bfloat16 products in float32"
    capped = described.get("compiled_tokens") or {}  # (records from before it was kept: none)
    compiled = (
        ", ".join(
            f"{p} (batches of at most {capped[p]} positions)" if p in capped else p
            for p in described["compiled"]
        )
        or "none"
    )
    wait = described.get("openmp_wait")  # (records from before it was kept have none)
    few = described.get("few_rows")  # (nor the few-rows kernel)
    f32 = described.get("float32_kernel")  # (nor the float32 kernel)
    measured = str(described.get("float32_kernel_why", "")).startswith("measured here")
    return (
        f"CPU class {described['class']} ({described['model']}, oneDNN "
        f"{described['onednn_isa'] or 'n/a'}{limits}): {int8}; {bf16}; compiled: {compiled}"
        + (f"; float32 products on {f32}" if f32 else "")
        + (here if measured else "")
        + (f"; float32 products of few rows on {few}" if few and f32 in (None, "onednn") else "")
        + (f"; OpenMP wait: {wait}" if wait else "")
    )


def markdown_table(report: dict[str, Any]) -> str:
    """Rows: workloads; columns: systems; cells: speed relative to transformers float32, with
    the mean embedding cosine to bertlab float32 for the lower precisions; with busy
    neighbours, a second row per workload: the share of quiet throughput each system kept."""
    systems = [s for s in SYSTEMS if any(s in w["systems"] for w in report["workloads"].values())]
    out = ["| workload | " + " | ".join(systems) + " |", "|" + " --- |" * (len(systems) + 1)]
    for name, w in report["workloads"].items():
        cells = []
        for s in systems:
            row = w["systems"].get(s)
            if row is None:
                cells.append("n/a")
                continue
            rel = row["relative_to_transformers_fp32"]
            cell = f"{rel:.2f}" if rel is not None else f"{row['tokens_per_s']:,.0f} tok/s"
            if not s.endswith(("fp32", "f32")):
                cell += f" ({row['cosine_mean']:.5f})"
            cells.append(cell)
        label = f"{name} ({w['padding_share']:.0%} padding)"
        out.append(f"| {label} | " + " | ".join(cells) + " |")
        if report.get("busy_neighbours"):
            kept = [
                f"{w['systems'][s]['kept']:.0%}" if s in w["systems"] else "n/a" for s in systems
            ]
            label = f"{name}, kept beside {report['busy_neighbours']} busy processes"
            out.append(f"| {label} | " + " | ".join(kept) + " |")
    return "\n".join(out)


def plot(report: dict[str, Any], path: str | os.PathLike) -> None:
    """A grouped bar chart of tokens/s relative to transformers float32."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(report["workloads"])
    systems = [s for s in SYSTEMS if any(s in w["systems"] for w in report["workloads"].values())]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(systems)
    # matplotlib's default cycle has 10 colours and repeats the first for an 11th system: tab20's
    # ten strong colours, then its ten light ones, give each of up to 20 systems its own
    tab20 = plt.get_cmap("tab20").colors
    colours = tab20[::2] + tab20[1::2]
    for k, s in enumerate(systems):
        values = [
            (report["workloads"][w]["systems"].get(s) or {}).get("relative_to_transformers_fp32")
            or 0
            for w in workloads
        ]
        ax.bar(
            [i + k * width for i in range(len(workloads))],
            values,
            width,
            label=s,
            color=colours[k % len(colours)],
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.set_ylabel("real tokens/s ÷ transformers float32")
    ax.set_title(f"{report['machine']['cpu']}, {report['threads']} threads")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""``bertlab bench``: bertlab side by side with transformers, in one process, on the same inputs.

Runs alternate (bertlab, reference, bertlab, ...) so that a noisy neighbour on a shared machine
slows both sides alike; the figures are medians over the runs, and the ratio is of the medians.
transformers is imported here only, and only when a benchmark runs: bertlab itself never needs it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bertlab.data import SAMPLES


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


SETTLE = 0.1  # seconds of pause before each timed run (alternate)


def alternate(runs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict:
    """Time each callable ``repeats`` times, interleaved; seconds per run, by name.

    The order turns by one each round and runs backwards every other round, so no run always
    follows the same other one (whose leftovers in the caches and the allocator it would meet).
    Before each timed run the process pauses SETTLE seconds, untimed: the threads of the run
    before stay awake a while after it returns, spinning for their next task (ONNX Runtime's
    used about 50 ms of a core after each batch-1 round on the 2-core Xeon, PyTorch's OpenMP
    threads a few ms), and a run started at once would share its cores with them."""
    for _ in range(warmup):
        for fn in runs.values():
            fn()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in reversed(order) if i % 2 else order:
            time.sleep(SETTLE)
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


# ============================================================================ tokenizer
# A --data folder's layout: the files the tokenizer benchmark reads from it.
DATA_FILES = ("sst2/train.tsv", "squad/train-subset-v1.1.json", "wikitext-2/wiki.valid.tokens")


def tokenizer_texts(data_dir: str | os.PathLike | None = None) -> tuple[list[str], str]:
    """Real texts for the tokenizer and int8 benchmarks: SST-2 sentences, SQuAD contexts and
    WikiText lines. From ``data_dir`` when given (it must hold ``DATA_FILES``), else from the
    samples installed with bertlab (``bertlab/data/samples``, sources in its README.md)."""
    if data_dir is not None:
        root = Path(data_dir)
        missing = [name for name in DATA_FILES if not (root / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"--data {root}: no {root / missing[0]} (a data folder holds "
                f"{', '.join(DATA_FILES)})"
            )
        sst2 = [root / DATA_FILES[0]]
        squad, wiki = root / DATA_FILES[1], root / DATA_FILES[2]
        origin = f"{root}: SST-2 train (first 20,000), SQuAD contexts, WikiText-2 valid"
    else:
        sst2 = [SAMPLES / "sst2_train.tsv", SAMPLES / "sst2_dev.tsv"]
        squad, wiki = SAMPLES / "squad_sample.json", SAMPLES / "wikitext2_sample.tokens"
        origin = "bertlab's bundled samples: SST-2 sentences, SQuAD contexts, WikiText-2 lines"
    texts = []
    for path in sst2:  # sentence<TAB>label, a header row
        lines = path.read_text(encoding="utf-8").splitlines()[1:20001]
        texts += [line.split("\t")[0] for line in lines]
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    texts += [p["context"] for a in articles for p in a["paragraphs"]]
    texts += [t for t in wiki.read_text(encoding="utf-8").splitlines() if t.strip()]
    return texts, origin


def bench_tokenizer(
    model_dir: str | os.PathLike, texts: list[str], batch_size: int = 1000, repeats: int = 5
) -> dict[str, Any]:
    """Batch tokenization throughput, bertlab vs transformers' fast (tokenizers-backed)
    BertTokenizer, both loaded from ``model_dir``, both returning lists of ids with padding off."""
    import transformers

    from bertlab.files import resolve_model_dir
    from bertlab.tokenizer import BertTokenizer

    d = str(resolve_model_dir(model_dir))
    ours = BertTokenizer.from_pretrained(d)
    ref = transformers.BertTokenizer.from_pretrained(d)
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]

    def run(tok) -> Callable[[], int]:
        def go() -> int:
            return sum(len(ids) for b in batches for ids in tok(b, truncation=True)["input_ids"])

        return go

    n_tokens = run(ours)()
    if n_tokens != run(ref)():
        raise RuntimeError("bertlab and transformers disagree on the token count")
    times = alternate({"bertlab": run(ours), "transformers": run(ref)}, repeats)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {
        "workload": "tokenizer",
        "texts": len(texts),
        "tokens": n_tokens,
        "batch_size": batch_size,
        "repeats": repeats,
        "seconds": times,
        "texts_per_s": {k: len(texts) / v for k, v in med.items()},
        "tokens_per_s": {k: n_tokens / v for k, v in med.items()},
        "ratio": med["transformers"] / med["bertlab"],
        "transformers": transformers.__version__,
    }


# ============================================================================ the network
# name -> (kind, batch, length): length is an int, or (low, high) for lengths drawn uniformly.
WORKLOADS: dict[str, tuple[str, int, int | tuple[int, int]]] = {
    "variable": ("inference", 32, (16, 256)),
    "fixed128": ("inference", 32, 128),
    "fixed512": ("inference", 8, 512),
    "latency": ("inference", 1, 128),
    "train": ("training", 32, 128),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Batches a run of a drawn-length workload goes through (seeds 0, 1, ...). One draw is one
# sample of the workload's padding: seed 0's batch is 38.7% padding, the least of the first
# 16 seeds (whose mean is 46.7%), and bertlab's ratio to transformers moves with it.
DRAWS = 4


def model_flops(config, lengths: list[int], training: bool) -> float:
    """Useful FLOPs of the encoder on real tokens only: 24*L*H^2 + 4*L*S*H per token forward
    (S the token's own sequence length); a training step is 3x (forward + backward)."""
    L, H = config.num_hidden_layers, config.hidden_size
    fwd = sum(n * (24 * L * H * H + 4 * L * n * H) for n in lengths)
    return 3 * fwd if training else fwd


def matmul_run(dtype: torch.dtype, device: str, n: int | None = None):
    """A square matrix product in ``dtype``: a run for ``alternate``, its FLOPs, and the list
    each run appends its timed product's seconds to. A benchmark runs it among its own runs,
    so the rate meets the same noisy neighbours as the figures it is compared with. Each run
    does one product first, untimed, to wake the threads and the matrix units and to bring
    its operands back into cache, then times a second: the rate is the machine's, not that of
    a product arriving cold (noticeably slower, most of all in bfloat16)."""
    n = n or (8192 if device == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)  # written in place: no fresh pages
    seconds: list[float] = []

    def go() -> None:
        torch.matmul(a, b, out=c)
        _sync(device)
        start = time.perf_counter()
        torch.matmul(a, b, out=c)
        _sync(device)
        seconds.append(time.perf_counter() - start)

    return go, 2.0 * n**3, seconds


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _PeakRSS:
    """Peak resident memory above the starting point while a block runs (CPU), sampled by a
    thread; on CUDA, the allocator's peak."""

    def __init__(self, device: str):
        self.device, self.peak = device, 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        import threading

        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        try:  # hand freed memory back to the system first, so growth shows as growth
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        self.start, self.peak, self._stop = self._rss(), self._rss(), threading.Event()

        def sample() -> None:
            while not self._stop.wait(0.002):
                self.peak = max(self.peak, self._rss())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            self.mb = (torch.cuda.max_memory_allocated() - self.start) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self.mb = (max(self.peak, self._rss()) - self.start) / 2**20


def make_batch(config, workload: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids, mask, segments (and pre-training labels) for a workload, from a seed."""
    kind, batch, length = WORKLOADS[workload]
    g = torch.Generator().manual_seed(seed)
    if isinstance(length, tuple):
        lengths = torch.randint(length[0], length[1] + 1, (batch,), generator=g)
    else:
        lengths = torch.full((batch,), length)
    T = int(lengths.max())
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(1000, config.vocab_size, (batch, T), generator=g) * mask
    types = ((torch.arange(T)[None] >= (lengths[:, None] // 2)) & mask.bool()).long()
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if kind == "training":  # 15% of real tokens predicted, a random NSP label per pair
        chosen = (torch.rand(batch, T, generator=g) < 0.15) & mask.bool()
        out["labels"] = torch.where(chosen, ids, torch.full_like(ids, -100))
        out["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
    return out


def _load_pair(model: str, kind: str, attn: str):
    """bertlab and transformers models with identical weights: the bundled checkpoint, or a
    preset with random weights written once and read by both."""
    import tempfile

    import transformers

    from bertlab.files import resolve_model_dir
    from bertlab.nn.config import PRESETS, BertConfig
    from bertlab.nn.heads import BertForPreTraining
    from bertlab.nn.model import BertModel

    ours_cls = BertForPreTraining if kind == "training" else BertModel
    ref_cls = getattr(transformers, ours_cls.__name__)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    if model in PRESETS:
        first = ours_cls(BertConfig.preset(model))
    else:  # heads the checkpoint lacks are initialised once, here, and shared by both sides
        logging.getLogger("bertlab").setLevel(logging.ERROR)
        first = ours_cls.from_pretrained(resolve_model_dir(model))
        logging.getLogger("bertlab").setLevel(logging.NOTSET)
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-") as folder:
        first.save_pretrained(folder)
        ours = ours_cls.from_pretrained(folder, attn_implementation=attn)
        ref = ref_cls.from_pretrained(folder, attn_implementation="sdpa")
    return ours, ref


SHORT_RUN = 0.05  # seconds: a workload whose run is shorter gets ten times the repeats


def require_transformers() -> None:
    """Every benchmark runs transformers beside bertlab: say how to install it, before any work."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise ValueError(
            "bertlab bench runs transformers beside bertlab, and it is not installed: "
            "pip install 'bertlab[bench]' (or pip install transformers)"
        )


def check_counts(**counts: int | None) -> None:
    """Refuse a count below 1 (repeats, draws, threads), naming it; None means not given."""
    for name, n in counts.items():
        if n is not None and n < 1:
            raise ValueError(f"{name} must be at least 1; got {n}")


def bench_model(
    model: str,
    workload: str,
    dtype: str,
    repeats: int,
    device: str = "cpu",
    attn: str = "packed",
    draws: int = DRAWS,
) -> dict[str, Any]:
    """One workload, bertlab (``attn`` kernel) against transformers (SDPA), same weights,
    inputs, dtype, threads. Training: forward, backward and an AdamW step, with bfloat16 as
    autocast over float32 weights. A workload of drawn lengths runs ``draws`` batches (seeds
    0 to draws-1) in each run; a fixed one, its one batch."""
    check_counts(repeats=repeats, draws=draws)
    kind, _, length = WORKLOADS[workload]
    training = kind == "training"
    ours, ref = _load_pair(model, kind, attn)
    torch_dtype = DTYPES[dtype]
    seeds = range(draws if isinstance(length, tuple) else 1)
    batches = [
        {k: v.to(device) for k, v in make_batch(ours.config, workload, seed).items()}
        for seed in seeds
    ]
    lengths = [n for b in batches for n in b["attention_mask"].sum(1).tolist()]
    tokens = int(sum(lengths))
    runs = {}
    for name, m in (("bertlab", ours), ("transformers", ref)):
        m.to(device)
        if training:
            m.train()
            runs[name] = _train_step(m, batches[0], torch_dtype, device, name == "bertlab")
        else:
            m.to(torch_dtype).eval()
            keys = ("input_ids", "attention_mask", "token_type_ids")
            runs[name] = _infer(m, [{k: b[k] for k in keys} for b in batches], device)
    product, product_flops, product_seconds = matmul_run(torch_dtype, device)
    start = time.perf_counter()
    runs["bertlab"]()
    if time.perf_counter() - start < SHORT_RUN:  # batch-1 latency: noisier, so more runs
        repeats *= 10
    times = alternate({**runs, "matmul": product}, repeats)
    del times["matmul"]  # its runs hold an untimed product too: their own timings count
    matmul_seconds = product_seconds[-repeats:]
    rate = product_flops / statistics.median(matmul_seconds)
    peaks = {}
    for name, fn in runs.items():
        with _PeakRSS(device) as peak:
            fn()
        peaks[name] = round(peak.mb, 1)
    med = {k: statistics.median(v) for k, v in times.items()}
    flops = model_flops(ours.config, lengths, training)
    return {
        "model": model,
        "workload": workload,
        "kind": kind,
        "dtype": dtype,
        "batch": len(batches[0]["attention_mask"]),
        "batches": len(batches),
        "real_tokens": tokens,
        "padded_tokens": sum(int(b["attention_mask"].numel()) for b in batches),
        "repeats": repeats,
        "seconds": times,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "ratio": med["transformers"] / med["bertlab"],
        "peak_memory_mb": peaks,
        "matmul_tflops": rate / 1e12,
        "matmul_seconds": matmul_seconds,
        "useful_tflops": {k: flops / v / 1e12 for k, v in med.items()},
        "useful_share_of_matmul": {k: flops / v / rate for k, v in med.items()},
        "bertlab_kernel": attn,
    }


def _infer(model, batches: list[dict[str, torch.Tensor]], device: str) -> Callable[[], None]:
    def go() -> None:
        with torch.inference_mode():
            for inputs in batches:
                model(**inputs)
        _sync(device)

    return go


def _train_step(model, batch, dtype, device: str, ours: bool) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    extra = {"return_logits": False} if ours else {}

    def go() -> None:
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**batch, **extra).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)

    return go


def plot(report: dict[str, Any], path: str | os.PathLike) -> None:
    """A bar chart of the speed ratios (bertlab / transformers) to PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("the chart needs matplotlib: pip install 'bertlab[bench]'") from e
    rows = report["results"]
    labels = [f"{r['model']}\n{r['workload']}\n{r['dtype']}" for r in rows]
    ratios = [r["ratio"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4.5))
    ax.bar(range(len(rows)), ratios, color=["#2a7" if x >= 1 else "#c44" for x in ratios])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up over transformers (x)")
    m = report["machine"]
    where = f"{m.get('device', 'cpu')}: {m['cpu']}, {m['torch_threads']} threads"
    ax.set_title(f"bertlab vs transformers, real tokens/s ({where})", fontsize=9)
    for i, x in enumerate(ratios):
        ax.text(i, x, f"{x:.2f}", ha="center", va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_int8(model_dir: str | os.PathLike, texts: list[str], repeats: int = 5) -> dict:
    """int8 dynamic quantisation against float32, both bertlab: speed of sentence embeddings
    (mean-pooled, normalised) and what it costs: cosine similarity of each text's embedding to
    its float32 one, and how often the nearest other text stays the same."""
    from bertlab.nn.model import BertModel
    from bertlab.nn.precision import quantize_int8
    from bertlab.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(model_dir)
    fp32 = BertModel.from_pretrained(model_dir, attn_implementation="packed")
    int8 = quantize_int8(fp32)
    batches = [
        tok(texts[i : i + 32], padding=True, truncation=True, max_length=128, return_tensors="pt")
        for i in range(0, len(texts), 32)
    ]

    def embed(model) -> torch.Tensor:
        out = []
        with torch.inference_mode():
            for b in batches:
                h = model(**b).last_hidden_state
                m = b["attention_mask"].unsqueeze(-1).to(h.dtype)
                out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1))
        return torch.cat(out)

    times = alternate({"float32": lambda: embed(fp32), "int8": lambda: embed(int8)}, repeats)
    a, b = embed(fp32), embed(int8)
    cos = (a * b).sum(-1)
    sa, sb = a @ a.T, b @ b.T
    sa.fill_diagonal_(-2)
    sb.fill_diagonal_(-2)
    tokens = sum(int(x["attention_mask"].sum()) for x in batches)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "workload": "int8",
        "texts": len(texts),
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "speedup_over_float32": med["float32"] / med["int8"],
        "cosine_to_float32": {"mean": float(cos.mean()), "min": float(cos.min())},
        "nearest_neighbour_agreement": float((sa.argmax(1) == sb.argmax(1)).float().mean()),
    }


def markdown_table(report: dict[str, Any]) -> str:
    """The model results of a report as a Markdown table (for the performance page)."""
    lines = [
        "| model | workload | dtype | bertlab tokens/s | transformers tokens/s | ratio "
        "| peak MB (bertlab / transformers) "
        "| useful FLOPs / matmul rate (bertlab / transformers) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["results"]:
        t, p, u = r["tokens_per_s"], r["peak_memory_mb"], r["useful_share_of_matmul"]
        lines.append(
            f"| {r['model']} | {r['workload']} | {r['dtype']} | {t['bertlab']:,.0f} "
            f"| {t['transformers']:,.0f} | **{r['ratio']:.2f}x** "
            f"| {p['bertlab']:,.0f} / {p['transformers']:,.0f} "
            f"| {u['bertlab']:.0%} / {u['transformers']:.0%} |"
        )
    return "\n".join(lines)


# ============================================================================ the suite
SUITE = ("tokenizer", "int8", *WORKLOADS)
KERNELS = ("packed", "sdpa", "eager")  # bertlab's side; transformers runs SDPA


def run_suite(
    workloads: Sequence[str] = (),
    models: Sequence[str] = ("default", "base"),
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    *,
    repeats: int = 5,
    device: str = "cpu",
    kernel: str = "packed",
    draws: int = DRAWS,
    threads: int | None = None,
    data: str | os.PathLike | None = None,
    on_result: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``workloads`` (default: all of ``SUITE``) into one report: ``tokenizer`` and
    ``int8`` on the first model folder of ``models`` (the bundled one if all are presets),
    every network workload on every model and dtype. Everything is checked before the first
    run. ``on_result(name, result)`` is called as each result comes ("tokenizer", "int8" or
    "model"). Ctrl-C stops the runs and returns what was measured, with ``interrupted: True``."""
    from bertlab.files import resolve_model_dir
    from bertlab.nn.config import PRESETS
    from bertlab.nn.precision import int8_supported

    check_counts(repeats=repeats, draws=draws, threads=threads)
    workloads = list(workloads) or list(SUITE)
    for name, given, known in (
        ("workload", workloads, SUITE),
        ("dtype", dtypes, tuple(DTYPES)),
        ("kernel", [kernel], KERNELS),
        ("device", [device], ("cpu", "cuda")),
    ):
        unknown = [x for x in given if x not in known]
        if unknown:
            raise ValueError(f"unknown {name} {unknown[0]!r}; choose from {', '.join(known)}")
    if not models or not dtypes:
        raise ValueError("give at least one model and one dtype")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here")
    # int8 where this CPU has a kernel for it; elsewhere (Arm, x86 without AVX2) the suite
    # reports it as not measured, and a run of int8 alone is refused, each with the reason
    int8_why = int8_supported() if "int8" in workloads else None
    if int8_why is not None and set(workloads) == {"int8"}:
        raise ValueError(f"int8 does not run on this CPU: {int8_why}")
    folders = [m for m in models if m not in PRESETS]
    for folder in folders:
        resolve_model_dir(folder)  # a missing folder is named now, not after an hour of runs
    folder = folders[0] if folders else "default"  # a real checkpoint and its vocabulary
    require_transformers()
    texts, origin = tokenizer_texts(data) if {"tokenizer", "int8"} & set(workloads) else ([], "")

    if threads:
        torch.set_num_threads(threads)
    report: dict[str, Any] = {"machine": machine(), "results": []}
    report["machine"]["device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    done = on_result or (lambda name, result: None)
    try:
        if "tokenizer" in workloads:
            r = bench_tokenizer(folder, texts, repeats=repeats)
            report["tokenizer"] = {"data": origin, **r}
            done("tokenizer", report["tokenizer"])
        if "int8" in workloads:
            if int8_why is not None:
                report["int8"] = {"model": folder, "unavailable": int8_why}
            else:
                sample = list(dict.fromkeys(texts))[:1000]
                r = bench_int8(folder, sample, repeats=repeats)
                report["int8"] = {"model": folder, "data": origin, **r}
            done("int8", report["int8"])
        for model in models:
            for workload in (w for w in workloads if w in WORKLOADS):
                for dtype in dtypes:
                    r = bench_model(model, workload, dtype, repeats, device, kernel, draws)
                    report["results"].append(r)
                    done("model", r)
    except KeyboardInterrupt:
        report["interrupted"] = True
    return report

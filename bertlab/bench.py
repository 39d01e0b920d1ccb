"""``bertlab bench``: bertlab side by side with transformers, in one process, on the same inputs.

Runs alternate (bertlab, reference, bertlab, ...) so that a noisy neighbour on a shared machine
slows both sides alike; the figures are medians over the runs, and the ratio is of the medians.
transformers is imported here only, and only when a benchmark runs: bertlab itself never needs it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


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


def alternate(runs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict:
    """Time each callable ``repeats`` times, interleaved; seconds per run, by name."""
    for _ in range(warmup):
        for fn in runs.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


# ============================================================================ tokenizer
def tokenizer_texts(data_dir: Path | None, fixtures: Path) -> tuple[list[str], str]:
    """Real texts for the tokenizer benchmark: SST-2 sentences, SQuAD contexts and WikiText
    lines, from the shared data folder when there is one, else from the repository's samples."""
    if data_dir is not None and (data_dir / "sst2" / "train.tsv").is_file():
        sst2, squad = data_dir / "sst2" / "train.tsv", data_dir / "squad" / "train-subset-v1.1.json"
        wiki, repeat = data_dir / "wikitext-2" / "wiki.valid.tokens", 1
        origin = f"{data_dir}: SST-2 train (first 20,000), SQuAD contexts, WikiText-2 valid"
    else:
        sst2, squad = fixtures / "sst2_sample.tsv", fixtures / "squad_sample.json"
        wiki, repeat = fixtures / "wikitext2_sample.tokens", 20
        origin = f"{fixtures} (repository samples, x{repeat})"
    lines = sst2.read_text(encoding="utf-8").splitlines()[1:20001]
    texts = [line.split("\t")[0] for line in lines]
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    texts += [p["context"] for a in articles for p in a["paragraphs"]]
    texts += [t for t in wiki.read_text(encoding="utf-8").splitlines() if t.strip()]
    return texts * repeat, origin


def bench_tokenizer(
    model_dir: str | os.PathLike, texts: list[str], batch_size: int = 1000, repeats: int = 5
) -> dict[str, Any]:
    """Batch tokenization throughput, bertlab vs transformers' fast (tokenizers-backed)
    BertTokenizer, both loaded from ``model_dir``, both returning lists of ids with padding off."""
    import transformers

    from .checkpoint import resolve_model_dir
    from .tokenizer import BertTokenizer

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

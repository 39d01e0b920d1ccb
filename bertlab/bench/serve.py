"""``bertlab bench serve``: bertlab's HTTP server under load, in its own process, driven over
loopback from this one.

The system is ``bertlab``: ``bertlab serve DIR`` (``POST /embed``), started from its command line
and waited for until its health route answers. Other servers are compared with it by the
benchmarks' harness (``benchmarks/harness/serve_peers.py`` in bertlab's repository: FastAPI +
sentence-transformers, Infinity), which gives ``bench_serve`` their command lines as ``peers``:
every server then gets the same model folder, thread count, sentences and load. A peer that
cannot run here is reported as not run, with the reason; a server that dies while starting,
with the end of its output.

Every server runs its model in one precision (``--dtype``): float32, bfloat16, or int8
(bertlab's calibrated int8, ``--compile`` to compile it). Before the load, each server embeds
the last QUALITY sentences once, in one request; their mean and lowest cosine to bertlab's
float32 pipeline and the share of nearest neighbours kept are the row's quality.

The load (``bertlab.bench.load``): asyncio clients over HTTP/1.1 keep-alive (httpx), a fixed
number of them, each sending its next request when its last one is answered (a closed loop).
Requests hold real sentences, the bundled SST-2 samples (dev, then train) in order, cycling;
tokens are counted with bertlab's tokenizer ([CLS] and [SEP] included), so tokens/s means the
same for every system. A warm-up runs first and is not counted. Latency runs from sending a
request to having read its answer, in the client; percentiles are nearest-rank (p99 is a
latency some request had). A 200 is a success (the first answer and every 100th are parsed:
one vector per sentence, one width); a 429 is counted apart from the errors (any other status,
or no answer). Server memory is the resident set (VmRSS in /proc/PID/status, the process and
its children), sampled twice a second.

The load generator (httpx, for the health checks and the quality request) and bertlab's server
(starlette, uvicorn) come with the ``serve-bench`` extra: a missing one is named before any
server starts.

Workloads:
* ``batch1``: ``--concurrency`` clients, one sentence per request (many short queries);
* ``batch256``: 4 clients, 256 sentences per request (the load of Infinity's own benchmarks);
* ``overload`` (bertlab only): clients are doubled from 1 until requests/s falls below 90% of
  the best so far (or to 256: ``peak_passed`` says which); the saturating concurrency S is
  the smallest within 10% of the best. A fresh server with ``--max-concurrent-requests S``
  then gets 4 S clients; a client turned away waits the median latency at S before it asks
  again, so each offers about the load of a served one. Reported: the share of 429s (0.75 if
  exactly S are admitted) and the p99 of admitted requests against the p99 at S with no limit
  and no excess (the unloaded p99);
* ``memory`` (bertlab only): a fresh server, batch-1 requests from ``--concurrency`` clients;
  its RSS before the first request, after the first 1,000, and every tenth of ``--requests``.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertlab.bench.load import (
    HOST,
    Request,
    Server,
    ServerError,
    ServerSpec,
    build_requests,
    free_port,
    run_phase,
    running,
)
from bertlab.bench.speed import machine
from bertlab.data import sample_sentences
from bertlab.extras import require

SYSTEMS = ("bertlab",)  # the servers of the package; the harness adds its peers
WORKLOADS = ("batch1", "batch256", "overload", "memory")
DTYPES = ("float32", "bfloat16", "int8")  # the precisions every server is run in (--dtype)
# Sentences each server embeds once, compared with bertlab's float32 pipeline: the last of the
# texts, so never the bundled SST-2 dev sentences bertlab's int8 is calibrated on by default.
QUALITY = 256
COMPARED = ("batch1", "batch256")  # every system; overload and memory are bertlab's alone
BATCH, BATCH_CLIENTS = 256, 4
FIRST = 1000  # memory is read after the first FIRST requests
# The overload workload's search for the saturating load (to 64 clients until 2026-11-24: with
# the lighter load generator, bertlab's requests/s still rose from 32 to 64).
SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OVERLOAD = 4  # times the saturating concurrency
# Where the other servers are compared (a file of bertlab's repository, not of the package).
HARNESS = "benchmarks/harness/serve_peers.py"

# A peer: (model folder, port, threads, dtype) -> how to start it and talk to it; Unavailable
# when it cannot run here.
PeerSpec = Callable[[str, int | str, int, str], ServerSpec]


class Unavailable(Exception):
    """A system that cannot run here: the reason is reported as "not run"."""


def embed_body(texts: list[str]) -> dict:
    """TEI's ``/embed`` request (bertlab serve's); one sentence as a string."""
    return {"inputs": texts[0] if len(texts) == 1 else texts, "normalize": True}


def installed_version(dist: str) -> str:
    """The installed version of the distribution ``dist``, or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def bertlab_spec(
    model_dir: str,
    port: int | str,
    threads: int,
    limit: int | None = None,
    dtype: str = "float32",
    compile: bool = False,
) -> ServerSpec:
    command = [sys.executable, "-m", "bertlab.cli.main", "serve", model_dir, "--host", HOST]
    command += ["--port", str(port), "--threads", str(threads), "--log-level", "warning"]
    command += ["--max-client-batch-size", str(BATCH)]  # its default, TEI's, is 32 texts
    command += ["--max-concurrent-requests", str(limit)] if limit else []
    command += ["--dtype", dtype] if dtype != "float32" else []
    command += ["--compile"] if compile else []
    return ServerSpec("bertlab", command, "/embed", embed_body, list, installed_version("bertlab"))


# ============================================================================ the load
def serve_texts() -> list[str]:
    """The bundled SST-2 sentences: dev, then train, in file order."""
    return sample_sentences(name="sst2_dev.tsv") + sample_sentences(name="sst2_train.tsv")


# ============================================================================ the benchmark
def check_options(
    systems: tuple[str, ...],
    workloads: tuple[str, ...],
    seconds: float,
    concurrency: int,
    requests: int,
    warmup: float,
    dtype: str = "float32",
    compile: bool = False,
    known: tuple[str, ...] = SYSTEMS,
) -> None:
    """Refuse what cannot be run, naming the value, and a missing package, naming the extra
    that brings it, before any server starts. ``known``: the systems there are (bertlab's and
    the peers given)."""
    for kind, given, choices in (("system", systems, known), ("workload", workloads, WORKLOADS)):
        bad = [x for x in given if x not in choices] or ([] if given else ["(none)"])
        if bad:
            where = ""  # the package's own systems alone: say where the others are
            if kind == "system" and choices == SYSTEMS:
                where = f" (the other servers: {HARNESS}, in bertlab's repository)"
            raise ValueError(f"unknown {kind} {bad[0]!r}; choose from {', '.join(choices)}{where}")
    if not 0 < seconds <= 3600:
        raise ValueError(f"seconds must be above 0 and at most 3600; got {seconds:g}")
    if not 1 <= concurrency <= 1024:
        raise ValueError(f"concurrency must be from 1 to 1024; got {concurrency}")
    if not FIRST <= requests <= 10_000_000:
        raise ValueError(f"requests must be from {FIRST} to 10,000,000; got {requests}")
    if not 0 <= warmup <= 600:
        raise ValueError(f"warmup must be from 0 to 600 seconds; got {warmup:g}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if compile:  # the arguments' own conflict first, then what this machine can run
        from bertlab.serve.engine import COMPILED_DTYPES

        if dtype not in COMPILED_DTYPES:
            raise ValueError(f"compile serves {' and '.join(COMPILED_DTYPES)}; got dtype {dtype}")
    if dtype == "bfloat16":
        from bertlab.nn.precision import bf16_supported

        why = bf16_supported()
        if why is not None:
            raise ValueError(f"dtype bfloat16 cannot run here: {why}")
    if dtype == "int8":
        from bertlab.nn.precision import int8_supported

        why = int8_supported()
        if why is not None:
            raise ValueError(f"dtype int8 cannot run here: {why}")
    if compile:
        from bertlab.nn.compiled import Compiled

        why = Compiled.available()
        if why is not None:
            raise ValueError(f"compile cannot run here: {why}")
    require(["httpx"], "serve-bench", "the load generator")
    if "bertlab" in systems:  # (orjson, the server's JSON writer, has a fallback)
        require(["starlette", "uvicorn"], "serve-bench", "bertlab's server")


@dataclass
class Bench:
    """What every phase of one benchmark shares."""

    specs: dict[str, Callable[..., ServerSpec]]  # name -> (port, limit=None) -> its spec
    texts: list[str]
    tokens: list[int]
    threads: int
    work: Path
    seconds: float
    warmup: float
    concurrency: int
    progress: Callable[[str], None]
    reference: Any = None  # (QUALITY, H) unit float32 vectors of the last texts, or None

    def server(self, name: str, limit: int | None = None):  # -> running(...)'s context
        port = free_port()
        self.progress(f"{name}: starting" + (f", at most {limit} requests in" if limit else ""))
        return running(self.specs[name](port, limit), port, self.work, self.threads)

    def phase(self, server: Server, requests: list[Request], clients: int, **kw) -> dict:
        url, spec = server.url + server.spec.path, server.spec
        return run_phase(url, requests, clients, vectors=spec.vectors, pid=server.proc.pid, **kw)


def bench_serve(
    systems: tuple[str, ...] | None = None,
    workloads: tuple[str, ...] = WORKLOADS,
    *,
    peers: dict[str, PeerSpec] | None = None,
    model: str = "default",
    seconds: float = 30.0,
    concurrency: int = 32,
    requests: int = 100_000,
    warmup: float = 3.0,
    threads: int | None = None,
    dtype: str = "float32",
    compile: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every system on the compared workloads; bertlab also under overload and for memory.
    ``systems``: by name, of bertlab's and ``peers``' (default: all of them); ``peers``: other
    servers, name -> ``PeerSpec`` (the benchmarks' harness gives them). ``dtype``: the precision
    every server runs its model in; ``compile``: bertlab's server with ``--compile``. Each
    server first embeds QUALITY sentences once, compared with bertlab's float32 pipeline
    (``quality``)."""
    from bertlab.files import resolve_model_dir
    from bertlab.tokenizer import BertTokenizer

    peers = peers or {}
    known = (*SYSTEMS, *peers)
    systems = known if systems is None else systems
    check_options(systems, workloads, seconds, concurrency, requests, warmup, dtype, compile, known)
    model_dir = str(resolve_model_dir(model))
    threads = threads or os.cpu_count() or 1
    texts = serve_texts()
    ids = BertTokenizer.from_pretrained(model_dir)(texts, truncation=True, max_length=512)
    tokens = [len(x) for x in ids["input_ids"]]
    report: dict[str, Any] = {
        "benchmark": "serve",
        "machine": machine(),
        "model": model_dir,
        "texts": f"bertlab's bundled SST-2 samples, {len(texts):,} sentences of "
        f"{sum(tokens) / len(texts):.1f} tokens on average",
        "threads": threads,
        "dtype": dtype,
        "bertlab_compiled": compile,
        "seconds": seconds,
        "warmup_s": warmup,
        "concurrency": concurrency,
        "unavailable": {},
        "failed": {},
        "systems": {},
    }
    if "bertlab" not in systems:
        for w in (w for w in workloads if w not in COMPARED):
            report["unavailable"][w] = "bertlab's alone, and bertlab was not asked"
    specs: dict[str, Callable[..., ServerSpec]] = {
        "bertlab": lambda port, limit=None: bertlab_spec(
            model_dir, port, threads, limit, dtype, compile
        ),
    }
    for name, peer in peers.items():  # a peer never runs with a limit (overload is bertlab's)
        specs[name] = lambda port, limit=None, peer=peer: peer(model_dir, port, threads, dtype)
    with tempfile.TemporaryDirectory(prefix="bertlab-bench-serve-") as tmp:
        bench = Bench(
            specs, texts, tokens, threads, Path(tmp), seconds, warmup, concurrency, progress,
            reference_vectors(model_dir, texts[-QUALITY:]),
        )  # fmt: skip
        for name in systems:
            try:
                spec = specs[name]("PORT")  # the command, as a template
            except Unavailable as e:
                report["unavailable"][name] = str(e)
                progress(f"{name}: not run: {e}")
                continue
            row = report["systems"][name] = {"version": spec.version, "command": spec.command}
            try:
                bench_system(bench, name, spec, workloads, requests, row)
            except ServerError as e:
                report["failed"][name] = str(e)
                progress(f"{name}: failed: {e}")
    return report


def bench_system(
    bench: Bench, name: str, spec: ServerSpec, workloads: tuple[str, ...], count: int, row: dict
) -> None:
    """One system's workloads into ``row``: the compared ones on one server, then (bertlab's)
    the saturation sweep on it, overload on a server with a limit, memory on a fresh one."""
    batch1 = build_requests(bench.texts, bench.tokens, 1, spec.body)
    loads = {
        "batch1": (batch1, bench.concurrency),
        "batch256": (build_requests(bench.texts, bench.tokens, BATCH, spec.body), BATCH_CLIENTS),
    }
    timed = {"seconds": bench.seconds, "warmup": bench.warmup}
    own = name == "bertlab"
    with bench.server(name) as server:
        if bench.reference is not None:
            row["quality"] = quality(server, bench.texts[-len(bench.reference) :], bench.reference)
            bench.progress(f"{name}: quality {row['quality']}")
        for w in (w for w in COMPARED if w in workloads):
            bench.progress(f"{name}: {w}, {loads[w][1]} clients, {bench.seconds:g} s")
            row[w] = bench.phase(server, *loads[w], **timed)
        sweep = saturation(bench, server, batch1) if own and "overload" in workloads else None
    if sweep is not None:
        s = sweep["saturating_concurrency"]
        with bench.server(name, limit=s) as server:
            bench.progress(f"{name}: overload, {OVERLOAD * s} clients, {bench.seconds:g} s")
            pause = (sweep["p50_ms"] or 0) / 1000
            phase = bench.phase(server, batch1, OVERLOAD * s, reject_pause=pause, **timed)
        admitted, unloaded = phase["latency_ms"]["p99"], sweep["p99_ms"]
        row["overload"] = {
            "saturating_concurrency": s,
            "first_plateau_concurrency": sweep["first_plateau_concurrency"],
            "peak_passed": sweep["peak_passed"],
            "sweep": sweep["steps"],
            "clients": phase["clients"],
            "rejected_share": phase["rejected_share"],
            "admitted_p99_ms": admitted,
            "unloaded_p99_ms": unloaded,
            "p99_ratio": admitted / unloaded if admitted and unloaded else None,
            "batch1_p99_ms": row["batch1"]["latency_ms"]["p99"] if "batch1" in row else None,
            "phase": phase,
        }
    if own and "memory" in workloads:
        marks = tuple(sorted({FIRST, *range(count // 10, count + 1, count // 10)}))
        with bench.server(name) as server:
            bench.progress(f"{name}: memory, {count:,} requests")
            phase = bench.phase(server, batch1, bench.concurrency, count=count, marks=marks)
        first, last = (phase["rss_mib_at"].get(str(n)) for n in (FIRST, count))
        row["memory"] = {
            "requests": count,
            "rss_mib_before": phase["server_rss_mib"]["start"],
            "rss_mib_after_first": first,
            "rss_mib_after_all": last,
            "growth_mib": last - first if first is not None and last is not None else None,
            "phase": phase,
        }


def reference_vectors(model_dir: str, texts: list[str]) -> Any:
    """bertlab's float32 pipeline's unit vectors of ``texts``: what quality is measured against."""
    from bertlab.pipelines import pipeline

    return pipeline("embed", model_dir)(texts).float().numpy()


def quality(server: Server, texts: list[str], reference: Any) -> dict[str, float]:
    """The server's vectors of ``texts`` (one request) against ``reference``: mean and lowest
    cosine, and the share of texts whose nearest other text stays the same (runtimes.quality)."""
    import httpx
    import numpy as np

    from bertlab.bench.runtimes import quality as compare

    url = server.url + server.spec.path
    with httpx.Client(trust_env=False, timeout=120) as http:
        answer = http.post(url, json=server.spec.body(texts))
    if answer.status_code != 200:
        raise ServerError(f"{server.spec.name} answered {answer.status_code}: {answer.text[:300]}")
    got = np.asarray(server.spec.vectors(answer.json()), dtype=np.float32)
    got /= np.linalg.norm(got, axis=-1, keepdims=True)
    return {k: round(v, 6) for k, v in compare(reference, got).items()}


def saturation(bench: Bench, server: Server, requests: list[Request]) -> dict[str, Any]:
    """Double the clients from 1 until requests/s falls below 90% of the best so far (past the
    peak); the saturating concurrency is the smallest within 10% of the best requests/s.

    Until 2026-11-24 the sweep stopped at the first doubling that added less than 10%. A server
    that runs a lone request at once (no batching wait) gains little from 1 to 2 clients and
    much from 2 to 16, and that rule took 1 client for its saturating load; it is still reported
    (``first_plateau_concurrency``)."""
    steps: list[dict[str, Any]] = []
    plateau, fell = None, False
    for c in SWEEP:
        r = bench.phase(server, requests, c, seconds=max(1.0, bench.seconds / 5), warmup=0.5)
        steps.append({"clients": c, "requests_per_s": r["requests_per_s"], **r["latency_ms"]})
        bench.progress(f"{server.spec.name}: {c} clients, {r['requests_per_s']:.0f} requests/s")
        if len(steps) > 1 and plateau is None:
            if r["requests_per_s"] < 1.1 * steps[-2]["requests_per_s"]:
                plateau = steps[-2]["clients"]  # the old rule's choice
        if r["requests_per_s"] < 0.9 * max(s["requests_per_s"] for s in steps):
            fell = True
            break
    best = max(s["requests_per_s"] for s in steps)
    at = next(s for s in steps if s["requests_per_s"] >= 0.9 * best)
    return {
        "saturating_concurrency": at["clients"],
        "first_plateau_concurrency": plateau,
        "peak_passed": fell,  # False: still within 90% of the best at the sweep's last step
        "p50_ms": at["p50"],
        "p99_ms": at["p99"],
        "steps": steps,
    }


# ============================================================================ the report
def markdown_table(report: dict[str, Any]) -> str:
    """One row per system and compared workload."""
    out = [
        "| system | workload | clients | requests/s | sentences/s | tokens/s | p50 ms | p95 ms "
        "| p99 ms | errors | server RSS MiB (peak) | cosine to float32 (mean, lowest) "
        "| nearest kept |",
        "|" + " --- |" * 13,
    ]
    for name, row in report["systems"].items():
        for w in (w for w in COMPARED if w in row):
            r, lat = row[w], row[w]["latency_ms"]
            ms = [f"{lat[q]:.1f}" if lat[q] is not None else "n/a" for q in ("p50", "p95", "p99")]
            rss = (r["server_rss_mib"] or {}).get("peak", math.nan)
            q = row.get("quality")
            cos = f"{q['cosine_mean']:.4f}, {q['cosine_min']:.4f}" if q else "n/a"
            kept = f"{q['nearest_neighbour_kept']:.0%}" if q else "n/a"
            out.append(
                f"| {name} | {w} | {r['clients']} | {r['requests_per_s']:,.1f} | "
                f"{r['texts_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {' | '.join(ms)} | "
                f"{r['errors']} of {r['requests']:,} | {rss:,.0f} | {cos} | {kept} |"
            )
    return "\n".join(out)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The overload and memory findings, and what was not run, one line each."""
    lines, row, nan = [], report["systems"].get("bertlab", {}), math.nan
    if "overload" in row:
        o = row["overload"]
        lines.append(
            f"overload: saturated at {o['saturating_concurrency']} clients"
            f"{'' if o.get('peak_passed', True) else ' (or more: the sweep ended still rising)'}; "
            f"at {o['clients']} "
            f"clients {o['rejected_share']:.0%} answered 429, admitted p99 "
            f"{o['admitted_p99_ms'] or nan:.1f} ms against {o['unloaded_p99_ms'] or nan:.1f} ms "
            f"unloaded ({o['p99_ratio'] or nan:.2f}x), {o['phase']['errors']} errors"
        )
    if "memory" in row:
        m = row["memory"]
        lines.append(
            f"memory: server RSS {m['rss_mib_before']:.0f} MiB before the first request, "
            f"{m['rss_mib_after_first'] or nan:.0f} MiB after {FIRST:,}, "
            f"{m['rss_mib_after_all'] or nan:.0f} MiB after {m['requests']:,} "
            f"({m['phase']['errors']} errors)"
        )
    lines += [f"{k}: not run: {v}" for k, v in report["unavailable"].items()]
    lines += [f"{k}: failed: {v}" for k, v in report["failed"].items()]
    return lines


def plot(report: dict[str, Any], path: str | os.PathLike) -> None:
    """Tokens/s and latency (p99 bars, p50 dots) per system and workload; bertlab's RSS along
    the memory run when there is one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory = report["systems"].get("bertlab", {}).get("memory")
    fig, axes = plt.subplots(1, 3 if memory else 2, figsize=(14 if memory else 10, 4))
    names = list(report["systems"])
    width, seen = 0.8 / max(1, len(names)), []  # the latencies drawn
    for k, name in enumerate(names):
        rows = [report["systems"][name].get(w) or {} for w in COMPARED]
        xs = [i + k * width for i in range(len(COMPARED))]
        lat = [r.get("latency_ms", {}) for r in rows]
        axes[0].bar(xs, [r.get("tokens_per_s", 0) for r in rows], width, label=name)
        axes[1].bar(xs, [x.get("p99") or 0 for x in lat], width, label=name)
        axes[1].plot(xs, [x.get("p50") or math.nan for x in lat], "k.")
        seen += [v for x in lat for v in (x.get("p50"), x.get("p99")) if v]
    for ax, label in ((axes[0], "real tokens/s"), (axes[1], "latency ms (bars p99, dots p50)")):
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(COMPARED))], COMPARED)
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    if seen:  # a log scale's limits, from what was drawn (the bars start at 0)
        axes[1].set_ylim(min(seen) / 1.5, max(seen) * 1.5)
    if memory:
        at = {"0": memory["rss_mib_before"], **memory["phase"]["rss_mib_at"]}
        axes[2].plot([int(k) for k in at], list(at.values()), "o-")
        axes[2].set_xlabel("requests answered")
        axes[2].set_ylabel("bertlab server RSS MiB")
    fig.suptitle(f"{report['machine']['cpu']}, {report['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

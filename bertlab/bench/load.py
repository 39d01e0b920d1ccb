"""HTTP servers as subprocesses, and closed-loop load against them (``bertlab bench serve``).

``running(spec, ...)`` starts a server from its command line, waits until its health route
answers 200 (a ``ServerError`` with the end of its output if it dies or takes too long) and
stops it afterwards. ``run_phase(...)`` drives one with a fixed number of asyncio clients, each
on an HTTP/1.1 keep-alive connection of its own sending its next request when its last one is
answered, for a time or a count of requests after a warm-up not counted, and returns what came
back: successes with their latencies, sentences and tokens, 429s apart from the errors, and the
server's resident memory (``rss_mib``: VmRSS in /proc/PID/status, the process and its children)
sampled twice a second. Percentiles are nearest-rank: p99 is a latency some request had.

The clients (``Connection``) send bytes prepared once per phase and parse no more of an answer
than its status line and length: on a machine whose cores the servers share, what the load
generator spends is taken from the server it measures (a general HTTP client spends a large
fraction of the CPU time a small model needs to answer the request).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HOST = "127.0.0.1"
STARTUP_S, REQUEST_S, PHASE_LIMIT_S = 300.0, 120.0, 3600.0
CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)")
CHECK_EVERY = 100  # the first successful answer of a phase, and every 100th, is parsed
# Every server: no hub, no telemetry, PYTHONUNBUFFERED for its log; OMP_NUM_THREADS is added.
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}
SERVER_ENV |= {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "PYTHONUNBUFFERED": "1"}


class ServerError(RuntimeError):
    """A server that died or never answered its health route: its output's end is in the text."""


@dataclass(frozen=True)
class ServerSpec:
    """How to start one system and talk to it."""

    name: str
    command: list[str]
    path: str  # the embedding route
    body: Callable[[list[str]], dict]  # sentences -> the request's JSON
    vectors: Callable[[Any], list]  # the answer's JSON -> its vectors
    version: str = "unknown"
    health: str = "/health"


# ============================================================================ servers
@dataclass
class Server:
    spec: ServerSpec
    proc: subprocess.Popen
    url: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    return text[-chars:].strip() or "(nothing)"


@contextmanager
def running(
    spec: ServerSpec, port: int, work: Path, threads: int, timeout: float = STARTUP_S
) -> Iterator[Server]:
    """Start ``spec``'s command (its output into a log in ``work``), wait until its health
    route answers 200, stop it on exit. ServerError, with the end of its output, if it exits
    first or takes past ``timeout``."""
    import httpx

    log = work / f"{spec.name}-{port}.log"
    env = {**os.environ, **SERVER_ENV, "OMP_NUM_THREADS": str(threads)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            spec.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    server = Server(spec, proc, f"http://{HOST}:{port}")
    try:
        health, deadline = server.url + spec.health, time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=5) as http:
            while True:
                if proc.poll() is not None:
                    why = f"exited with status {proc.returncode} before {health} answered"
                    raise ServerError(f"{spec.name} {why}; its output ended with:\n{tail(log)}")
                try:
                    if http.get(health).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    why = f"{health} did not answer 200 within {timeout:.0f} s"
                    raise ServerError(f"{spec.name}: {why}; its output ended with:\n{tail(log)}")
                time.sleep(0.25)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mib(pid: int) -> float:
    """The resident set of a process and its descendants (VmRSS, /proc/PID/status), MiB."""
    total_kib, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
            total_kib += next(int(x.split()[1]) for x in lines if x.startswith("VmRSS:"))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue  # gone meanwhile, or a kernel thread with no VmRSS
    return total_kib / 1024


# ============================================================================ the load
@dataclass(frozen=True)
class Request:
    body: bytes
    texts: int
    tokens: int


def build_requests(
    texts: list[str], tokens: list[int], per_request: int, body: Callable[[list[str]], dict]
) -> list[Request]:
    """Consecutive groups of ``per_request`` texts (wrapping round), one serialised body each."""
    n, out = len(texts), []
    for i in range(math.ceil(n / per_request)):
        idx = [(i * per_request + j) % n for j in range(per_request)]
        payload = json.dumps(body([texts[k] for k in idx])).encode()
        out.append(Request(payload, len(idx), sum(tokens[k] for k in idx)))
    return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not sorted_values:
        return None
    return sorted_values[max(1, math.ceil(q / 100 * len(sorted_values))) - 1]


def check_answer(content: bytes, texts: int, vectors: Callable[[Any], list]) -> str:
    """'N x D' if the answer holds one vector per sentence, all of one width; else ValueError."""
    got = vectors(json.loads(content))
    widths = {len(v) for v in got}
    if len(got) != texts or len(widths) != 1:
        raise ValueError(f"{len(got)} vectors of widths {sorted(widths)} for {texts} sentences")
    return f"{texts} x {widths.pop()}"


@dataclass
class Tally:
    """What one phase's clients sent and got back."""

    pid: int | None = None  # the server's, for its memory
    issued: int = 0
    ok: int = 0
    texts: int = 0
    tokens: int = 0
    rejected: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests
    answer: str | None = None  # what the last parsed answer held
    rss: list[float] = field(default_factory=list)
    rss_at: dict[int, float] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        return self.ok + self.rejected + sum(self.errors.values())


class Connection:
    """One HTTP/1.1 keep-alive connection that POSTs prepared requests and reads their answers:
    the status and the body (by Content-Length, or chunked, or to the close). Opened on first
    use and again after the server closed it or anything went wrong."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, wire: bytes) -> tuple[int, bytes]:
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.write(wire)
            await self.writer.drain()
            head = (await self.reader.readuntil(b"\r\n\r\n")).lower()
            if not head.startswith(b"http/1."):
                raise ValueError(f"not an HTTP/1 answer: {head[:40]!r}")
            status = int(head[9:12])
            closes = b"\r\nconnection: close" in head
            if b"\r\ntransfer-encoding: chunked" in head:
                body = await self._chunks()
            elif (length := CONTENT_LENGTH.search(head)) is not None:
                body = await self.reader.readexactly(int(length[1]))
            else:  # the body runs to the close
                body, closes = await self.reader.read(), True
            if closes:
                self.close()
            return status, body
        except BaseException:
            self.close()  # whatever was half read is gone with the connection
            raise

    async def _chunks(self) -> bytes:
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append((await self.reader.readexactly(size + 2))[:-2])
        while await self.reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailers
        return b"".join(parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def wire_requests(url: str, requests: list[Request]) -> tuple[str, int, list[bytes]]:
    """Each request as the bytes sent for it (head and body), with the host and port."""
    parts = urlsplit(url)
    host, port = parts.hostname or HOST, parts.port or 80
    head = f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    head += "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n"
    return host, port, [head.format(len(r.body)).encode() + r.body for r in requests]


def run_phase(
    url: str,
    requests: list[Request],
    clients: int,
    *,
    seconds: float = PHASE_LIMIT_S,
    count: int | None = None,
    warmup: float = 0.0,
    vectors: Callable[[Any], list] | None = None,
    pid: int | None = None,
    reject_pause: float = 0.0,
    marks: tuple[int, ...] = (),
) -> dict[str, Any]:
    """``clients`` closed-loop clients POSTing ``requests`` (cycling) to ``url`` for ``seconds``
    or until ``count`` requests, after ``warmup`` seconds not counted; a client turned away
    (429) waits ``reject_pause`` s. ``vectors`` reads an answer's vectors, to check them;
    ``pid``, the server's, for its memory, also read at the answered counts in ``marks``."""
    host, port, wires = wire_requests(url, requests)

    async def client(t: Tally, stop: float, count: int | None) -> None:
        http = Connection(host, port)
        while time.perf_counter() < stop and (count is None or t.issued < count):
            i = t.issued % len(requests)
            req = requests[i]
            t.issued += 1
            start = time.perf_counter()
            try:
                async with asyncio.timeout(REQUEST_S):
                    status, content = await http.post(wires[i])
            except (OSError, EOFError, ValueError, TimeoutError, asyncio.LimitOverrunError) as e:
                status = type(e).__name__
            elapsed = time.perf_counter() - start
            if status == 200 and vectors is not None and t.ok % CHECK_EVERY == 0:
                try:
                    t.answer = check_answer(content, req.texts, vectors)
                except (ValueError, KeyError, TypeError) as e:
                    status = f"wrong answer: {e}"[:120]
            if status == 200:
                t.ok, t.texts, t.tokens = t.ok + 1, t.texts + req.texts, t.tokens + req.tokens
                t.latencies.append(elapsed)
            elif status == 429:
                t.rejected += 1
            else:
                t.errors[status if isinstance(status, str) else f"HTTP {status}"] += 1
            if t.pid is not None and t.answered in marks:
                t.rss_at[t.answered] = rss_mib(t.pid)
            if status == 429 and reject_pause:
                await asyncio.sleep(reject_pause)
        http.close()

    async def sample(t: Tally) -> None:
        while True:
            await asyncio.sleep(0.5)
            t.rss.append(rss_mib(t.pid))

    async def drive(t: Tally, seconds: float, count: int | None) -> None:
        if t.pid is not None:
            t.rss.append(rss_mib(t.pid))  # before the first request
            sampler = asyncio.create_task(sample(t))
        stop = time.perf_counter() + seconds
        await asyncio.gather(*(client(t, stop, count) for _ in range(clients)))
        if t.pid is not None:
            sampler.cancel()
            t.rss.append(rss_mib(t.pid))

    if warmup > 0:
        asyncio.run(drive(Tally(), warmup, None))
    t = Tally(pid=pid)
    cpu, start = time.process_time(), time.perf_counter()
    asyncio.run(drive(t, seconds, count))
    wall, ms = time.perf_counter() - start, sorted(x * 1000 for x in t.latencies)
    return {
        "clients": clients,
        "requests": t.answered,
        "ok": t.ok,
        "rejected_429": t.rejected,
        "rejected_share": t.rejected / t.answered if t.answered else 0.0,
        "errors": sum(t.errors.values()),
        "error_kinds": dict(t.errors),
        "seconds": wall,
        "requests_per_s": t.ok / wall,
        "texts_per_s": t.texts / wall,
        "tokens_per_s": t.tokens / wall,
        "latency_ms": {f"p{q}": percentile(ms, q) for q in (50, 95, 99)}
        | {"mean": sum(ms) / len(ms) if ms else None, "max": ms[-1] if ms else None},
        "answer": t.answer,
        "server_rss_mib": {"start": t.rss[0], "peak": max(t.rss), "end": t.rss[-1]}
        if t.rss
        else None,
        "rss_mib_at": {str(k): v for k, v in sorted(t.rss_at.items())},
        "client_cpu_s": time.process_time() - cpu,  # the load generator's, this process
    }

"""The server's Prometheus metrics, written in the text exposition format (version 0.0.4)
without a client library: request counts by route and status, request latency histograms by
route, the requests in flight, the queue depth per model, batch sizes in tokens and sequences,
and tokens computed (a counter: ``rate()`` of it is tokens/s)."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)
SEQUENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return "{" + inner + "}"


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts: dict[tuple, list[int]] = defaultdict(lambda: [0] * (len(buckets) + 1))
        self.sums: dict[tuple, float] = defaultdict(float)

    def observe(self, labels: tuple, x: float) -> None:
        self.counts[labels][bisect.bisect_left(self.buckets, x)] += 1
        self.sums[labels] += x

    def lines(self, name: str) -> list[str]:
        out = []
        for labels, counts in sorted(self.counts.items()):
            total = 0
            for le, c in zip((*self.buckets, "+Inf"), counts, strict=True):
                total += c
                out.append(f"{name}_bucket{_labels((*labels, ('le', str(le))))} {total}")
            out.append(f"{name}_sum{_labels(labels)} {self.sums[labels]}")
            out.append(f"{name}_count{_labels(labels)} {total}")
        return out


class Metrics:
    """What the server counts; ``render()`` is the /metrics page. Thread-safe."""

    def __init__(
        self, queue_depth: Callable[[], dict[str, int]], in_flight: Callable[[], int] = lambda: 0
    ):
        self._lock = threading.Lock()
        self.requests: dict[tuple, int] = defaultdict(int)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.batch_sequences = Histogram(SEQUENCE_BUCKETS)
        self.tokens: dict[tuple, int] = defaultdict(int)
        self.inference_seconds: dict[tuple, float] = defaultdict(float)
        self.queue_depth = queue_depth
        self.in_flight = in_flight

    def request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(("route", route), ("status", str(status)))] += 1
            self.latency.observe((("route", route),), seconds)

    def batch(self, model: str, tokens: int, sequences: int, seconds: float) -> None:
        with self._lock:
            key = (("model", model),)
            self.batch_tokens.observe(key, tokens)
            self.batch_sequences.observe(key, sequences)
            self.tokens[key] += tokens
            self.inference_seconds[key] += seconds

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP bertlab_requests_total Requests answered, by route and HTTP status.",
                "# TYPE bertlab_requests_total counter",
                *(
                    f"bertlab_requests_total{_labels(k)} {v}"
                    for k, v in sorted(self.requests.items())
                ),
                "# HELP bertlab_request_seconds Request latency, by route.",
                "# TYPE bertlab_request_seconds histogram",
                *self.latency.lines("bertlab_request_seconds"),
                "# HELP bertlab_batch_tokens Real tokens per batch run, by model.",
                "# TYPE bertlab_batch_tokens histogram",
                *self.batch_tokens.lines("bertlab_batch_tokens"),
                "# HELP bertlab_batch_sequences Sequences per batch run, by model.",
                "# TYPE bertlab_batch_sequences histogram",
                *self.batch_sequences.lines("bertlab_batch_sequences"),
                "# HELP bertlab_tokens_total Real tokens computed, by model (rate: tokens/s).",
                "# TYPE bertlab_tokens_total counter",
                *(f"bertlab_tokens_total{_labels(k)} {v}" for k, v in sorted(self.tokens.items())),
                "# HELP bertlab_inference_seconds_total Seconds spent running batches, by model.",
                "# TYPE bertlab_inference_seconds_total counter",
                *(
                    f"bertlab_inference_seconds_total{_labels(k)} {v}"
                    for k, v in sorted(self.inference_seconds.items())
                ),
            ]
        lines += [
            "# HELP bertlab_requests_in_flight Requests admitted and not yet answered.",
            "# TYPE bertlab_requests_in_flight gauge",
            f"bertlab_requests_in_flight {self.in_flight()}",
            "# HELP bertlab_queue_depth Sequences waiting for a batch, by model.",
            "# TYPE bertlab_queue_depth gauge",
            *(f'bertlab_queue_depth{{model="{m}"}} {n}' for m, n in self.queue_depth().items()),
        ]
        return "\n".join(lines) + "\n"

"""bertlab bench serve: the load generator counts what it sent and what came back (successes,
errors and 429s apart, latencies, tokens), percentiles are right on known data, servers are
started, waited for and stopped (one that dies is named with its output), a peer that cannot
run is reported as not run, and bad options are refused first. A stub server stands in for the
real ones: a stdlib HTTP/1.1 server in its own process. The peers themselves (FastAPI +
sentence-transformers, Infinity) are the benchmarks' harness's: tests/test_bench_harness.py.
Speed is recorded in benchmarks/, never asserted here."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bertlab.bench import serve
from bertlab.bench.load import (
    ServerError,
    ServerSpec,
    build_requests,
    free_port,
    percentile,
    rss_mib,
    run_phase,
    running,
)
from bertlab.bench.serve import bench_serve, embed_body, markdown_table, plot, summary_lines
from bertlab.cli.main import main

# argv: PORT DELAY LIMIT. Answers /embed with one 4-wide vector per text, one request at a time
# (a lock held for DELAY seconds), 500 for a text "FAIL", 429 for "BUSY" or past LIMIT requests
# in the server at once (0: no limit), no vectors for "WRONG".
STUB = r"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, delay, limit = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
work, count, inside = threading.Lock(), threading.Lock(), [0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms wait between

    def log_message(self, *args):
        pass

    def send(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self):
        texts = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["inputs"]
        texts = [texts] if isinstance(texts, str) else texts
        with count:
            inside[0] += 1
            admitted = not limit or inside[0] <= limit
        try:
            if not admitted or "BUSY" in texts:
                return self.send(429, {"error": "busy"})
            if "FAIL" in texts:
                return self.send(500, {"error": "failed"})
            with work:
                time.sleep(delay)
            self.send(200, [] if "WRONG" in texts else [[0.5] * 4 for _ in texts])
        finally:
            with count:
                inside[0] -= 1


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def stub_spec(tmp_path, name, port, delay=0.0, limit=None):
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    command = [sys.executable, str(script), str(port), str(delay), str(limit or 0)]
    return ServerSpec(name, command, "/embed", embed_body, list, "stub")


@pytest.fixture(scope="module")
def stub(module_tmp):
    tmp = module_tmp.mktemp("stub")
    port = free_port()
    with running(stub_spec(tmp, "stub", port), port, tmp, threads=1, timeout=30) as server:
        yield server


def test_the_load_counts_successes_errors_and_429s_apart(stub):
    texts = ["a", "b", "FAIL", "BUSY", "c"]
    requests = build_requests(texts, [3, 4, 5, 6, 7], 1, embed_body)
    r = run_phase(stub.url + "/embed", requests, 4, count=100, vectors=list, pid=stub.proc.pid)
    assert (r["requests"], r["ok"], r["errors"], r["rejected_429"]) == (100, 60, 20, 20)
    assert r["error_kinds"] == {"HTTP 500": 20}
    assert r["rejected_share"] == 0.2
    assert r["tokens_per_s"] * r["seconds"] == pytest.approx(20 * (3 + 4 + 7))
    assert r["texts_per_s"] * r["seconds"] == pytest.approx(60)
    lat = r["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"] < 10_000
    assert r["answer"] == "1 x 4"
    assert 1 < r["server_rss_mib"]["start"] <= r["server_rss_mib"]["peak"] < 10_000


def test_batches_of_sentences_are_consecutive_and_wrap_round():
    texts = [f"t{i}" for i in range(5)]
    requests = build_requests(texts, [1, 2, 3, 4, 5], 2, embed_body)
    bodies = [json.loads(r.body)["inputs"] for r in requests]
    assert bodies == [["t0", "t1"], ["t2", "t3"], ["t4", "t0"]]
    assert [(r.texts, r.tokens) for r in requests] == [(2, 3), (2, 7), (2, 6)]
    assert json.loads(build_requests(texts, [1] * 5, 1, embed_body)[0].body) == {
        "inputs": "t0",
        "normalize": True,
    }


def test_a_wrong_answer_is_an_error_and_a_timed_phase_stops_by_itself(stub):
    url = stub.url + "/embed"
    wrong = run_phase(url, build_requests(["WRONG"], [3], 1, embed_body), 2, count=10, vectors=list)
    assert (wrong["ok"], wrong["errors"]) == (0, 10)
    assert list(wrong["error_kinds"]) == ["wrong answer: 0 vectors of widths [] for 1 sentences"]
    timed = run_phase(url, build_requests(["a"], [3], 1, embed_body), 2, seconds=0.3, warmup=0.1)
    assert timed["ok"] > 0 and timed["errors"] == 0 and 0.3 <= timed["seconds"] < 5


# Raw answers by the request's text: chunked with a trailer, Connection: close, no length (the
# body runs to the close), a dropped connection, a line that is not HTTP, and a plain one.
RAW = {
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\n[[0.5\r\n7;x=1\r\n, 0.5]]\r\n0\r\nX-Trailer: 1\r\n\r\n",
    "close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 12\r\n\r\n[[0.5, 0.5]]",
    "nolength": b"HTTP/1.0 200 OK\r\n\r\n[[0.5, 0.5]]",
    "drop": b"",
    "junk": b"garbage\r\n\r\n",
    "plain": b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n[[0.5, 0.5]]",
}


@pytest.fixture
def raw_server():
    import socketserver
    import threading

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while self.rfile.readline():  # the request line
                length = 0
                while (line := self.rfile.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                text = json.loads(self.rfile.read(length))["inputs"]
                self.wfile.write(RAW[text])
                if text in ("close", "nolength", "drop", "junk"):
                    return  # the connection closes

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/embed"
    server.shutdown()
    server.server_close()


def test_the_clients_read_chunked_closed_and_unsized_answers_and_survive_broken_ones(raw_server):
    for text in RAW:  # each answer of each kind read (and the first one checked)
        r = run_phase(
            raw_server, build_requests([text], [3], 1, embed_body), 1, count=3, vectors=list
        )
        if text in ("drop", "junk"):
            kind = "IncompleteReadError" if text == "drop" else "ValueError"
            assert (r["ok"], r["error_kinds"]) == (0, {kind: 3}), text
        else:
            assert (r["ok"], r["errors"], r["answer"]) == (3, 0, "1 x 2"), text
    texts = list(RAW)  # mixed: after a broken answer, the client connects again
    requests = build_requests(texts, [3] * len(texts), 1, embed_body)
    r = run_phase(raw_server, requests, 1, count=3 * len(texts), vectors=list)
    assert (r["requests"], r["ok"], r["errors"]) == (18, 12, 6)
    assert r["error_kinds"] == {"IncompleteReadError": 3, "ValueError": 3}


def test_percentiles_are_nearest_rank_on_known_data():
    ms = [float(x) for x in range(1, 101)]
    assert [percentile(ms, q) for q in (50, 95, 99, 100)] == [50.0, 95.0, 99.0, 100.0]
    assert [percentile([1.0, 2.0, 3.0, 4.0], q) for q in (50, 99)] == [2.0, 4.0]
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None


def test_a_server_that_dies_is_named_with_its_output_and_one_that_runs_is_stopped(tmp_path):
    dies = [sys.executable, "-c", "import sys; sys.stderr.write('boom: no model'); sys.exit(3)"]
    spec = ServerSpec("broken", dies, "/embed", embed_body, list)
    with pytest.raises(ServerError, match="broken exited with status 3(.|\n)*boom: no model"):
        with running(spec, free_port(), tmp_path, threads=1, timeout=30):
            pass
    port = free_port()
    with running(stub_spec(tmp_path, "stub", port), port, tmp_path, 1, timeout=30) as server:
        assert rss_mib(server.proc.pid) > 1
    assert server.proc.poll() is not None


def test_the_benchmark_runs_every_workload_and_reports_what_it_could_not_run(tmp_path, monkeypatch):
    def bertlab_stub(model_dir, port, threads, limit=None, dtype="float32", compile=False):
        assert dtype == "float32" and compile is False
        return stub_spec(tmp_path, "bertlab", port, delay=0.002, limit=limit)

    monkeypatch.setattr(serve, "bertlab_spec", bertlab_stub)
    # Quality: the stub's vectors are all (0.5, 0.5, 0.5, 0.5); the reference's rows are the
    # unit axes in turn, so each cosine is 0.5, and the nearest other text is kept for row 4
    # alone (the stub's nearest is always text 0, or 1 for text 0; the reference's is i +- 4).
    monkeypatch.setattr(serve, "QUALITY", 8)
    seen = []

    def reference(model_dir, texts):
        seen.append(texts)
        return np.eye(4, dtype=np.float32)[[i % 4 for i in range(len(texts))]]

    monkeypatch.setattr(serve, "reference_vectors", reference)

    def absent(model_dir, port, threads, dtype):
        raise serve.Unavailable("infinity-emb is not installed here")

    peers = {
        "fastapi-st": lambda d, port, t, dtype: stub_spec(tmp_path, "fastapi-st", port),
        "infinity": absent,
    }
    report = bench_serve(
        ("bertlab", "fastapi-st", "infinity"),
        peers=peers,
        seconds=0.5,
        warmup=0.2,
        concurrency=4,
        requests=1000,
    )
    assert report["unavailable"] == {"infinity": "infinity-emb is not installed here"}
    assert report["failed"] == {}
    for name in ("bertlab", "fastapi-st"):
        for w in ("batch1", "batch256"):
            r = report["systems"][name][w]
            assert r["ok"] > 0 and r["errors"] == 0, (name, w)
        assert report["systems"][name]["batch256"]["answer"] == "256 x 4"
        quality = report["systems"][name]["quality"]
        assert quality == {"cosine_mean": 0.5, "cosine_min": 0.5, "nearest_neighbour_kept": 0.125}
    assert seen == [serve.serve_texts()[-8:]]  # never the sentences int8 is calibrated on
    over = report["systems"]["bertlab"]["overload"]
    # One request at a time: saturated at a few clients; of 4x that, some turned away (how many
    # depends on how fast this process can send, here against a stub that answers in 2 ms).
    assert over["saturating_concurrency"] in (1, 2, 4)
    assert over["clients"] == 4 * over["saturating_concurrency"]
    assert over["phase"]["rejected_429"] > 0 and over["phase"]["ok"] > 0
    assert over["phase"]["errors"] == 0
    assert over["admitted_p99_ms"] > 0 and over["p99_ratio"] > 0
    memory = report["systems"]["bertlab"]["memory"]
    assert memory["phase"]["requests"] == 1000 and memory["phase"]["errors"] == 0
    assert 1 < memory["rss_mib_before"] and 1 < memory["rss_mib_after_first"]
    assert list(memory["phase"]["rss_mib_at"]) == [str(n) for n in range(100, 1001, 100)]
    table = markdown_table(report)
    assert table.count("\n") == 5 and "| bertlab | batch256 | 4 |" in table
    assert table.splitlines()[2].endswith("| 0.5000, 0.5000 | 12% |")
    lines = summary_lines(report)
    assert lines[0].startswith("overload: saturated at") and lines[1].startswith("memory:")
    assert lines[2] == "infinity: not run: " + report["unavailable"]["infinity"]
    plot(report, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").read_bytes()[:4] == b"\x89PNG"


def test_the_command_runs_bertlab_alone_and_says_where_the_other_servers_are(capsys):
    """The peers moved to the benchmarks' harness: asked for by name, or by their option,
    the command says where they are, before any server starts."""
    assert serve.SYSTEMS == ("bertlab",)
    assert main(["bench", "serve", "--systems", "infinity"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "bertlab bench serve: error: unknown system 'infinity'; choose from bertlab (the other "
        "servers: benchmarks/harness/serve_peers.py, in bertlab's repository)\n"
    )
    assert main(["bench", "serve", "--infinity-venv", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "--infinity-venv /nonexistent: bertlab bench serve measures bertlab's own server" in err
    assert "benchmarks/harness/serve_peers.py" in err


@pytest.mark.parametrize(
    "option, message",
    [
        (["--seconds", "0"], "seconds must be above 0 and at most 3600; got 0"),
        (["--systems", "bertlab,tei"], "unknown system 'tei'; choose from bertlab"),
        (["--workloads", "batch2"], "unknown workload 'batch2'; choose from batch1"),
        (["--concurrency", "0"], "concurrency must be from 1 to 1024; got 0"),
        (["--requests", "10"], "requests must be from 1000 to 10,000,000; got 10"),
    ],
)
def test_bad_options_are_refused_by_name_before_any_server_starts(option, message, capsys):
    assert main(["bench", "serve", *option]) == 2
    assert message in capsys.readouterr().err


def test_bertlab_can_be_benchmarked_in_bfloat16_and_int8():
    # Only the command lines are read here: the server's packages need not be installed.
    plain = serve.bertlab_spec("MODEL", 1234, 2)
    assert "--dtype" not in plain.command  # float32: the server's default, nothing added
    bf16 = serve.bertlab_spec("MODEL", 1234, 2, limit=8, dtype="bfloat16")
    i = bf16.command.index("--dtype")
    assert bf16.command[i + 1] == "bfloat16" and "--max-concurrent-requests" in bf16.command
    for dtype in ("bfloat16", "int8"):
        spec = serve.bertlab_spec("MODEL", 1234, 2, dtype=dtype)
        assert spec.command[spec.command.index("--dtype") + 1] == dtype
    assert "--compile" not in plain.command
    assert "--compile" in serve.bertlab_spec("MODEL", 1234, 2, dtype="int8", compile=True).command
    with pytest.raises(
        ValueError, match="dtype must be one of float32, bfloat16, int8; got 'int4'"
    ):
        bench_serve(("bertlab",), dtype="int4")
    with pytest.raises(ValueError, match="compile serves float32 and int8; got dtype bfloat16"):
        bench_serve(("bertlab",), dtype="bfloat16", compile=True)


def test_an_unknown_dtype_is_refused_by_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--dtype", "int4"])
    assert e.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_the_saturation_sweep_goes_past_a_plateau_to_the_peak():
    # requests/s a server without a batching wait gives: little from 1 to 2 clients, much more
    # up to 16, then less (the run of 2026-11-24's figures, rounded)
    rates = {1: 145, 2: 156, 4: 205, 8: 229, 16: 268, 32: 232, 64: 240}
    asked = []

    class FakeBench:
        seconds = 30.0
        progress = staticmethod(lambda line: None)

        def phase(self, server, requests, clients, **kw):
            asked.append(clients)
            latency = {"p50": clients * 3.0, "p95": clients * 4.0, "p99": clients * 5.0}
            return {"requests_per_s": rates[clients], "latency_ms": latency}

    server = type("S", (), {"spec": type("Spec", (), {"name": "bertlab"})})()
    sweep = serve.saturation(FakeBench(), server, [])
    assert asked == [1, 2, 4, 8, 16, 32]  # stopped once below 90% of the best (268)
    assert sweep["saturating_concurrency"] == 16 and sweep["p99_ms"] == 80.0
    assert sweep["first_plateau_concurrency"] == 1  # where the earlier rule stopped
    assert sweep["peak_passed"] is True
    rates.update({32: 300, 64: 330, 128: 340, 256: 345})  # still rising at the last step
    asked.clear()
    sweep = serve.saturation(FakeBench(), server, [])
    assert asked == list(serve.SWEEP) and sweep["peak_passed"] is False
    assert sweep["saturating_concurrency"] == 64  # the smallest within 10% of 345

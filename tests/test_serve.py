"""`bertlab serve`: every route answers what the Python pipelines answer for the same input,
requests from many clients share packed batches without changing a number, and every bad
request is a 4xx that names the field (a fuzzer sends thousands). The limits (429, 401/403,
413), a failing model, a client that leaves, and SIGTERM are each shown on a running server."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="the serve extra (starlette, uvicorn) runs the server")
pytest.importorskip("httpx", reason="Starlette's test client needs httpx (a test extra)")
from helpers import needs_int8  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from tiny_models import texts as odd_texts  # noqa: E402
from tiny_models import tiny as _tiny  # noqa: E402

import bertlab  # noqa: E402
from bertlab.files import resolve_model_dir  # noqa: E402
from bertlab.pipelines import pipeline  # noqa: E402
from bertlab.serve import ServeConfig, Server  # noqa: E402
from bertlab.serve.engine import Row  # noqa: E402

DEFAULT = resolve_model_dir("default")
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = ["Ann lives in Paris.", "A warm, funny film.", "Stocks fell sharply on Monday in Tokyo"]


@pytest.fixture(scope="module")
def folders(module_tmp):
    root = module_tmp.mktemp("serve")
    return {
        "clf": _tiny(
            bertlab.BertForSequenceClassification,
            root / "clf",
            1,
            id2label={0: "negative", 1: "positive", 2: "neutral"},
        ),
        "ranker": _tiny(bertlab.BertForSequenceClassification, root / "ranker", 2, num_labels=1),
        "ner": _tiny(
            bertlab.BertForTokenClassification,
            root / "ner",
            3,
            id2label=dict(enumerate(TAGS)),
        ),
        "qa": _tiny(bertlab.BertForQuestionAnswering, root / "qa", 4),
        "mlm": _tiny(bertlab.BertForMaskedLM, root / "mlm", 5),
    }


@pytest.fixture(scope="module")
def client(folders):
    config = ServeConfig(
        models=[("minilm", DEFAULT), *((k, v) for k, v in folders.items())],
        max_client_batch_size=64,
    )
    server = Server(config)
    with TestClient(server.app(), raise_server_exceptions=False) as c:
        c.server = server
        yield c


def _post(client, route, **body):
    r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    return r


# ============================================================================ same as pipelines
def test_embed_routes_answer_the_embed_pipelines_vectors(client):
    ref = pipeline("embed")(TEXTS)
    tei = torch.tensor(_post(client, "/embed", inputs=TEXTS, model="minilm").json())
    assert (tei - ref).abs().max() < 1e-5
    one = _post(client, "/embed", inputs=TEXTS[0], model="minilm").json()
    assert len(one) == 1 and torch.allclose(torch.tensor(one[0]), ref[0], atol=1e-5)
    raw = _post(client, "/embed", inputs=TEXTS, model="minilm", normalize=False).json()
    unnormalized = pipeline("embed")(TEXTS, normalize=False)
    assert (torch.tensor(raw) - unnormalized).abs().max() < 1e-5
    cls = _post(client, "/embed", inputs=TEXTS, model="minilm", pooling="cls").json()
    assert (torch.tensor(cls) - pipeline("embed")(TEXTS, pooling="cls")).abs().max() < 1e-5
    # Matryoshka-style dimensions: the first D values, normalized again.
    short = torch.tensor(_post(client, "/embed", inputs=TEXTS, model="minilm", dimensions=8).json())
    unit = torch.nn.functional.normalize(unnormalized[:, :8], dim=-1)
    assert short.shape == (3, 8) and (short - unit).abs().max() < 1e-5


def test_the_openai_route_has_openais_shape_and_the_same_vectors(client):
    ref = pipeline("embed")(TEXTS)
    r = _post(client, "/v1/embeddings", input=TEXTS, model="minilm").json()
    assert r["object"] == "list" and r["model"] == "minilm"
    assert [d["index"] for d in r["data"]] == [0, 1, 2]
    got = torch.tensor([d["embedding"] for d in r["data"]])
    assert (got - ref).abs().max() < 1e-5
    tokens = sum(len(x) for x in bertlab.BertTokenizer.from_pretrained(DEFAULT)(TEXTS)["input_ids"])
    assert r["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    b64 = _post(client, "/v1/embeddings", input=TEXTS[1], model="minilm", encoding_format="base64")
    vec = torch.frombuffer(
        bytearray(base64.b64decode(b64.json()["data"][0]["embedding"])), dtype=torch.float32
    )
    assert torch.allclose(vec, ref[1], atol=1e-5)


def test_similarity_and_rerank_order_by_cosine_or_by_the_cross_encoder(client, folders):
    ref = pipeline("embed")(["a cat sat", "a kitten sat", "stock prices fell"])
    sims = _post(
        client,
        "/similarity",
        model="minilm",
        inputs={"source_sentence": "a cat sat", "sentences": ["a kitten sat", "stock prices fell"]},
    ).json()
    assert sims == pytest.approx((ref[1:] @ ref[0]).tolist(), abs=1e-5)
    ranked = _post(
        client,
        "/rerank",
        model="minilm",
        query="a cat sat",
        texts=["stock prices fell", "a kitten sat"],
        return_text=True,
    ).json()
    assert [x["index"] for x in ranked] == [1, 0] and ranked[0]["text"] == "a kitten sat"
    # The cross-encoder: the classifier's single logit for each (query, text) pair.
    model = bertlab.BertForSequenceClassification.from_pretrained(folders["ranker"]).eval()
    tok = bertlab.BertTokenizer.from_pretrained(folders["ranker"])
    texts = ["first passage", "a second, longer passage", "third"]
    with torch.no_grad():
        logits = model(**tok(["the query"] * 3, texts, padding=True, return_tensors="pt")).logits[
            :, 0
        ]
    raw = _post(client, "/rerank", model="ranker", query="the query", texts=texts, raw_scores=True)
    got = {x["index"]: x["score"] for x in raw.json()}
    assert [got[i] for i in range(3)] == pytest.approx(logits.tolist(), abs=1e-5)
    scores = [x["score"] for x in raw.json()]
    assert scores == sorted(scores, reverse=True)
    probs = _post(client, "/rerank", model="ranker", query="the query", texts=texts).json()
    assert {x["index"]: x["score"] for x in probs}[0] == pytest.approx(
        float(logits[0].sigmoid()), abs=1e-5
    )


def test_predict_answers_the_classify_pipelines_labels_for_texts_pairs_and_batches(client, folders):
    pipe = pipeline("classify", str(folders["clf"]))
    single = _post(client, "/predict", model="clf", inputs=TEXTS[0]).json()
    ref = pipe(TEXTS[0], top_k=None)
    assert [x["label"] for x in single] == [x["label"] for x in ref]
    assert [x["score"] for x in single] == pytest.approx([x["score"] for x in ref], abs=1e-5)
    pair = _post(client, "/predict", model="clf", inputs=["a premise", "a hypothesis"]).json()
    ref_pair = pipe("a premise", "a hypothesis", top_k=None)
    assert [x["score"] for x in pair] == pytest.approx([x["score"] for x in ref_pair], abs=1e-5)
    batch = _post(client, "/predict", model="clf", inputs=[[t] for t in TEXTS]).json()
    for got, want in zip(batch, pipe(TEXTS, top_k=None), strict=True):
        assert [x["score"] for x in got] == pytest.approx([x["score"] for x in want], abs=1e-5)
    raw = _post(client, "/predict", model="clf", inputs=TEXTS[0], raw_scores=True).json()
    assert sum(x["score"] for x in raw) != pytest.approx(1.0, abs=1e-3)  # logits, not probabilities


def test_ner_answers_the_tag_pipelines_entities_and_words(client, folders):
    pipe = pipeline("tag", str(folders["ner"]))
    got = _post(client, "/ner", model="ner", inputs=TEXTS).json()
    want = pipe(TEXTS)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert [(e["entity"], e["start"], e["end"], e["text"]) for e in g] == [
            (e["entity"], e["start"], e["end"], e["text"]) for e in w
        ]
        assert [e["score"] for e in g] == pytest.approx([e["score"] for e in w], abs=1e-5)
    words = _post(client, "/ner", model="ner", inputs="Ann lives in Paris.", aggregation="words")
    assert [w["word"] for w in words.json()] == ["Ann", "lives", "in", "Paris", "."]


def test_qa_answers_the_answer_pipelines_spans_over_doc_stride_windows(client, folders):
    pipe = pipeline("answer", str(folders["qa"]))
    context = " ".join(f"Sentence {i} says that the river number {i} is long." for i in range(12))
    settings = dict(top_k=3, max_length=64, doc_stride=16, max_query_length=16)
    r = _post(
        client, "/qa", model="qa", question="Which river is long?", context=context, **settings
    )
    want = pipe("Which river is long?", context, **settings)
    assert int(r.headers["x-windows"].split(":")[1]) > 1  # the context took several windows
    assert [(a["answer"], a["start"], a["end"]) for a in r.json()] == [
        (a["answer"], a["start"], a["end"]) for a in want
    ]
    assert [a["score"] for a in r.json()] == pytest.approx([a["score"] for a in want], abs=1e-5)
    for a in r.json():
        assert context[a["start"] : a["end"]] == a["answer"]


def test_fill_mask_answers_the_fill_mask_pipelines_candidates(client, folders):
    pipe = pipeline("fill-mask", str(folders["mlm"]))
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK]."]
    got = _post(client, "/fill-mask", model="mlm", inputs=texts, top_k=4).json()
    want = pipe(texts, top_k=4)
    flat = lambda rows: [c for row in rows for c in (row if isinstance(row, list) else [row])]  # noqa: E731
    for g, w in zip(got, want, strict=True):
        gs, ws = flat(g), flat(w)
        assert [c["token"] for c in gs] == [c["token"] for c in ws]
        assert [c["sequence"] for c in gs] == [c["sequence"] for c in ws]
        assert [c["score"] for c in gs] == pytest.approx([c["score"] for c in ws], abs=1e-5)
    targets = _post(client, "/fill-mask", model="mlm", inputs=texts[0], targets=["capital", "city"])
    assert {c["token_str"] for c in targets.json()} == {"capital", "city"}


def test_tokenize_and_decode_round_trip(client):
    toks = _post(client, "/tokenize", model="minilm", inputs="Hello, world!").json()
    assert toks[0]["text"] == "[CLS]" and toks[0]["special"] and toks[-1]["text"] == "[SEP]"
    assert [(t["start"], t["stop"]) for t in toks[1:3]] == [(0, 5), (5, 6)]
    ids = [t["id"] for t in toks]
    assert _post(client, "/decode", model="minilm", ids=ids).json() == "hello, world!"
    both = _post(client, "/decode", model="minilm", ids=[ids, ids[:2]], skip_special_tokens=False)
    assert both.json() == ["[CLS] hello, world! [SEP]", "[CLS] hello"]


# ============================================================================ long inputs
def test_long_texts_are_refused_cut_or_split_and_the_response_says_which(client, folders):
    long = " ".join(["river"] * 150)  # 152 tokens, past the tiny models' 64 positions
    r = client.post("/embed", json={"model": "mlm", "inputs": long})
    assert r.status_code == 413 and r.json()["field"] == "inputs"
    assert "152 tokens" in r.json()["error"] and "at most 64" in r.json()["error"]
    cut = _post(client, "/embed", model="mlm", inputs=[long, "short"], truncate=True)
    assert cut.headers["x-truncated"] == "0" and "x-windows" not in cut.headers
    split = _post(client, "/embed", model="mlm", inputs=[long, "short"], windows=True)
    assert split.headers["x-windows"] == "0:3"  # 150 pieces in windows of 62
    openai = _post(client, "/v1/embeddings", model="mlm", input=[long], windows=True).json()
    assert openai["data"][0]["windows"] == 3
    # The windows' mean vectors weighted by their tokens: here windows of 62, 62 and 26 pieces.
    parts = pipeline("embed", str(folders["mlm"]))(
        [" ".join(["river"] * n) for n in (62, 62, 26)], normalize=False
    )
    w = torch.tensor([64.0, 64.0, 28.0])
    pooled = torch.nn.functional.normalize((parts * w[:, None]).sum(0) / w.sum(), dim=0)
    assert (torch.tensor(split.json()[0]) - pooled).abs().max() < 1e-5
    # Tagging: overlapping windows cover every word once, with its span in the whole text.
    words = _post(client, "/ner", model="ner", inputs=long, windows=True, aggregation="words")
    spans = [(w["start"], w["end"]) for w in words.json()]
    assert len(spans) == 150 and spans[-1] == (len(long) - 5, len(long))
    label = _post(client, "/predict", model="clf", inputs=long, windows=True).json()
    assert sum(x["score"] for x in label) == pytest.approx(1.0, abs=1e-5)


# ============================================================================ batching
def test_concurrent_requests_share_batches_and_get_their_own_answers(client):
    texts = [f"sentence number {i} with {'extra ' * (i % 7)}words" for i in range(48)]
    ref = pipeline("embed")(texts)
    before = client.server.metrics.batch_sequences.counts.copy()

    def one(i):
        return torch.tensor(_post(client, "/embed", model="minilm", inputs=texts[i]).json()[0])

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = torch.stack(list(pool.map(one, range(48))))
    assert (got - ref).abs().max() < 1e-5
    counts = client.server.metrics.batch_sequences.counts[(("model", "minilm"),)]
    old = before.get((("model", "minilm"),), [0] * len(counts))
    batches = [a - b for a, b in zip(counts, old, strict=True)]
    assert sum(batches) < 48  # fewer batches than requests: some held several sequences


def test_a_lone_request_runs_at_once_and_requests_wait_only_while_the_model_is_busy(folders):
    # max_wait of 10 s: a request that waited for company would take 10 s; with the model free
    # it runs at once. While the model is busy, the rows that arrive meanwhile form one batch.
    from bertlab.serve.engine import Batcher, Job, Limits, Row, ServedModel

    gate = threading.Event()
    batches = []

    class Slow(ServedModel):
        def forward(self, rows, parts=None):
            batches.append(len(rows))
            gate.wait(30)  # the first batch holds the model until the others have queued
            return super().forward(rows, parts)

    batcher = Batcher(lambda: Slow("m", folders["mlm"]), Limits(max_wait=10.0))
    loop = asyncio.new_event_loop()
    try:
        row = Row([101, 2057, 102], [0, 0, 0], "mean")
        jobs = [Job([row], loop) for _ in range(4)]
        batcher.submit(jobs[0])
        deadline = time.perf_counter() + 5
        while not batches and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert batches == [1]  # taken at once, not after max_wait
        for job in jobs[1:]:
            batcher.submit(job)
        time.sleep(0.2)
        gate.set()
        loop.run_until_complete(asyncio.wait([j.future for j in jobs], timeout=30))
        assert all(j.future.done() and not j.future.exception() for j in jobs)
        assert batches == [1, 3]  # the three that came while it ran: one batch
    finally:
        gate.set()
        batcher.close()
        loop.close()


def test_a_request_larger_than_the_token_budget_runs_over_several_batches(folders):
    server = Server(ServeConfig(models=[("mlm", folders["mlm"])], max_batch_tokens=64))
    texts = [" ".join(["word"] * 40) + f" {i}" for i in range(5)]  # 43 tokens each
    with TestClient(server.app()) as c:
        got = torch.tensor(_post(c, "/embed", inputs=texts).json())
    ref = pipeline("embed", str(folders["mlm"]))(texts)
    assert (got - ref).abs().max() < 1e-5
    sizes = server.metrics.batch_tokens.sums[(("model", "mlm"),)]
    assert sizes == 5 * 43  # every token computed once
    assert sum(server.metrics.batch_tokens.counts[(("model", "mlm"),)]) == 5  # one text a batch


def test_the_metrics_page_counts_requests_batches_and_tokens(client):
    _post(client, "/embed", model="minilm", inputs="count me")
    page = client.get("/metrics").text
    assert 'bertlab_requests_total{route="embed",status="200"}' in page
    assert 'bertlab_batch_tokens_bucket{model="minilm",le="+Inf"}' in page
    assert 'bertlab_queue_depth{model="minilm"} 0' in page
    assert "\nbertlab_requests_in_flight 0\n" in page  # answered: none left in flight
    assert "# TYPE bertlab_request_seconds histogram" in page
    # the serving guide names every metric the page has, and no other
    guide = (Path(__file__).parents[1] / "docs/guides/serving.md").read_text()
    named = set(re.findall(r"`(bertlab_[a-z_]+)`", guide))
    assert named == set(re.findall(r"^# TYPE (bertlab_[a-z_]+) ", page, re.M))


def test_responses_carry_their_timings(client):
    r = _post(client, "/embed", model="minilm", inputs="timed")
    for h in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"):
        assert float(r.headers[h]) >= 0
    assert float(r.headers["x-total-time"]) >= float(r.headers["x-inference-time"])
    assert r.headers["x-compute-tokens"] == "3"


def test_info_lists_models_heads_labels_and_limits(client):
    info = client.get("/info").json()
    by = {m["name"]: m for m in info["models"]}
    assert by["clf"]["labels"] == ["negative", "positive", "neutral"]
    assert by["clf"]["routes"] == ["/predict"] and by["ranker"]["routes"] == ["/predict", "/rerank"]
    assert by["ner"]["head"] == "token-classification" and by["minilm"]["max_input_length"] == 512
    assert info["limits"]["max_client_batch_size"] == 64
    assert client.get("/health").json()["status"] == "ok"


# ============================================================================ bad requests
@pytest.mark.parametrize(
    "route, body, status, field",
    [
        ("/embed", {"inputs": "x", "model": "nope"}, 404, "model"),
        ("/ner", {"inputs": "x", "model": "minilm"}, 422, "model"),
        ("/embed", {"inputs": "x"}, 422, "model"),  # several models embed: name one
        ("/embed", {"model": "minilm"}, 422, "inputs"),
        ("/embed", {"model": "minilm", "inputs": []}, 422, "inputs"),
        ("/embed", {"model": "minilm", "inputs": ["ok", ""]}, 422, "inputs[1]"),
        ("/embed", {"model": "minilm", "inputs": "a\ud800b"}, 422, "inputs"),
        ("/embed", {"model": "minilm", "inputs": ["ok", "a\udfffb"]}, 422, "inputs[1]"),
        ("/embed", {"model": "minilm", "inputs": 5}, 422, "inputs"),
        ("/embed", {"model": "minilm", "inputs": ["x"] * 65}, 413, "inputs"),
        ("/embed", {"model": "minilm", "inputs": "x", "normalize": 1}, 422, "normalize"),
        ("/embed", {"model": "minilm", "inputs": "x", "dimensions": 0}, 422, "dimensions"),
        ("/embed", {"model": "minilm", "inputs": "x", "dimensions": True}, 422, "dimensions"),
        (
            "/embed",
            {"model": "minilm", "inputs": "x", "truncate": True, "windows": True},
            422,
            "windows",
        ),
        (
            "/embed",
            {"model": "minilm", "inputs": "x", "truncation_direction": "up"},
            422,
            "truncation_direction",
        ),
        ("/v1/embeddings", {"model": "minilm", "input": [[1, 2]]}, 422, "input"),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": "x", "encoding_format": "int8"},
            422,
            "encoding_format",
        ),
        ("/fill-mask", {"model": "mlm", "inputs": "no mask here"}, 422, "inputs"),
        ("/fill-mask", {"model": "mlm", "inputs": "[MASK]", "top_k": 10**12}, 422, "top_k"),
        ("/qa", {"model": "qa", "question": "q?"}, 422, "context"),
        (
            "/qa",
            {"model": "qa", "question": "q?", "context": "c", "doc_stride": 10**9},
            422,
            "doc_stride",
        ),
        ("/predict", {"model": "clf", "inputs": [["a"], ["b", "c"]]}, 422, "inputs"),
        ("/decode", {"model": "minilm", "ids": [1, 30522]}, 422, "ids[1]"),
        ("/decode", {"model": "minilm", "ids": "101"}, 422, "ids"),
        ("/similarity", {"model": "minilm", "inputs": ["a"]}, 422, "inputs"),
    ],
)
def test_each_bad_request_is_a_4xx_naming_its_field(client, route, body, status, field):
    r = client.post(route, content=json.dumps(body).encode())  # an unpaired surrogate as \ud800
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and r.json()["error"]


def test_broken_bodies_methods_and_routes_are_4xx_with_json_errors(client):
    for raw, why in [
        (b"{not json", "not JSON"),
        (b'{"inputs": "\xff\xfe"}', "not UTF-8"),
        (b"", "empty"),
        (b'{"inputs": NaN}', "not usable JSON"),
        (b"[" * 100000, "not usable JSON"),
        (b'{"model": "minilm", "inputs": "x", "dimensions": 1' + b"0" * 5000 + b"}", "JSON"),
    ]:
        r = client.post("/embed", content=raw)
        assert r.status_code == 400 and why in r.json()["error"], (raw[:20], r.text)
    assert client.post("/embed", json=["a list"]).status_code == 422
    assert client.get("/embed").status_code == 405 and client.get("/embed").json()["error"]
    assert client.post("/no-such-route", json={}).status_code == 404


def test_a_fuzzer_never_gets_a_5xx_and_the_server_still_answers_right(client):
    hypothesis = pytest.importorskip("hypothesis", reason="a test extra: the request fuzzer")
    st = hypothesis.strategies
    routes = ["/embed", "/v1/embeddings", "/similarity", "/rerank", "/predict", "/ner", "/qa"]
    routes += ["/fill-mask", "/tokenize", "/decode"]
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=30),
        odd_texts(st),  # unpaired surrogates, NUL, control characters, emoji, ...
        st.sampled_from(["minilm", "clf", "ner", "qa", "mlm", "[MASK]"]),
    )
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )
    keys = st.sampled_from(
        [
            "inputs",
            "input",
            "model",
            "normalize",
            "truncate",
            "windows",
            "dimensions",
            "top_k",
            "query",
            "texts",
            "question",
            "context",
            "ids",
            "raw_scores",
            "pooling",
            "targets",
            "encoding_format",
            "doc_stride",
            "max_length",
            "aggregation",
            "truncation_direction",
        ]
    )
    bodies = st.one_of(st.dictionaries(keys, values, max_size=6), values, st.binary(max_size=40))
    seen: dict[int, int] = {}

    @hypothesis.settings(
        max_examples=2000,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(st.sampled_from(routes), bodies)
    def send(route, body):
        if isinstance(body, bytes):
            r = client.post(route, content=body)
        else:
            r = client.post(route, content=json.dumps(body, allow_nan=False).encode())
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (route, body, r.text)
        if r.status_code >= 400:
            assert r.json()["error"]

    send()
    assert sum(seen.values()) >= 2000 and sum(v for k, v in seen.items() if k >= 400) > 1000
    after = torch.tensor(_post(client, "/embed", model="minilm", inputs=TEXTS).json())
    assert (after - pipeline("embed")(TEXTS)).abs().max() < 1e-5


# ============================================================================ limits, failures
def _slow(
    server: Server,
    name: str,
    seconds: float,
    fail_on: str | None = None,
    hold: threading.Event | None = None,
) -> list[int]:
    """Make ``name``'s forward sleep (and raise on rows holding ``fail_on``'s ids; hold the
    first batch until ``hold`` is set); returns a list that collects the number of rows of
    every batch run."""
    model, seen = server.models[name], []
    forward = model.forward
    bad = model.tokenizer(fail_on, add_special_tokens=False)["input_ids"] if fail_on else None

    def slow(rows: list[Row], arrays=None):
        seen.append(len(rows))
        if hold is not None and len(seen) == 1:
            assert hold.wait(30), "the test never let the first batch go"
        time.sleep(seconds)
        if bad and any(r.input_ids[1 : 1 + len(bad)] == bad for r in rows):
            raise RuntimeError("a planted fault")
        return forward(rows, arrays)

    model.forward = slow
    return seen


def test_past_max_concurrent_requests_the_excess_gets_429(folders):
    server = Server(ServeConfig(models=[("mlm", folders["mlm"])], max_concurrent_requests=2))
    _slow(server, "mlm", 0.5)
    with TestClient(server.app()) as c:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda i: c.post("/embed", json={"inputs": f"t {i}"}), range(6)))
    statuses = sorted(r.status_code for r in codes)
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1 and set(statuses) <= {200, 429}
    refused = next(r for r in codes if r.status_code == 429)
    assert "limit of 2 concurrent requests" in refused.json()["error"]
    assert refused.headers["retry-after"] == "1"  # seconds, as RFC 9110 has it


def test_the_api_key_is_required_and_checked(folders):
    server = Server(ServeConfig(models=[("mlm", folders["mlm"])], api_key="s3cret"))
    with TestClient(server.app()) as c:
        assert c.post("/embed", json={"inputs": "x"}).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert c.post("/embed", json={"inputs": "x"}, headers=wrong).status_code == 403
        assert c.get("/info", headers=wrong).status_code == 403
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):  # a scheme is case-insensitive
            ok = {"Authorization": f"{scheme} s3cret"}
            assert c.post("/embed", json={"inputs": "x"}, headers=ok).status_code == 200
        assert c.get("/health").status_code == 200  # open: a load balancer's probe
        for given in ("s3cret", "Basic s3cret", "Bearer", "Bearer "):  # no Bearer scheme
            r = c.post("/embed", json={"inputs": "x"}, headers={"Authorization": given})
            assert r.status_code == 401 and "Authorization: Bearer <key>" in r.json()["error"]
            assert "s3cret" not in r.text  # the key is never echoed
        assert c.get("/metrics", headers={"Authorization": "s3cret"}).status_code == 401


def test_the_payload_limit_is_a_413(folders):
    server = Server(ServeConfig(models=[("mlm", folders["mlm"])], payload_limit=100))
    with TestClient(server.app()) as c:
        r = c.post("/embed", json={"inputs": "x" * 200})
        assert r.status_code == 413 and "limit is 100" in r.json()["error"]


def test_a_failing_batch_fails_its_requests_alone_and_the_server_goes_on(folders):
    server = Server(ServeConfig(models=[("mlm", folders["mlm"])], max_wait_ms=0))
    _slow(server, "mlm", 0.0, fail_on="poison")
    with TestClient(server.app()) as c:
        bad = c.post("/embed", json={"inputs": "poison pill"})
        assert bad.status_code == 500 and "the model failed" in bad.json()["error"]
        assert bad.json()["error_type"] == "backend"
        good = c.post("/embed", json={"inputs": "a fine text"})
        assert good.status_code == 200 and len(good.json()[0]) == 64


def test_settings_are_checked_before_anything_loads(folders):
    with pytest.raises(ValueError, match="max_batch_tokens must be an integer >= 1, got 0"):
        ServeConfig(models=[("a", folders["mlm"])], max_batch_tokens=0)
    with pytest.raises(ValueError, match="two models are named a"):
        ServeConfig(models=[("a", folders["mlm"]), ("a", folders["ner"])])
    with pytest.raises(ValueError, match="below the model's length 64"):
        Server(ServeConfig(models=[("a", folders["mlm"])], max_batch_tokens=32))


# ============================================================================ a real server
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bertlab.cli.main",
            "serve",
            *args,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read().decode())
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the server did not come up")


def test_sigterm_finishes_admitted_requests_then_exits(folders):
    import httpx

    port = _port()
    # batches of one sequence: requests of 32 texts (the most a request may hold) are computed
    # one window after another. Eight of them are sent at once, each text split into five
    # windows (1,280 rows in all), so that the work outlasts the polls by a wide margin whatever
    # the machine: on a busy one the polls of /metrics are slow, and 256 rows were once answered
    # within four of them. The signal comes once /metrics shows all eight requests admitted (a
    # request whose connection the server has not yet read when the signal comes is refused, as
    # it should be) and at least HELD rows still waiting: that many batches are still to run
    proc = _start([f"mlm={folders['mlm']}", "--max-batch-sequences", "1"], port)
    try:
        results = {}
        requests, held = 8, 64

        def ask(k):
            texts = [f"in flight {k} {i} " + "word " * 300 for i in range(32)]
            try:
                results[k] = httpx.post(
                    f"http://127.0.0.1:{port}/embed",
                    json={"inputs": texts, "windows": True},
                    timeout=120,
                )
            except httpx.HTTPError as e:  # kept, so that the assertion below names it
                results[k] = e

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(requests)]
        for t in threads:
            t.start()
        waiting = re.compile(r'^bertlab_queue_depth\{model="mlm"\} (\d+)', re.M)
        admitted = re.compile(r"^bertlab_requests_in_flight (\d+)", re.M)
        seen = []
        for _ in range(3000):
            page = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            seen.append(
                tuple(
                    int(m.group(1)) if m else None
                    for m in (admitted.search(page), waiting.search(page))
                )
            )
            if seen[-1][0] == requests and (seen[-1][1] or 0) >= held:
                break
            time.sleep(0.001)
        else:
            pytest.fail(
                f"the requests were never all admitted with {held} rows waiting; {len(seen)} "
                f"polls saw (in flight, waiting) {seen[:20]}, ..., {seen[-3:]}"
            )
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert sorted(results) == list(range(requests))
        for k, r in results.items():
            assert isinstance(r, httpx.Response), f"request {k}: {r!r}"
            assert r.status_code == 200, r.text
            assert len(r.json()) == 32 and len(r.json()[0]) == 64
            assert r.headers["x-windows"].startswith("0:5,")  # text 0 in five windows
        # uvicorn re-raises the signal once it has shut down: the conventional exit status.
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        proc.kill()


def test_a_client_that_leaves_is_dropped_before_its_rows_are_computed(folders):
    server = Server(
        ServeConfig(models=[("mlm", folders["mlm"])], max_wait_ms=0, max_batch_sequences=1)
    )
    # the first request holds the model until the test lets it go (not for a set time: on a
    # busy machine the departed request could otherwise reach the model before it leaves)
    release = threading.Event()
    seen = _slow(server, "mlm", 0.0, hold=release)
    import uvicorn

    port = _port()
    config = uvicorn.Config(server.app(), port=port, log_level="warning", lifespan="on")
    userver = uvicorn.Server(config)
    thread = threading.Thread(target=userver.run, daemon=True)
    thread.start()
    try:
        import httpx

        for _ in range(100):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        first = threading.Thread(
            target=lambda: httpx.post(
                f"http://127.0.0.1:{port}/embed", json={"inputs": "first"}, timeout=30
            )
        )
        first.start()
        for _ in range(600):  # until the first occupies the model
            if seen:
                break
            time.sleep(0.05)
        assert seen == [1]
        body = json.dumps({"inputs": "gone before its turn"}).encode()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(0.2)
        s.close()  # the client leaves while its request waits
        time.sleep(0.3)
        release.set()
        first.join(30)
        r = httpx.post(f"http://127.0.0.1:{port}/embed", json={"inputs": "after"}, timeout=30)
        assert r.status_code == 200
        assert seen == [1, 1]  # the first and the last: the departed one never ran
    finally:
        release.set()
        userver.should_exit = True
        thread.join(10)


def test_the_readme_serve_examples_run_as_written():
    """The shell block of "Serve it", run as written (on a free port): each curl answers what
    its line says."""
    import shutil

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README's examples call it")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Serve it", 1)[1].split("\n## ", 1)[0]
    lines = section.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    start, calls = lines[0], lines[1:]
    assert start == "bertlab serve default --port 8080 &"
    port = _port()
    proc = _start(["default"], port)
    try:
        outs = []
        for line in calls:
            cmd = line.split("#", 1)[0].replace("localhost:8080", f"localhost:{port}")
            done = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
            outs.append(json.loads(done.stdout))
    finally:
        proc.terminate()
        proc.wait(30)
    embed, openai, ranked, empty = outs
    assert len(embed) == 2 and len(embed[0]) == 384
    assert len(openai["data"][0]["embedding"]) == 8 and openai["usage"]["prompt_tokens"] == 5
    assert [r["text"] for r in ranked] == ["a kitten slept", "stocks fell"]
    assert empty == {"error": "inputs is empty", "error_type": "validation", "field": "inputs"}


def test_the_command_refuses_bad_settings_by_name(folders, capsys, tmp_path):
    from bertlab.cli.main import main

    mc = _tiny(bertlab.BertForMultipleChoice, tmp_path / "mc", 6)
    # a folder that says it is a masked LM but holds no masked-LM head: it cannot fill masks
    headless = _tiny(bertlab.BertModel, tmp_path / "headless", 7)
    config = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForMaskedLM"]})
    )
    cases = [
        (["serve", str(folders["mlm"]), "--port", "70000"], "--port 70000 is outside 0..65535"),
        (["serve", str(folders["mlm"]), "--max-batch-tokens", "0"], "max_batch_tokens must be"),
        (["serve", str(tmp_path / "missing")], "missing"),
        (["serve", f"a={folders['mlm']}", f"a={folders['ner']}"], "two models are named a"),
        (["serve", str(mc)], "multiple-choice head, which bertlab serve does not serve"),
        (["serve", f"headless={headless}"], "model 'headless' cannot be served: the model in"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)  # no traceback
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", str(folders["mlm"]), "--port", port]) == 2
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_every_served_batch_has_padding_so_its_row_count_is_rounded():
    from bertlab.nn.packing import Packing, round_rows
    from bertlab.serve.engine import Row, pad_rows

    rows = [Row([101, 7, 102], [0, 0, 0], "mean")]
    arrays = pad_rows(rows, 0, 512)
    assert arrays["input_ids"].shape == (1, 4) and arrays["attention_mask"][0].tolist() == [
        1
    ] * 3 + [0]
    mask = torch.from_numpy(arrays["attention_mask"])
    packing = Packing.from_mask(mask, 1, 4, torch.device("cpu"), round_rows)
    assert packing.rows == round_rows(3) == 8  # not 3: a shape the server has met before
    full = [Row([1] * 512, [0] * 512, "mean")]
    assert pad_rows(full, 0, 512)["input_ids"].shape == (1, 512)  # no room past the positions
    assert pad_rows(rows, 0)["input_ids"].shape == (1, 3)  # without a width: as long as the rows


def test_vectors_are_written_as_their_exact_float32_values_with_orjson_or_without(monkeypatch):
    import numpy as np

    from bertlab.serve import app as app_module

    vectors = (np.random.default_rng(0).standard_normal((4, 16)) / 3).astype(np.float32)
    body = {"data": [{"embedding": vectors[0]}], "all": vectors, "n": 3}
    fast = app_module.JSON(body).body
    assert app_module.orjson is not None  # the serve extra's writer, as a server runs it
    monkeypatch.setattr(app_module, "orjson", None)
    plain = app_module.JSON(body).body
    for written in (fast, plain):
        read = json.loads(written)
        assert np.array_equal(np.asarray(read["all"], dtype=np.float32), vectors)
        assert np.array_equal(
            np.asarray(read["data"][0]["embedding"], dtype=np.float32), vectors[0]
        )
        assert read["n"] == 3
    assert len(fast) < 0.7 * len(plain)  # float32's shortest forms, not float64's
    with pytest.raises(TypeError, match="object is not JSON"):
        app_module.JSON({"x": object()})


def test_the_serving_process_keeps_freed_blocks_and_freezes_what_it_loaded(folders, monkeypatch):
    # bertlab.serve.run makes the process a server's before it listens: glibc told to keep
    # freed large blocks before the models load, and everything alive once they have loaded
    # moved out of the garbage collector's sight (bertlab/heap.py has the measurements).
    import gc

    import uvicorn

    import bertlab.heap
    import bertlab.serve

    seen: list = []
    made: list = []
    monkeypatch.setattr(bertlab.heap, "keep_freed_memory", lambda: seen.append("keep"))
    real = bertlab.serve.Server

    def server(config):
        seen.append("load")
        made.append(real(config))
        return made[-1]

    def listen(app, **kw):
        seen.append(("listen", gc.get_freeze_count() > 0, kw["port"]))

    monkeypatch.setattr(bertlab.serve, "Server", server)
    monkeypatch.setattr(uvicorn, "run", listen)
    try:
        bertlab.serve.run(ServeConfig(models=[("mlm", folders["mlm"])]), port=8123)
    finally:
        gc.unfreeze()
        for s in made:
            s.close()
    assert seen == ["keep", "load", ("listen", True, 8123)]


@pytest.mark.parametrize("dtype", ["float32", pytest.param("int8", marks=needs_int8)])
def test_the_request_profile_times_every_part_of_the_batch(dtype):
    """benchmarks/harness/profile_serve_batch.py splits a request's batch into its parts by
    timers around the encoder's calls: each part it names must be caught (a renamed function
    would leave a part at zero and the rest growing), and the parts must fit inside the batch's
    time. Then it times each product shape alone, and the batch's products at those rates;
    given another server's throughput, the budget of a batch served three times as fast."""
    script = (
        Path(__file__).resolve().parents[1] / "benchmarks" / "harness" / "profile_serve_batch.py"
    )
    cmd = [sys.executable, str(script), "--sentences", "8", "--repeat", "2", "--dtype", dtype]
    cmd += ["--plain", "2500"]  # tokens/s: 8 sentences take about 2 ms on 2 cores
    cmd += ["--calibration", "16"]  # (int8's calibration on 128 took most of the run)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    whole = float(next(x for x in lines if x.startswith("with every part timed")).split()[4])
    values = {}  # "name   value unit" lines, by name
    for line in lines:
        name, _, rest = line.strip().partition("  ")
        if rest.strip():
            values[name] = float(rest.split()[0])
    named = ("attention", "product", "LayerNorm", "embeddings")
    parts = {k: v for k, v in values.items() if k.startswith(named)}
    # (where the layer norm runs inside the product, sgemm-avx2's and u8-avx2's, it is named;
    # where the embeddings are bertlab's kernel, their layer norm is inside it: no module's)
    names = {k.removesuffix(" + LayerNorm") for k in parts}
    assert names >= {
        "attention (packed)",
        "product 384 -> 1152",
        "product 384 -> 384 + residual",
        "product 384 -> 1536 + gelu",
        "product 1536 -> 384 + residual",
    }, out
    assert "LayerNorm" in names or "embeddings" in names, out
    assert all(ms > 0 for ms in parts.values()), out
    assert sum(parts.values()) <= whole, out
    assert "tokenize (ServedModel.encode)" in out and "8 bundled SST-2 dev sentences" in out
    alone = {k: v for k, v in values.items() if k.startswith("one call")}
    assert set(alone) == {f"one call {s}" for s in ("384 -> 1152", "384 -> 384", "384 -> 1536",
                                                    "1536 -> 384")}, out  # fmt: skip
    assert all(rate > 0 for rate in alone.values()), out
    # the batch's products at those rates: 21.2 MOP a token (6 layers, 384 wide, 1536 inside)
    tokens = int(re.search(r"sentences, ([\d,]+) tokens", out).group(1).replace(",", ""))
    ms, rate = re.search(
        r"products \(21\.2 MOP a token\) at those rates: ([\d.]+) ms, ([\d,]+) to", out
    ).groups()
    slowest = min(alone.values())  # GOP/s
    assert 0 < float(ms) <= 1000 * tokens * 21.2e6 / (slowest * 1e9) * 1.01 + 0.05, out
    assert int(rate.replace(",", "")) == pytest.approx(tokens / float(ms) * 1000, rel=0.03), out
    # the budget: the CPU time of the batch at 3 x 2,500 tokens/s on 2 threads, less the
    # products at the plain calls' rates and the request's own work
    assert "3x the plain server's 2,500 tokens/s: 7,500 tokens/s" in out, out
    cpu = values["CPU time of the batch at that speed"]
    assert cpu == pytest.approx(2 * 1000 * tokens / 7500, abs=0.06), out
    own = values["tokenize (ServedModel.encode)"] + values["write the JSON answer (orjson)"]
    products = values["the products at the plain calls' rates"]
    assert products == pytest.approx(2 * float(ms), abs=0.2), out
    assert values["the request's own work (above)"] == pytest.approx(own, abs=0.1), out
    assert values["left for everything else"] == pytest.approx(cpu - products - own, abs=0.2), out
    rest = 2 * (whole - sum(v for k, v in parts.items() if k.startswith("product")))
    assert values["everything else in the batch now"] == pytest.approx(rest, abs=0.2), out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_packed_batch_runs_in_window_order_and_answers_in_the_requests_order(folders, dtype):
    """The packed batch puts short rows side by side in the attention's shared windows
    (``window_order``); each row's answer is the one it gets in the request's own order, to the
    bit on the Xeon's own kernels and within float32 rounding on AVX2 ones (4e-7 at
    most, measured under the AVX2 limits). int8 keeps the request's order (its
    products round a row by its place in the batch on AMX)."""
    from bertlab.nn.packing import window_order
    from bertlab.serve.engine import WINDOW_ORDERED, ServedModel, pad_rows

    assert dtype in WINDOW_ORDERED and "int8" not in WINDOW_ORDERED
    model = ServedModel("m", folders["mlm"], dtype)
    lengths = [20, 20, 12, 12, 5, 40, 9, 6]
    rows = [Row([101] + [1000 + i + j for j in range(n - 2)] + [102], [0] * n, "mean")
            for i, n in enumerate(lengths)]  # fmt: skip
    ((order, arrays),) = model.prepare(rows)
    assert order == window_order(lengths) != list(range(len(rows)))
    assert arrays["attention_mask"].sum(1).tolist() == [lengths[i] for i in order]
    as_given = [(list(range(len(rows))), pad_rows(rows, 0, model.max_length))]
    for got, want in zip(model.forward(rows), model.forward(rows, as_given), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

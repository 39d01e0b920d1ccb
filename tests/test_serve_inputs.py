"""`bertlab serve` and the texts and limits a production user meets: generated texts (unpaired
surrogates among NUL, control characters, combining marks, right-to-left text and emoji) on
every route are refused by field and position or answered, never a 5xx; every count limit is
the field the request sends; a client that leaves while its body is read is a 499 on one log
line; a pre-training folder fills masks as the fill-mask pipeline does."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("starlette", reason="the serve extra (starlette, uvicorn) runs the server")
pytest.importorskip("httpx", reason="Starlette's test client needs httpx (a test extra)")
hypothesis = pytest.importorskip("hypothesis", reason="a test extra: the text fuzzer")
from starlette.testclient import TestClient  # noqa: E402
from tiny_models import texts as odd_texts  # noqa: E402
from tiny_models import tiny  # noqa: E402

import bertlab  # noqa: E402
from bertlab.pipelines import pipeline  # noqa: E402
from bertlab.pipelines.text import invalid_code_point  # noqa: E402
from bertlab.serve import ServeConfig, Server  # noqa: E402

st = hypothesis.strategies
MOST = 4  # --max-client-batch-size of the server here


@pytest.fixture(scope="module")
def folders(module_tmp):
    root = module_tmp.mktemp("serve-inputs")
    tags = dict(enumerate(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]))
    return {
        "mlm": tiny(bertlab.BertForMaskedLM, root / "mlm", 1),
        "clf": tiny(bertlab.BertForSequenceClassification, root / "clf", 2, num_labels=3),
        "ranker": tiny(bertlab.BertForSequenceClassification, root / "ranker", 3, num_labels=1),
        "ner": tiny(bertlab.BertForTokenClassification, root / "ner", 4, id2label=tags),
        "qa": tiny(bertlab.BertForQuestionAnswering, root / "qa", 5),
    }


@pytest.fixture(scope="module")
def client(folders):
    server = Server(ServeConfig(models=list(folders.items()), max_client_batch_size=MOST))
    with TestClient(server.app(), raise_server_exceptions=False) as c:
        yield c


def _send(client, route, body):
    """``body`` as JSON with every non-ASCII character escaped, as most clients write it: an
    unpaired surrogate travels as ``\\ud800`` (a UTF-8 body cannot hold one)."""
    return client.post(route, content=json.dumps(body).encode())


# ============================================================================ generated texts
def _request(route: str, t: list[str], variant: int) -> tuple[dict, dict[str, str]]:
    """A well-formed body for ``route`` around the texts ``t``, and the fields that hold them
    as the request names them."""
    one = variant % 2 == 0
    if route in ("/embed", "/tokenize", "/ner"):
        model = {"/embed": "mlm", "/tokenize": "mlm", "/ner": "ner"}[route]
        if one:
            return {"model": model, "inputs": t[0]}, {"inputs": t[0]}
        return {"model": model, "inputs": t[:3]}, {f"inputs[{i}]": x for i, x in enumerate(t[:3])}
    if route == "/v1/embeddings":
        return {"model": "mlm", "input": t[:2]}, {f"input[{i}]": x for i, x in enumerate(t[:2])}
    if route == "/similarity":
        fields = {"inputs.source_sentence": t[0]}
        fields |= {f"inputs.sentences[{i}]": x for i, x in enumerate(t[1:3])}
        inputs = {"source_sentence": t[0], "sentences": t[1:3]}
        return {"model": "mlm", "inputs": inputs}, fields
    if route == "/rerank":
        fields = {"query": t[0], **{f"texts[{i}]": x for i, x in enumerate(t[1:3])}}
        body = {"model": "ranker" if one else "mlm", "query": t[0], "texts": t[1:3]}
        return {**body, "return_text": True}, fields
    if route == "/predict":
        if one:
            return {"model": "clf", "inputs": [t[0], t[1]]}, {"inputs[0]": t[0], "inputs[1]": t[1]}
        fields = {f"inputs[{i}][0]": x for i, x in enumerate(t[:2])}
        return {"model": "clf", "inputs": [[x] for x in t[:2]]}, fields
    if route == "/qa":
        q, c = "who " + t[0], "Ann " + t[1]  # words to answer with
        body = {"model": "qa", "question": q, "context": c, "doc_stride": 16}
        return {**body, "max_query_length": 16}, {"question": q, "context": c}
    if route == "/fill-mask":
        x = t[0] + " [MASK] " + t[1]  # never blank
        return {"model": "mlm", "inputs": x}, {"inputs": x}
    raise AssertionError(route)


def _answered_right(route: str, body: dict, answer) -> None:
    """What each route answers holds together with the texts it was sent."""
    if route == "/tokenize":
        per_text = [answer] if isinstance(body["inputs"], str) else answer
        sent = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]
        for text, tokens in zip(sent, per_text, strict=True):
            assert tokens[0]["text"] == "[CLS]" and tokens[-1]["text"] == "[SEP]"
            assert all(0 <= k["start"] <= k["stop"] <= len(text) for k in tokens)
    elif route == "/ner":
        sent = [body["inputs"]] if isinstance(body["inputs"], str) else body["inputs"]
        per_text = [answer] if isinstance(body["inputs"], str) else answer
        for text, entities in zip(sent, per_text, strict=True):
            assert all(e["text"] == text[e["start"] : e["end"]] for e in entities)
    elif route == "/qa":
        assert answer["answer"] == body["context"][answer["start"] : answer["end"]]
    elif route == "/rerank":
        assert sorted(x["index"] for x in answer) == list(range(len(body["texts"])))
        assert all(x["text"] == body["texts"][x["index"]] for x in answer)
    elif route == "/embed":
        n = 1 if isinstance(body["inputs"], str) else len(body["inputs"])
        assert len(answer) == n and all(len(v) == 64 for v in answer)
    elif route == "/fill-mask":
        assert len(answer) == 5 and all("[MASK]" not in c["sequence"] for c in answer)


ROUTES = ["/embed", "/v1/embeddings", "/similarity", "/rerank", "/predict", "/ner", "/qa"]
ROUTES += ["/fill-mask", "/tokenize"]


def test_generated_texts_on_every_route_are_refused_by_field_and_position_or_answered(
    client, folders
):
    seen = {"refused": 0, "answered": 0}

    @hypothesis.settings(max_examples=180, deadline=None, database=None)
    @hypothesis.given(
        st.sampled_from(ROUTES),
        st.lists(odd_texts(st, 4), min_size=3, max_size=3),  # a pair fits 64 tokens
        st.integers(0, 1),
    )
    def send(route, t, variant):
        body, fields = _request(route, t, variant)
        r = _send(client, route, body)
        # what the server reads: JSON joins a surrogate pair ("\ud83d\ude00") into one character
        body, fields = json.loads(json.dumps(body)), json.loads(json.dumps(fields))
        assert r.status_code < 500, (route, body, r.text)
        bad = {f: why for f, x in fields.items() if (why := invalid_code_point(x)) is not None}
        blank = {f for f, x in fields.items() if not x.strip()}
        if bad or blank:
            assert r.status_code == 422, (route, body, r.text)
            field, message = r.json()["field"], r.json()["error"]
            if field in bad:
                assert message.startswith(f"{field} holds {bad[field]}: "), (body, message)
            else:
                assert field in blank and message == f"{field} is empty", (body, message)
            seen["refused"] += 1
        else:
            assert r.status_code == 200, (route, body, r.text)
            _answered_right(route, body, r.json())
            seen["answered"] += 1

    send()
    assert seen["refused"] > 20 and seen["answered"] > 20, seen  # both kinds were sent
    # ... and the server still answers as the pipeline does
    texts = ["a cat sat", "ein Hund \x00 bellte \u0301", "שלום 😀"]
    got = torch.tensor(_send(client, "/embed", {"model": "mlm", "inputs": texts}).json())
    want = pipeline("embed", str(folders["mlm"]))(texts)
    assert (got - want).abs().max() < 1e-5


# ============================================================================ limits
def test_every_route_counts_its_limit_in_the_field_the_request_sends(client):
    """--max-client-batch-size counts the texts of the field that holds them: /rerank's
    query and /similarity's source sentence are not among them."""
    bodies = {  # the body of each route around a list of texts, and the field that holds it
        "/embed": (lambda xs: {"model": "mlm", "inputs": xs}, "inputs"),
        "/v1/embeddings": (lambda xs: {"model": "mlm", "input": xs}, "input"),
        "/similarity": (
            lambda xs: {"model": "mlm", "inputs": {"source_sentence": "q", "sentences": xs}},
            "inputs.sentences",
        ),
        "/rerank": (lambda xs: {"model": "mlm", "query": "q", "texts": xs}, "texts"),
        "/predict": (lambda xs: {"model": "clf", "inputs": [[x] for x in xs]}, "inputs"),
        "/ner": (lambda xs: {"model": "ner", "inputs": xs}, "inputs"),
        "/fill-mask": (
            lambda xs: {"model": "mlm", "inputs": [x + " [MASK]" for x in xs]},
            "inputs",
        ),
        "/tokenize": (lambda xs: {"model": "mlm", "inputs": xs}, "inputs"),
    }
    cross = (lambda xs: {"model": "ranker", "query": "q", "texts": xs}, "texts")
    for route, (body, field) in [*bodies.items(), ("/rerank", cross)]:
        at_limit = [f"text {i}" for i in range(MOST)]
        assert _send(client, route, body(at_limit)).status_code == 200, route
        r = _send(client, route, body([*at_limit, "one more"]))
        assert r.status_code == 413 and r.json()["field"] == field, (route, r.text)
        assert r.json()["error"] == (
            f"{field} holds {MOST + 1} texts; this server takes at most {MOST} per request"
        )


def test_a_text_past_the_models_length_is_named_by_its_own_field(client):
    long = " ".join(["river"] * 80)  # 82 tokens, past the tiny models' 64
    cases = [
        ("/rerank", {"model": "mlm", "query": long, "texts": ["a"]}, "query"),
        ("/rerank", {"model": "mlm", "query": "q", "texts": ["a", long]}, "texts[1]"),
        ("/rerank", {"model": "ranker", "query": "q", "texts": ["a", long]}, "texts[1]"),  # 84
        (
            "/similarity",
            {"model": "mlm", "inputs": {"source_sentence": long, "sentences": ["a"]}},
            "inputs.source_sentence",
        ),
        (
            "/similarity",
            {"model": "mlm", "inputs": {"source_sentence": "a", "sentences": ["b", long]}},
            "inputs.sentences[1]",
        ),
        ("/v1/embeddings", {"model": "mlm", "input": [long]}, "input[0]"),
        ("/embed", {"model": "mlm", "inputs": ["a", long]}, "inputs[1]"),
        ("/predict", {"model": "clf", "inputs": [["a"], [long]]}, "inputs[1]"),
        ("/ner", {"model": "ner", "inputs": long}, "inputs"),
    ]
    for route, body, field in cases:
        r = _send(client, route, body)
        assert r.status_code == 413 and r.json()["field"] == field, (route, r.text)
        n = 84 if body["model"] == "ranker" else 82  # a pair: [CLS] q [SEP] text [SEP]
        assert r.json()["error"].startswith(f"{field} has {n} tokens; this model takes at most 64")
        assert '"truncate": true' in r.json()["error"]


# ============================================================================ the folders
def test_a_pretraining_folder_fills_masks_as_the_fill_mask_pipeline_does(tmp_path):
    folder = tiny(bertlab.BertForPreTraining, tmp_path / "pretrained", 6)  # bertlab pretrain's
    text = "Paris is the [MASK] of France."
    server = Server(ServeConfig(models=[("pre", folder)]))
    with TestClient(server.app()) as c:
        got = c.post("/fill-mask", json={"inputs": text, "top_k": 3})
        info = c.get("/info").json()["models"][0]
    assert got.status_code == 200, got.text
    assert info["head"] == "pretraining" and "/fill-mask" in info["routes"]
    want = pipeline("fill-mask", str(folder))(text, top_k=3)
    assert [c["token"] for c in got.json()] == [c["token"] for c in want]
    assert [c["score"] for c in got.json()] == pytest.approx([c["score"] for c in want], abs=1e-5)


# ============================================================================ a real server
@contextmanager
def _running(server: Server):
    import httpx
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(server.app(), port=port, log_level="warning", lifespan="on")
    userver = uvicorn.Server(config)
    thread = threading.Thread(target=userver.run, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield port
    finally:
        userver.should_exit = True
        thread.join(10)


def test_a_client_that_leaves_while_its_body_is_read_is_a_499_on_one_log_line(folders, caplog):
    import httpx

    server = Server(ServeConfig(models=[("mlm", folders["mlm"])]))
    with caplog.at_level(logging.INFO, logger="bertlab.serve"), _running(server) as port:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"inputs": "half a bo'
        )
        time.sleep(0.2)  # the server reads the body's first bytes
        s.close()  # and the client leaves
        url = f"http://127.0.0.1:{port}"
        page = ""
        for _ in range(100):  # until the server has answered it
            page = httpx.get(f"{url}/metrics").text
            if 'route="embed"' in page:
                break
            time.sleep(0.05)
        after = httpx.post(f"{url}/embed", json={"inputs": "after"}, timeout=10)
    assert 'bertlab_requests_total{route="embed",status="499"} 1' in page
    assert 'status="500"' not in page
    assert after.status_code == 200
    lines = [r for r in caplog.records if r.name == "bertlab.serve"]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    assert lines[0].getMessage() == (
        "POST /embed 499: the client disconnected while its body was read"
    )

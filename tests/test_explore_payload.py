"""bertlab explore: every number of the payload reconciles with the model's own forward pass
(hidden states, attentions, the embedding identity of reference 002, q·k/√D + mask -> softmax,
the value-weighted norms, the parameter table), the page is assembled safely, and bad input is
refused before any work. The browser side is tests/test_explore_browser.py."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
import torch
import torch.nn.functional as F
from helpers import scramble

import bertlab
from bertlab import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertTokenizer,
)
from bertlab.explore.page import Exploration, render_html, script_json
from bertlab.explore.payload import ATTENTION_BYTES, unarray
from bertlab.explore.summary import format_table, parameter_table

TEXT = "The quick brown fox jumps over the [MASK] dog."
PAIR = "Unbelievably, it was asleep."


@pytest.fixture(scope="module")
def tokenizer():
    return BertTokenizer.from_pretrained(bertlab.bundled_model_dir())


def tiny(cls=BertForMaskedLM, seed=0, **kw):
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        **kw,
    )
    torch.manual_seed(seed)
    return scramble(cls(config), seed).eval()


@pytest.fixture(scope="module")
def mlm():
    return tiny()


@pytest.fixture(scope="module")
def explored(mlm, tokenizer):
    return bertlab.explore(TEXT, PAIR, model=mlm, tokenizer=tokenizer)


def reference(model, tokenizer, text=TEXT, pair=PAIR):
    """The model's outputs as the explorer's run computes them. That run watches every module
    with a hook, and a watched linear layer runs as nn.Linear (products.py); so the reference
    runs with fast inference off, the same products, and must give the same bits (unwatched,
    a CPU's fast products differ from nn.Linear's by rounding)."""
    enc = tokenizer(text, pair, return_tensors="pt")
    model.set_fast_inference(False)
    try:
        with torch.no_grad():
            out = model(**enc, output_hidden_states=True, output_attentions=True)
    finally:
        model.set_fast_inference(True)
    return enc, out


def test_hidden_states_and_attentions_are_the_models_own(explored, mlm, tokenizer):
    _, out = reference(mlm, tokenizer)
    layers = explored.payload["layers"]
    hidden = unarray(layers["hidden"])
    assert hidden.shape == (4, len(explored.tokens), 32)
    for n, h in enumerate(out.hidden_states):
        assert torch.equal(hidden[n], h[0])
    for n, a in enumerate(out.attentions):
        for h in range(4):
            assert torch.equal(explored.attention(n, h), a[0, h])


def test_the_embedding_parts_sum_to_the_embedding_layers_output(explored, mlm, tokenizer):
    """Reference 002: LayerNorm(word + position + segment) is the embedding layer's output."""
    enc, out = reference(mlm, tokenizer)
    e = {
        k: v if k in ("eps", "positions") else unarray(v)
        for k, v in explored.payload["embeddings"].items()
    }
    ids, segments = enc["input_ids"][0], enc["token_type_ids"][0]
    emb = mlm.bert.embeddings
    assert torch.equal(e["word"], emb.word_embeddings.weight[ids])
    assert torch.equal(e["segment"], emb.token_type_embeddings.weight[segments])
    assert torch.equal(e["position"], emb.position_embeddings.weight[: len(ids)])
    assert torch.allclose(e["word"] + e["segment"] + e["position"], e["sum"], atol=1e-6)
    by_hand = (e["sum"] - e["mean"][:, None]) / torch.sqrt(e["var"][:, None] + e["eps"])
    by_hand = by_hand * e["gamma"] + e["beta"]
    assert torch.allclose(by_hand, e["output"], atol=1e-5)
    assert torch.equal(e["output"], out.hidden_states[0][0])
    assert e["segment"][segments == 1].shape[0] > 0  # the pair is segment B


def test_q_dot_k_over_sqrt_d_plus_mask_softmaxed_is_the_reported_weight(explored, mlm, tokenizer):
    layers = explored.payload["layers"]
    q, k = unarray(layers["query"]), unarray(layers["key"])
    mask, scale = unarray(layers["mask"]), layers["scale"]
    hidden = unarray(layers["hidden"])
    A, D = 4, 8
    assert scale == pytest.approx(D**-0.5)
    for n, layer in enumerate(mlm.bert.encoder.layer):
        # the stored queries are the model's projection of that layer's input
        assert torch.allclose(q[n], layer.attention.self.query(hidden[n]), atol=1e-6)
        for h in range(A):
            block = slice(h * D, (h + 1) * D)
            weights = (q[n][:, block] @ k[n][:, block].T * scale + mask).softmax(-1)
            assert (weights - explored.attention(n, h)).abs().max() <= 1e-6


def test_value_norms_are_the_contribution_of_each_token_through_each_head(explored, mlm):
    """||v_j^h W_O^h||, computed here from the weights: attention * this is what token j adds."""
    layers = explored.payload["layers"]
    hidden, norms = unarray(layers["hidden"]), unarray(layers["value_norm"])
    A, D = 4, 8
    for n, layer in enumerate(mlm.bert.encoder.layer):
        v = layer.attention.self.value(hidden[n])
        w_o = layer.attention.output.dense.weight
        for h in range(A):
            block = slice(h * D, (h + 1) * D)
            by_hand = torch.stack([(v[j, block] @ w_o[:, block].T).norm() for j in range(len(v))])
            assert torch.allclose(norms[n, h], by_hand, atol=1e-5)
        # summed over keys with the weights and through W_O, the heads give the attention output
        weighted = sum(
            explored.attention(n, h) @ v[:, h * D : (h + 1) * D] @ w_o[:, h * D : (h + 1) * D].T
            for h in range(A)
        )
        x = hidden[n]
        a = layer.attention.output.LayerNorm(x + weighted + layer.attention.output.dense.bias)
        assert torch.allclose(layer.feed_forward(a), hidden[n + 1], atol=1e-5)


def test_layer_similarities(explored):
    layers = explored.payload["layers"]
    hidden = unarray(layers["hidden"])
    own = unarray(layers["self_similarity"])
    assert torch.allclose(own[0], torch.ones(len(explored.tokens)), atol=1e-6)
    assert torch.allclose(own[2], F.cosine_similarity(hidden[2], hidden[0], dim=-1), atol=1e-6)
    others = unarray(layers["mean_similarity"])
    T = hidden.shape[1]
    sims = F.cosine_similarity(hidden[1][:, None], hidden[1][None], dim=-1)
    assert torch.allclose(others[1], (sims.sum(-1) - sims.diagonal()) / (T - 1), atol=1e-5)


def test_masked_lm_predictions_at_the_last_layer_are_the_models(explored, mlm, tokenizer):
    _, out = reference(mlm, tokenizer)
    pred = explored.payload["predictions"]
    ids, probs = unarray(pred["token"]), unarray(pred["prob"])
    assert ids.shape == (4, len(explored.tokens), 5)
    top = out.logits[0].softmax(-1).topk(5)
    assert torch.equal(ids[-1], top.indices)
    assert torch.allclose(probs[-1], top.values, atol=1e-6)
    assert (
        pred["strings"][str(int(ids[0, 0, 0]))]
        == tokenizer.convert_ids_to_tokens([int(ids[0, 0, 0])])[0]
    )
    masked = [t["i"] for t in explored.payload["tokens"] if t["masked"]]
    assert len(masked) == 1 and explored.tokens[masked[0]] == "[MASK]"


def test_tokens_map_back_to_the_text(explored):
    rows = explored.payload["tokens"]
    assert rows[0]["token"] == "[CLS]" and rows[0]["special"] and rows[0]["start"] is None
    seps = [r["i"] for r in rows if r["token"] == "[SEP]"]
    assert len(seps) == 2 and rows[-1]["token"] == "[SEP]"
    for r in rows:
        if r["special"] or r["masked"]:
            continue
        source = TEXT if r["segment"] == 0 else PAIR
        assert source[r["start"] : r["end"]].lower() == r["token"].removeprefix("##")
    assert {r["segment"] for r in rows if r["i"] > seps[0]} == {1}
    pieces = [r for r in rows if r["token"].startswith("##")]
    assert pieces and all(p["word"] == rows[p["i"] - 1]["word"] for p in pieces)


def test_parameter_totals_are_those_of_bertlab_summary(explored, mlm):
    params = explored.payload["parameters"]
    rows = parameter_table(mlm)
    assert [r["name"] for r in params["rows"]] == [r.name for r in rows]
    assert params["total"] == mlm.num_parameters() == sum(r.params for r in rows)
    text = format_table(rows, "t", mlm.config)
    assert f"Total params: {params['total']:,}" in text
    assert f"Named parameter tensors: {params['tensors']}" in text
    assert [r["layer"] for r in params["rows"] if r["name"].startswith("encoder.layer.2")]


def test_the_graph_holds_every_module_that_ran_and_every_parameter_once(explored, mlm):
    graph = explored.payload["graph"]
    assert graph["class"] == "BertForMaskedLM"
    assert graph["params"] == mlm.num_parameters()  # the tied decoder counted once

    def walk(node):
        yield node
        for c in node["children"]:
            yield from walk(c)

    nodes = list(walk(graph))
    modules = {n["id"] for n in nodes if n["class"] not in ("op", "group")}
    assert {f"bert.encoder.layer.{i}" for i in range(3)} <= modules
    assert {"bert.encoder.layer.1.attention.self.query", "cls.predictions.transform"} <= modules
    ops = [n for n in nodes if n["op"] and n["layer"] == 0]
    assert any("softmax" in n["name"] for n in ops)
    assert sum("residual" in n["name"] for n in ops) == 2
    parallel = [n for n in nodes if n["parallel"]]
    assert [len(n["children"]) for n in parallel] == [3] * 4  # lookups, and q|k|v of 3 layers
    query = next(n for n in nodes if n["id"].endswith("layer.0.attention.self.query"))
    T = len(explored.tokens)
    assert query["in"] == f"(1, {T}, 32)" and query["params"] == 32 * 32 + 32


@pytest.mark.parametrize(
    "cls, kind",
    [
        (BertForSequenceClassification, "sequence-classification"),
        (BertForTokenClassification, "token-classification"),
        (BertForQuestionAnswering, "question-answering"),
        (BertModel, "base"),
        (BertForPreTraining, "pretraining"),
        (BertForNextSentencePrediction, "nsp"),
        (BertForMultipleChoice, "multiple-choice"),
    ],
)
def test_the_head_output_is_the_models_own(cls, kind, tokenizer):
    model = tiny(cls, seed=1, num_labels=3)
    page = bertlab.explore(
        "Who sat on the mat?", "The cat sat on the mat.", model=model, tokenizer=tokenizer
    )
    out = page.payload["output"]
    assert out["kind"] == kind and page.payload["model"]["head"] == kind
    has_mlm = kind == "pretraining"
    assert (page.payload["predictions"] is not None) == has_mlm  # a masked-LM head or not
    question, context = "Who sat on the mat?", "The cat sat on the mat."
    if kind == "multiple-choice":
        enc = tokenizer(question, context, return_tensors="pt")
        with torch.no_grad():
            logits = model(**{k: v[:, None] for k, v in enc.items()}).logits
        assert out["score"] == pytest.approx(float(logits[0, 0]), abs=1e-6)
        return
    _, ref = reference(model, tokenizer, question, context)
    if kind == "sequence-classification":
        assert torch.allclose(torch.tensor(out["probs"]), ref.logits[0].softmax(-1), atol=1e-6)
        assert out["labels"] == ["LABEL_0", "LABEL_1", "LABEL_2"]
    elif kind == "token-classification":
        assert out["per_token"] == ref.logits[0].argmax(-1).tolist()
    elif kind == "question-answering":
        best = out["best"]
        rows = page.payload["tokens"]
        assert rows[best["start"]]["segment"] == rows[best["end"]]["segment"] == 1
        score = ref.start_logits[0, best["start"]] + ref.end_logits[0, best["end"]]
        assert best["score"] == pytest.approx(float(score), abs=1e-5)
        assert best["text"] in "The cat sat on the mat."
    elif kind in ("pretraining", "nsp"):
        logits = ref.seq_relationship_logits if kind == "pretraining" else ref.logits
        assert torch.allclose(torch.tensor(out["nsp"]["probs"]), logits[0].softmax(-1), atol=1e-6)
    else:
        assert out["pooled_norm"] == pytest.approx(float(ref.pooler_output[0].norm()), rel=1e-6)


def test_a_512_token_input_is_summarised_and_still_reconciles(tokenizer):
    """The bundled model at its full length: the attention maps would be 72 MB, so rows keep
    their largest weights, and those are still the model's."""
    model = BertModel.from_pretrained(bertlab.bundled_model_dir())
    text = " ".join(["the cat sat on a mat and looked at the dog"] * 60)
    page = bertlab.explore(text, model=model, tokenizer=tokenizer, truncate=True)
    p = page.payload
    T, L, A = 512, 6, 12
    assert len(p["tokens"]) == T and p["truncated"] == {"tokens": 662, "kept": T, "limit": T}
    assert L * A * T * T * 4 > ATTENTION_BYTES and "topk" in p["layers"]["attention"]
    assert any("largest weights" in s for s in p["summarised"])
    assert any("662" in s for s in p["summarised"])
    enc = tokenizer(text, truncation=True, max_length=T, return_tensors="pt")
    with torch.no_grad():
        ref = model(**enc, output_attentions=True).attentions
    stored = p["layers"]["attention"]
    index, value = unarray(stored["index"]), unarray(stored["value"])
    for n in (0, 5):
        # The page is read through hooks on every module, which compute each product as the
        # module itself (products.py): equal to the unwatched run within 1e-5, as parity is.
        top = ref[n][0].topk(stored["topk"], dim=-1)
        torch.testing.assert_close(value[n], top.values, rtol=0, atol=1e-5)
        torch.testing.assert_close(ref[n][0].gather(-1, index[n]), value[n], rtol=0, atol=1e-5)
    q, k = unarray(p["layers"]["query"])[5], unarray(p["layers"]["key"])[5]
    weights = (q[:, 64:96] @ k[:, 64:96].T * p["layers"]["scale"]).softmax(-1)
    assert (weights - ref[5][0, 2]).abs().max() <= 1e-5  # (1.2e-6 on AVX2 kernels)
    assert len(json.dumps(p)) < 40 * 2**20  # the page stays small enough to open


# ============================================================================ the page
def test_the_page_is_one_file_that_asks_for_nothing(explored):
    page = explored.html()
    assert "<!--BERTLAB_DATA-->" not in page and "/*BERTLAB_JS*/" not in page
    # nothing that could load from elsewhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(http" not in page
    data = re.search(r'id="bertlab-payload">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["text"] == TEXT


def test_html_in_the_text_cannot_close_the_payload_script(mlm, tokenizer):
    evil = "</script><script>window.__pwned=1</script><img src=x onerror=alert(1)>"
    page = bertlab.explore(evil, model=mlm, tokenizer=tokenizer)
    text = page.html()
    assert "</script><script>window.__pwned" not in text
    assert "\\u003c/script\\u003e" in script_json(evil)
    data = re.search(r'id="bertlab-payload">(.*?)</script>', text, re.S).group(1)
    assert json.loads(data)["text"] == evil


def test_a_notebook_shows_each_page_in_its_own_frame(explored):
    frame = explored._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and frame.count("<iframe") == 1
    inner = re.search(r'srcdoc="(.*?)"', frame, re.S).group(1)
    assert html.unescape(inner) == explored.html()
    assert explored._repr_html_() == frame  # again, the same (several per notebook)


def test_bertlab_explore_is_callable_and_its_modules_import():
    import bertlab.explore.summary as summary  # still a package

    assert callable(bertlab.explore) and summary.parameter_table
    assert isinstance(bertlab.explore, type(summary))


def test_the_page_opens_on_the_layer_and_head_asked_for(mlm, tokenizer):
    page = bertlab.explore("a b c", model=mlm, tokenizer=tokenizer, layer=2, attention_head=3)
    mode = re.search(r'id="bertlab-mode">(.*?)</script>', page.html()).group(1)
    assert json.loads(mode) == {"serve": False, "layer": 2, "head": 3}


# ============================================================================ bad input
@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_text_is_refused(text, mlm, tokenizer):
    with pytest.raises(ValueError, match="text is empty"):
        bertlab.explore(text, model=mlm, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="pair is empty"):
        bertlab.explore("fine", text, model=mlm, tokenizer=tokenizer)


def test_text_over_the_models_length_is_refused_naming_both(mlm, tokenizer):
    long = "word " * 100
    with pytest.raises(ValueError, match=r"102 tokens long; this model reads at most 64"):
        bertlab.explore(long, model=mlm, tokenizer=tokenizer)
    page = bertlab.explore(long, model=mlm, tokenizer=tokenizer, truncate=True)
    assert len(page.tokens) == 64 and page.tokens[-1] == "[SEP]"
    assert page.payload["summarised"][0] == "The input was 102 tokens; the first 64 are shown."


@pytest.mark.parametrize(
    "layer, head, match",
    [
        (3, 0, "layer 3 is out of range: this model has layers 0 to 2"),
        (0, 4, "attention head 4 is out of range: each layer has heads 0 to 3"),
        (-1, 0, "layer -1 is out of range"),
    ],
)
def test_layer_or_head_out_of_range(layer, head, match, mlm, tokenizer, explored):
    with pytest.raises(IndexError, match=match):
        bertlab.explore("a", model=mlm, tokenizer=tokenizer, layer=layer, attention_head=head)
    with pytest.raises(IndexError, match=match):
        explored.attention(layer, head)


def test_a_folder_without_weights_or_of_another_architecture(tmp_path, mlm, tokenizer):
    folder = tmp_path / "m"
    mlm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert bertlab.explore("it loads", model=folder).payload["model"]["head"] == "masked-lm"
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="weights"):
        bertlab.explore("it loads", model=folder)
    other = tmp_path / "r"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(ValueError, match="'roberta'"):
        bertlab.explore("it loads", model=other)
    with pytest.raises(ValueError, match="unknown head 'tagger'"):
        bertlab.explore("it loads", model=folder, head="tagger")
    with pytest.raises(TypeError, match="tokenizer="):
        bertlab.explore("it loads", model=mlm)


def test_saving_into_a_folder_that_does_not_exist(explored, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        explored.save(tmp_path / "missing" / "page.html")
    with pytest.raises(IsADirectoryError):
        explored.save(tmp_path)
    assert explored.save(tmp_path / "page.html").read_text() == explored.html()


# ============================================================================ command line
def cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "bertlab", "explore", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_command_writes_the_page_and_refuses_bad_paths_before_work(tmp_path, capsys):
    from bertlab.cli.main import main

    def refused(*args) -> tuple[int, str]:  # in this process: a refusal comes before any work
        try:
            code = main(["explore", *args])
        except SystemExit as stop:
            code = stop.code
        return code, capsys.readouterr().err

    out = tmp_path / "page.html"
    done = cli("Paris is the capital of [MASK].", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "tokens through all-MiniLM-L6-v2 (bundled)" in done.stdout
    assert out.stat().st_size > 100_000
    payload = json.loads(
        re.search(r'id="bertlab-payload">(.*?)</script>', out.read_text()).group(1)
    )
    assert payload["model"]["layers"] == 6 and payload["tokens"][1]["token"] == "paris"
    missing = tmp_path / "nowhere" / "page.html"
    for args, message in (
        (("text", "-o", str(missing)), "does not exist"),
        (("", "-o", str(out)), "text is empty"),
        (("text",), "-o page.html, --png DIR, or --serve"),
        (("text", "-o", str(out), "--layer", "6"), "layer 6 is out of range"),
        (("text", "--png", str(tmp_path / "v"), "--browser", "/no/chromium"), "no browser at"),
        (("text", "--png", str(tmp_path / "a" / "b")), "does not exist"),
    ):
        code, err = refused(*args)
        assert code == 2 and message in err, (args, err)
    assert not missing.parent.exists()


# ============================================================================ --serve
@pytest.fixture(scope="module")
def server():
    from bertlab.explore.serve import make_server

    srv = make_server("default", "A first sentence.", port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def request(url, body=None, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_serve_gives_the_page_and_payloads_and_4xx_for_bad_requests(server):
    status, page = request(server + "/")
    assert status == 200 and b'{"serve":true}' in page
    status, body = request(server + "/api/explore", {"text": "Another one.", "pair": "And B."})
    assert status == 200
    payload = json.loads(body)
    assert payload["pair"] == "And B." and payload["tokens"][1]["token"] == "another"
    for body, raw, code, message in (
        ({"text": ""}, None, 400, "text is empty"),
        ({"text": 5}, None, 400, "text must be a string"),
        ({"pair": "x"}, None, 400, "expected a JSON object"),
        (None, b"{not json", 400, "not JSON"),
        ({"text": "word " * 600}, None, 400, "reads at most 512"),
        (None, b"x" * (300 * 1024), 413, "the limit is"),
    ):
        status, reply = request(server + "/api/explore", body, raw)
        assert status == code and message in json.loads(reply)["error"], reply
    status, reply = request(server + "/api/explore", {"text": "word " * 600, "truncate": True})
    assert status == 200 and json.loads(reply)["truncated"]["kept"] == 512
    status, reply = request(server + "/elsewhere")
    assert status == 404
    req = urllib.request.Request(server + "/api/explore", data=b"{}", method="POST")
    req.add_unredirected_header("Content-Length", "-3")
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(req, timeout=60)
    assert bad.value.code == 400


def test_render_html_refuses_a_template_without_markers(monkeypatch, explored):
    from bertlab.explore import page as page_module

    monkeypatch.setattr(page_module, "_static", lambda name: "" if name == "page.html" else "x")
    with pytest.raises(RuntimeError, match="lost its"):
        render_html(explored.payload)
    assert isinstance(explored, Exploration)


def test_float16_vectors_still_give_the_weights_to_their_precision(mlm, tokenizer, monkeypatch):
    from bertlab.explore import payload as payload_module

    monkeypatch.setattr(payload_module, "VECTOR_BYTES", 0)
    page = bertlab.explore(TEXT, model=mlm, tokenizer=tokenizer)
    layers = page.payload["layers"]
    assert {layers[k]["dtype"] for k in ("hidden", "query", "key")} == {"f16"}
    assert "float16" in page.payload["summarised"][0]
    q, k = unarray(layers["query"])[2], unarray(layers["key"])[2]
    weights = (q[:, 8:16] @ k[:, 8:16].T * layers["scale"]).softmax(-1)
    assert (weights - page.attention(2, 1)).abs().max() <= 2e-3
    assert layers["attention"]["dtype"] == "f32"  # small enough to stay whole and exact

"""The one front half of inference (bertlab/pipelines/front.py, text.py) and the one span decoder
(bertlab.data.squad.decode_spans): what counts as invalid text and how a refusal names it; the
encoding of texts under the model's length (refused, cut, split), equal to the tokenizer's own
truncation; every span decoder's answer against a brute-force search over every span; one
encoding for the pipelines, the server and the explorer; and imports that point down only."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.data.squad import decode_spans
from bertlab.pipelines import front
from bertlab.pipelines.text import InputError, check_text, check_texts, invalid_code_point

ROOT = Path(__file__).resolve().parents[1]
TOK = bertlab.BertTokenizer.from_pretrained(bertlab.bundled_model_dir())


# ============================================================================ text rules
@pytest.mark.parametrize(
    "text",
    [
        "a\x00b",  # NUL
        "bell\x07 tab\t escape\x1b del\x7f c1\x85",  # control characters
        "cafe\u0301 n\u0303",  # combining marks
        "שלום עולם",  # right to left
        "مرحبا بالعالم",
        "emoji 😀👍🏽 flags 🇫🇷",  # past U+FFFF, modifiers, a regional-indicator pair
        "\ufeffbom \uffff\ufffe \ufdd0",  # a BOM and noncharacters
        "private \ue000 \U000f0000",
        "\U0010ffff",  # the last code point
    ],
)
def test_every_code_point_but_a_surrogate_is_text(text):
    assert invalid_code_point(text) is None
    assert check_text(text, "inputs") == text
    enc = TOK(text, return_offsets_mapping=True)  # the tokenizer reads it
    assert all(0 <= a <= b <= len(text) for a, b in enc["offset_mapping"])


def test_a_nul_or_control_character_is_dropped_as_bert_drops_it_and_offsets_stay_in_the_text():
    text = "a\x00b\x07c lives"
    enc = TOK(text, return_offsets_mapping=True)
    assert enc["input_ids"] == TOK("abc lives")["input_ids"]
    (a, b) = enc["offset_mapping"][1]
    assert text[a:b] == "a\x00b\x07c"  # the piece spans the characters it came from


@pytest.mark.parametrize(
    "text, field, message",
    [
        ("\ud800", "inputs", "inputs holds an unpaired surrogate U+D800 at character 0"),
        ("abcde\ud800", "inputs[3]", "inputs[3] holds an unpaired surrogate U+D800 at character 5"),
        ("x\udfffy", "query", "query holds an unpaired surrogate U+DFFF at character 1"),
        ("ok\udc00\ud800", "t", "t holds an unpaired surrogate U+DC00 at character 2"),  # reversed
        (
            "😀 \ud83d\ude00",
            "t",
            "t holds a surrogate pair U+D83D U+DE00 at character 2 (UTF-16 "
            "code units, not text: decode them to U+1F600 first)",
        ),  # fmt: skip
    ],
)
def test_a_surrogate_is_refused_naming_the_field_the_code_point_and_its_position(
    text, field, message
):
    with pytest.raises(InputError) as caught:
        check_text(text, field)
    assert str(caught.value).startswith(message + ": a text must be valid Unicode")
    assert "U+D800 to U+DFFF" in str(caught.value)
    assert caught.value.field == field and not caught.value.limit
    assert isinstance(caught.value, ValueError)  # what every pipeline raises


def test_blank_texts_are_refused_only_where_asked_and_lists_name_each_text():
    assert check_text("  ", "inputs") == "  "
    with pytest.raises(InputError, match="^inputs is empty$"):
        check_text(" \n", "inputs", blank="{field} is empty")
    assert check_texts(["a", "b"], "texts") == (["a", "b"], False)
    assert check_texts("a", "texts") == (["a"], True)
    with pytest.raises(InputError, match=r"^texts\[1\] holds an unpaired surrogate U\+D834 at"):
        check_texts(["fine", "\ud834"], "texts")
    with pytest.raises(TypeError, match="inputs must be a str or a list of str"):
        check_texts([1], "inputs")


# ============================================================================ encoding
def test_long_texts_are_refused_cut_on_either_side_or_split_naming_their_field():
    text = " ".join(f"w{i}" for i in range(40))  # 40 words, 2 pieces each: 82 tokens
    full = TOK(text, return_offsets_mapping=True)
    n = len(full["input_ids"])
    with pytest.raises(front.TooLong) as caught:
        front.encode(TOK, ["short", text], "mean", limit=32, fields=["inputs[0]", "inputs[1]"])
    e = caught.value
    assert str(e) == f"inputs[1] has {n} tokens; this model takes at most 32"
    assert (e.field, e.tokens, e.most, e.limit, e.pair) == ("inputs[1]", n, 32, True, False)
    (right,) = front.encode(TOK, [text], "tokens", limit=32, long="truncate", offsets=True)
    cut = TOK(text, truncation=True, max_length=32, return_offsets_mapping=True)
    assert right.rows[0].input_ids == cut["input_ids"] and right.truncated and right.tokens == n
    assert right.word_ids == cut.word_ids() and right.offsets == cut["offset_mapping"]
    (left,) = front.encode(
        TOK, [text], "mean", limit=32, long="truncate", truncation_direction="left", offsets=True
    )
    ids = full["input_ids"]
    assert left.rows[0].input_ids == ids[:1] + ids[n - 31 :]
    assert left.offsets[1:-1] == full["offset_mapping"][n - 31 : n - 1]
    (side,) = front.encode(TOK, [text], "mean", limit=32, long="windows")
    bodies = [r.input_ids[1:-1] for r in side.rows]
    assert sum(bodies, []) == ids[1:-1] and all(len(r) <= 32 for r in side.rows)
    (tags,) = front.encode(TOK, [text], "tokens", limit=32, long="windows", offsets=True)
    assert tags.step == front.tag_step(32) == 15  # windows of 30 pieces overlapping by 15
    assert [r.input_ids[1:-1] for r in tags.rows][1] == ids[1 + 15 : 1 + 45]
    assert tags.word_ids == full.word_ids()  # the whole text's pieces, as merged back


def test_a_pair_is_cut_as_the_tokenizer_cuts_it_and_never_split():
    a, b = " ".join(["alpha"] * 30), " ".join(["beta"] * 10)
    (e,) = front.encode(TOK, [a], "logits", pairs=[b], limit=24, long="truncate")
    assert e.rows[0].input_ids == TOK(a, b, truncation=True, max_length=24)["input_ids"]
    (first,) = front.encode(
        TOK, [a], "logits", pairs=[b], limit=24, long="truncate", pair_truncation="only_first"
    )
    assert first.rows[0].input_ids == TOK(a, b, truncation="only_first", max_length=24)["input_ids"]
    with pytest.raises(front.TooLong, match=r"x: a text pair of 43 tokens cannot be split"):
        front.encode(TOK, [a], "logits", pairs=[b], limit=24, long="windows", fields=["x"])
    with pytest.raises(InputError, match="text pairs are truncated on the right only"):
        front.encode(
            TOK, [a], "logits", pairs=[b], limit=24, long="truncate", truncation_direction="left"
        )
    with pytest.raises(InputError, match=r"^y\[0\] holds an unpaired surrogate U\+DABC"):
        front.encode(TOK, ["ok"], "logits", pairs=["\udabc"], limit=24, pair_fields=["y[0]"])


def test_windows_merge_back_into_one_result_per_text():
    e = front.Encoded([front.Row([0] * 5, [0] * 5, "mean"), front.Row([0] * 3, [0] * 3, "mean")], 6)
    v = front.merge_vectors(e, [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])])
    assert torch.allclose(v, torch.tensor([5 / 8, 3 / 8]))
    # tagging: 6 body pieces in windows of 4 (step 2); each piece from its most central window
    rows = [front.Row([0] * 6, [0] * 6, "tokens") for _ in range(2)]
    tagged = front.Encoded(rows, 8, step=2)
    outs = [torch.arange(6.0)[:, None] + 10 * w for w in range(2)]  # (6, 1) each
    merged = front.merge_tokens(tagged, outs)[:, 0].tolist()
    assert merged == [0.0, 1.0, 2.0, 3.0, 12.0, 13.0, 14.0, 15.0]  # [CLS] from window 0, [SEP] 1


# ============================================================================ spans
def _brute(starts, ends, allowed, top_k, longest, scoring):
    """Every (start, end) span of every window, scored from scratch, best first."""
    found, null = [], None
    for w, (s, e, ok) in enumerate(zip(starts, ends, allowed, strict=True)):
        n = len(ok)
        s, e = s[:n].double(), e[:n].double()
        if scoring == "probabilities":
            keep = ok.clone()
            keep[0] = True
            ps = s.masked_fill(~keep, -10000.0).softmax(-1)
            pe = e.masked_fill(~keep, -10000.0).softmax(-1)
            cls = float(ps[0] * pe[0])
        else:
            cls = float(s[0] + e[0])
        null = cls if null is None else min(null, cls)
        for i in range(n):
            for j in range(i, min(n, i + longest)):
                if ok[i] and ok[j] and (scoring == "logits" or i > 0):
                    score = (
                        float(ps[i] * pe[j]) if scoring == "probabilities" else float(s[i] + e[j])
                    )
                    found.append((score, w, i, j))
    found.sort(key=lambda x: -x[0])
    return found[:top_k], null


@pytest.mark.parametrize("scoring", ["logits", "probabilities"])
def test_decode_spans_finds_the_spans_a_search_of_every_span_finds(scoring):
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        windows = 1 + trial % 3
        n = [int(torch.randint(5, 20, (1,), generator=g)) for _ in range(windows)]
        starts = [torch.randn(m + 2, generator=g) * 3 for m in n]  # padding past n is ignored
        ends = [torch.randn(m + 2, generator=g) * 3 for m in n]
        allowed = [torch.arange(m) >= m // 3 for m in n]  # a question, then a context
        top_k, longest = 1 + trial % 4, 1 + trial % 6
        got, null = decode_spans(
            starts, ends, allowed, top_k=top_k, max_answer_length=longest, scoring=scoring
        )
        want, want_null = _brute(starts, ends, allowed, top_k, longest, scoring)
        assert [(s.window, s.start, s.end) for s in got] == [x[1:] for x in want], trial
        assert [s.score for s in got] == pytest.approx([x[0] for x in want], rel=1e-5, abs=1e-9)
        assert null == pytest.approx(want_null, rel=1e-5)


def test_candidates_limit_spans_to_the_highest_start_and_end_logits_as_run_squad_did():
    s = torch.tensor([0.0, 9.0, 1.0, 5.0, 2.0])
    e = torch.tensor([0.0, 8.0, 1.0, 9.0, 3.0])
    ok = torch.tensor([False, True, True, True, True])
    every, _ = decode_spans([s], [e], [ok], top_k=3)
    one, _ = decode_spans([s], [e], [ok], top_k=3, candidates=1)
    assert [(x.start, x.end, x.score) for x in every] == [(1, 3, 18.0), (1, 1, 17.0), (3, 3, 14.0)]
    assert [(x.start, x.end) for x in one] == [(1, 3)]  # the best start with the best end


# ============================================================================ one front half
def test_the_pipelines_the_server_and_the_explorer_encode_a_text_alike(tmp_path):
    pytest.importorskip("starlette", reason="the serve extra runs the server's encoding")
    from bertlab.explore.payload import build_payload
    from bertlab.serve.engine import ServedModel

    folder = tmp_path / "m"
    cfg = bertlab.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=24,
    )
    torch.manual_seed(0)
    bertlab.BertForTokenClassification(cfg).save_pretrained(folder)
    TOK.save_pretrained(folder)
    text = "Ann\x00 lives in café\u0301 שלום 😀 " + " ".join(["Paris"] * 30)
    served = ServedModel("m", folder)
    pipe = bertlab.pipeline("tag", str(folder))
    (by_server,) = served.encode([text], "tokens", long="truncate", offsets=True)
    (by_pipeline,) = pipe._encode([text], "tokens", offsets=True)
    assert by_server == by_pipeline and by_server.truncated and served.max_length == 24
    page = build_payload(served.model, TOK, text, truncate=True)
    assert [t["id"] for t in page["tokens"]] == by_server.rows[0].input_ids
    assert [t["start"] for t in page["tokens"]][1:-1] == [a for a, _ in by_server.offsets][1:-1]
    assert json.dumps(page["text"]) == json.dumps(text)


LAYERS = {  # a package may not import these (not even inside a function)
    "pipelines": ("bertlab.serve", "bertlab.explore", "bertlab.cli", "bertlab.bench"),
    "serve": ("bertlab.explore", "bertlab.cli", "bertlab.bench", "bertlab.train"),
    "explore": ("bertlab.serve", "bertlab.cli", "bertlab.bench", "bertlab.train"),
    "data": ("bertlab.pipelines", "bertlab.serve", "bertlab.explore", "bertlab.cli"),
}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_point_down_only(package):
    for path in sorted((ROOT / "bertlab" / package).glob("*.py")):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith(LAYERS[package]), f"{path.name} imports {name}"
        assert len(path.read_text().splitlines()) <= 700, f"{path.name} is past one sitting"


def test_bertlab_predict_names_the_line_that_holds_an_invalid_text(tmp_path, capsys):
    from bertlab.cli.main import main
    from bertlab.pipelines.corpus import scan_input

    # a command-line argument that is not UTF-8 reaches Python as a lone surrogate (PEP 383)
    assert main(["predict", "embed", "fine", "a\udcffb"]) == 2
    err = capsys.readouterr().err
    assert "input line 2 holds an unpaired surrogate U+DCFF at character 1" in err
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"text": "ok"}\n{"text": "ok", "pair": "x\\ud800"}\n')  # JSON escapes
    with pytest.raises(ValueError, match=r'in.jsonl line 2 "pair" holds an unpaired surrogate'):
        scan_input(lines, 10)

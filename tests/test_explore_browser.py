"""The `bertlab explore` page in a real browser: headless Chromium (Debian's package), driven by
Playwright, with the network blocked. The pages are built through the Python API from a small
random BertForMaskedLM and from the bundled model; the tests read back what the page draws and
compare it with the payload the page was made from.

Set BERTLAB_CHROMIUM to use another Chromium binary; set BERTLAB_SCREENSHOTS to a folder to save a
screenshot of every view there (<view id>.png, the README's pictures)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
from itertools import pairwise
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("BERTLAB_CHROMIUM") or shutil.which("chromium")
if not CHROMIUM or not Path(CHROMIUM).exists():
    pytest.skip(
        (
            f"BERTLAB_CHROMIUM={CHROMIUM} does not exist"
            if CHROMIUM
            else "no Chromium found (BERTLAB_CHROMIUM is unset and `chromium` is not on PATH)"
        )
        + ": `apt-get install chromium` installs it; the browser tests of bertlab explore need it",
        allow_module_level=True,
    )
try:
    from playwright.sync_api import sync_playwright
except ImportError:
    pytest.skip(
        "the Python package playwright is not installed: `pip install -e .[test]` installs it "
        "(the browser itself comes from `apt-get install chromium`)",
        allow_module_level=True,
    )

import torch  # noqa: E402

import bertlab  # noqa: E402
from bertlab import BertConfig, BertForMaskedLM, BertTokenizer  # noqa: E402
from bertlab.explore.page import HEADLESS  # noqa: E402
from bertlab.explore.payload import unarray  # noqa: E402

FLAGS = [flag for flag in HEADLESS if flag != "--headless"]  # Playwright adds its own
PWN = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
# characters outside the Basic Multilingual Plane: one code point, two UTF-16 units each
EMOJI = "I love \U0001f355 and \U0001f389 parties"
EMOJI_PAIR = "Pizza \U0001f355\U0001f355 is great \U0001f600 indeed"


# ============================================================================ fixtures
@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer, 4-head masked-LM model (H 64) with the bundled tokenizer."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    tokenizer = BertTokenizer.from_pretrained(bertlab.bundled_model_dir())
    return BertForMaskedLM(config).eval(), tokenizer


@pytest.fixture(scope="module")
def pages(module_tmp, tiny):
    """The explorations the tests open, each saved as a file: name -> (Exploration, path)."""
    root = module_tmp.mktemp("explore")
    model, tok = tiny
    long_text = " ".join(f"word{k % 50} is here." for k in range(400))
    made = {
        "tiny": bertlab.explore(
            "The cat sat on the [MASK].", "It was warm.", model=model, tokenizer=tok
        ),
        "bundled": bertlab.explore(
            "Attention is all you need, they said.", "It was 2017.", model="default"
        ),
        "html": bertlab.explore(f"Hello {PWN} world", model=model, tokenizer=tok),
        "long": bertlab.explore(long_text, model="default", truncate=True),
        "emoji": bertlab.explore(EMOJI, EMOJI_PAIR, model=model, tokenizer=tok),
    }
    return {name: (ex, ex.save(root / f"{name}.html")) for name, ex in made.items()}


class Opened:
    """A page opened with every request but its own file refused; what it tried and logged."""

    def __init__(
        self, browser, path: Path | str, hash: str = "", ready: str | None = "#bertlab-title"
    ):
        self.url = path if isinstance(path, str) else path.resolve().as_uri()
        self.allowed = {self.url}
        self.page = browser.new_page(viewport={"width": 1200, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", self._seen)
        self.page.route("**/*", self._route)
        self.page.goto(self.url + hash)
        if ready:
            self.page.wait_for_selector(ready)

    def _seen(self, request) -> None:
        # data: URLs are the page's own exported pictures, not the network
        if request.url.split("#")[0] not in self.allowed and not request.url.startswith("data:"):
            self.requests.append(request.url)

    def _route(self, route) -> None:
        if route.request.url.split("#")[0] in self.allowed:
            route.continue_()
        else:
            route.abort()

    def clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def opened(browser):
    made: list[Opened] = []

    def open_(path: Path | str, hash: str = "", ready: str | None = "#bertlab-title") -> Opened:
        made.append(Opened(browser, path, hash, ready))
        return made[-1]

    yield open_
    for o in made:
        o.close()


def attention_of(payload: dict) -> dict:
    """layer, head -> (T, T) attention weights as stored (0 where a summarised row dropped it)."""
    stored = payload["layers"]["attention"]
    if "topk" not in stored:
        return unarray(stored)
    index, value = unarray(stored["index"]).long(), unarray(stored["value"])
    T = len(payload["tokens"])
    return torch.zeros(*index.shape[:3], T).scatter_(-1, index, value)


def click_pair(page, layer: int, head: int, i: int, j: int) -> dict:
    """Click head (layer, head) in the grid, then query i and key j in the head view: what #worked
    then shows."""
    page.click(f'#attention-grid .cell[data-layer="{layer}"][data-head="{head}"]')
    page.locator(f'#head-view text.tok[data-side="q"][data-i="{i}"]').click()
    page.locator(f'#head-view text.tok[data-side="k"][data-i="{j}"]').click()
    worked = page.locator("#worked")
    return {
        "at": [int(worked.get_attribute(f"data-{k}")) for k in ("layer", "head", "i", "j")],
        "weight": page.inner_text("#worked-weight"),
        "recomputed": float(page.inner_text("#worked-recomputed")),
    }


def check_drawn(o: Opened, payload: dict) -> None:
    """Every part of the page is there, in the numbers the payload says."""
    p = o.page
    m = payload["model"]
    assert p.locator("#view-tokens .chip").count() == len(payload["tokens"])
    assert p.locator("#attention-grid .cell").count() == m["layers"] * m["heads"]
    assert p.locator("#head-view .link").count() > 0
    assert p.locator("#layers-view").count() == 1
    assert p.locator("#param-table tr.param-row").count() > 0
    assert p.locator("#param-total").count() == 1
    assert p.locator("#graph .g-node").count() > 0
    assert p.locator("#head-output").count() == 1
    views = p.evaluate("BL.views.map(v => v.id)")
    assert {"tokens", "embeddings", "attention", "worked"} <= set(views)
    assert p.locator("section.view").count() == len(views)


# ============================================================================ tests
def test_the_page_draws_every_view_without_errors_or_requests(pages, opened):
    ex, path = pages["tiny"]
    o = opened(path)
    check_drawn(o, ex.payload)
    assert o.page.locator("#bertlab-notes").is_hidden()  # nothing summarised, nothing truncated
    # segment B's characters are in the shown text too, and each chip maps back to its characters
    text = o.page.inner_text("#view-tokens .text-shown")
    assert "The cat sat on the [MASK]." in text and "It was warm." in text
    cat = next(t for t in ex.payload["tokens"] if t["token"] == "cat")
    assert o.page.inner_text(f'#view-tokens .ch[data-i="{cat["i"]}"]') == "cat"
    # the page's own LayerNorm reproduces the embedding layer's output (reference 002)
    assert float(o.page.get_attribute("#embed-figure", "data-max-diff")) < 1e-5
    o.clean()


def test_the_bundled_model_page_draws_every_view(pages, opened):
    ex, path = pages["bundled"]
    o = opened(path)
    check_drawn(o, ex.payload)
    assert o.page.locator("#predictions").count() == (1 if ex.payload["predictions"] else 0)
    folder = os.environ.get("BERTLAB_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for view in o.page.evaluate("BL.views.map(v => v.id)"):
            o.page.locator(f"#view-{view}").screenshot(path=str(Path(folder) / f"{view}.png"))
    o.clean()


@pytest.mark.parametrize("name, layer, head, i, j", [("tiny", 1, 2, 2, 3), ("bundled", 4, 7, 3, 1)])
def test_the_worked_example_shows_the_models_weight(pages, opened, name, layer, head, i, j):
    ex, path = pages[name]
    o = opened(path)
    shown = click_pair(o.page, layer, head, i, j)
    assert shown["at"] == [layer, head, i, j]
    want = float(attention_of(ex.payload)[layer, head, i, j])
    assert abs(float(shown["weight"]) - want) <= 1e-7
    assert shown["weight"] == f"{want:.8f}"
    # q_i·k_j/√D + mask → softmax, recomputed on the page from the stored queries and keys
    assert abs(shown["recomputed"] - want) <= 1e-6
    o.clean()


def test_every_view_exports_a_png_and_an_svg(pages, opened):
    _, path = pages["tiny"]
    o = opened(path)
    for view in o.page.evaluate("BL.views.map(v => v.id)"):
        url = o.page.evaluate("id => BL.exportView(id, 'png')", view)
        assert url.startswith("data:image/png;base64,"), view
        png = base64.b64decode(url.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n", view
        assert len(png) > 1024, (view, len(png))
        svg = o.page.evaluate("id => BL.exportView(id, 'svg')", view)
        text = base64.b64decode(svg.split(",", 1)[1]).decode()
        assert svg.startswith("data:image/svg+xml") and text.startswith("<svg"), view
        assert "foreignObject" not in text, view
    o.clean()


def test_export_mode_writes_every_view_as_png(pages, opened):
    _, path = pages["tiny"]
    o = opened(path, "#export")
    o.page.wait_for_selector('body[data-exported="1"]', state="attached")
    out = json.loads(o.page.text_content("#bertlab-export"))
    assert set(out) == set(o.page.evaluate("BL.views.map(v => v.id)"))
    for view, url in out.items():
        assert url and base64.b64decode(url.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n", view
    o.clean()


def test_html_in_the_text_is_shown_as_text_and_never_run(pages, opened):
    ex, path = pages["html"]
    o = opened(path)
    assert PWN in o.page.inner_text("#view-tokens .text-shown")
    assert o.page.evaluate("typeof window.__pwned") == "undefined"
    assert o.page.locator("img").count() == 0
    assert o.page.locator("#view-tokens .chip").count() == len(ex.payload["tokens"])
    o.clean()


def test_a_512_token_input_is_summarised_and_stays_usable(pages, opened):
    ex, path = pages["long"]
    payload = ex.payload
    assert len(payload["tokens"]) == 512 and payload["truncated"] and payload["summarised"]
    o = opened(path)
    p = o.page
    notes = p.locator("#bertlab-notes")
    assert notes.is_visible()
    for sentence in payload["summarised"]:
        assert sentence in notes.inner_text()
    check_drawn(o, payload)
    # virtualised: only the rows in sight are drawn, and scrolling brings the last ones
    assert p.locator('#head-view text[data-side="q"]').count() < 100
    p.locator(".head-scroll").evaluate("e => e.scrollTop = e.scrollHeight")
    p.wait_for_selector('#head-view text[data-side="q"][data-i="511"]', state="attached")
    p.locator(".head-scroll").evaluate("e => e.scrollTop = 0")
    p.wait_for_selector('#head-view text[data-side="q"][data-i="5"]', state="attached")
    # a stored (top-k) weight, worked out from the stored queries and keys
    att = attention_of(payload)
    j = int(att[2, 3, 5].argmax())
    shown = click_pair(p, 2, 3, 5, j)
    assert abs(float(shown["weight"]) - float(att[2, 3, 5, j])) <= 1e-7
    half = payload["layers"]["query"]["dtype"] == "f16"  # float16 vectors: about 1e-3 off
    assert abs(shown["recomputed"] - float(att[2, 3, 5, j])) <= (1e-2 if half else 1e-6)
    o.clean()


def test_two_pages_embedded_in_one_document_both_render(pages, opened, tmp_path):
    a, _ = pages["tiny"]
    b, _ = pages["bundled"]
    doc = tmp_path / "notebook.html"
    doc.write_text(
        f"<!doctype html><html><body>{a._repr_html_()}{b._repr_html_()}</body></html>", "utf-8"
    )
    o = opened(doc, ready="iframe")
    frames = []
    for frame_el in o.page.locator("iframe").element_handles():
        frame = frame_el.content_frame()
        frame.wait_for_selector("#attention-grid .cell")
        frames.append(frame)
    assert len(frames) == 2
    for frame, ex in zip(frames, (a, b), strict=True):
        assert frame.locator("#view-tokens .chip").count() == len(ex.payload["tokens"])
        m = ex.payload["model"]
        assert frame.locator("#attention-grid .cell").count() == m["layers"] * m["heads"]
    o.clean()


def test_serve_mode_draws_a_new_sentence_and_shows_errors_as_text(opened):
    from bertlab.explore.serve import make_server

    server = make_server("default", "The first sentence.", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        o = opened(url)
        o.allowed.add(url + "api/explore")  # the one request serve mode makes, to its own server
        p = o.page
        p.fill("#explore-text", "A second, longer sentence arrives here.")
        p.fill("#explore-pair", "And a pair.")
        p.click("#explore-form button[type=submit]")
        # (wait_for_function would evaluate a string, which the page's CSP forbids)
        p.wait_for_selector("#view-tokens .text-shown >> text=A second")
        payload = p.evaluate("BL.payload")
        assert payload["pair"] == "And a pair."
        assert p.locator("#view-tokens .chip").count() == len(payload["tokens"])
        assert "A second, longer sentence arrives here." in p.inner_text("#view-tokens .text-shown")
        # a refused request: the server's message, as text; the page keeps what it shows
        p.fill("#explore-text", "")
        p.click("#explore-form button[type=submit]")
        p.wait_for_selector("#explore-error:not(:empty)")
        assert "empty" in p.inner_text("#explore-error")
        assert p.evaluate("BL.payload.text").startswith("A second")
        # the browser logs the 400 reply itself; nothing else may be logged
        o.errors = [e for e in o.errors if "status of 400" not in e]
        o.clean()
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_saves_every_view_as_png(tmp_path):
    """bertlab explore --png: the page's own export code, run in headless Chromium."""
    import subprocess
    import sys

    out = tmp_path / "views"
    done = subprocess.run(
        [sys.executable, "-m", "bertlab", "explore", "A [MASK] sat here.", "--png", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BERTLAB_CHROMIUM": CHROMIUM},
    )
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        f"{v}.png"
        for v in ("tokens", "embeddings", "attention", "worked", "layers", "parameters", "output")
    )
    for p in out.iterdir():
        data = p.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1024


def test_a_fully_summarised_payload_float16_and_top_k_draws_and_reconciles(
    opened, tiny, tmp_path, monkeypatch
):
    """The storage a long input of a large model gets (float16 vectors, top-k attention rows),
    forced on the small model: the page decodes float16 itself and its worked example agrees
    with the stored weight to float16's precision."""
    from bertlab.explore import payload as payload_module

    monkeypatch.setattr(payload_module, "VECTOR_BYTES", 0)
    monkeypatch.setattr(payload_module, "ATTENTION_BYTES", 0)
    model, tok = tiny
    ex = bertlab.explore("The cat sat on the [MASK].", "It was warm.", model=model, tokenizer=tok)
    layers = ex.payload["layers"]
    assert layers["hidden"]["dtype"] == "f16" and "topk" in layers["attention"]
    assert len(ex.payload["summarised"]) == 2
    o = opened(ex.save(tmp_path / "f16.html"))
    check_drawn(o, ex.payload)
    assert o.page.inner_text("#bertlab-notes").count("float16") == 1
    T = len(ex.payload["tokens"])
    top = int(unarray(layers["attention"]["index"])[1, 2, 2, 0])  # stored: the row's largest
    shown = click_pair(o.page, 1, 2, 2, top)
    stored = float(attention_of(ex.payload)[1, 2, 2, top])
    assert float(shown["weight"]) == pytest.approx(stored, abs=1e-8)
    assert shown["recomputed"] == pytest.approx(stored, abs=2e-3)
    assert T > top >= 0
    o.clean()


# ============================================================================ reading the page
def clip(text: str, n: int) -> str:
    """The page's BL.clip: the first n code points, the last replaced by "…" when some are cut."""
    return text if len(text) <= n else text[: n - 1] + "…"


def disjoint(a: dict, b: dict) -> bool:
    """Two getBoundingClientRect boxes that do not overlap (touching is allowed)."""
    return (
        a["right"] <= b["left"] + 0.5
        or b["right"] <= a["left"] + 0.5
        or a["bottom"] <= b["top"] + 0.5
        or b["bottom"] <= a["top"] + 0.5
    )


RECT = (
    "e => { const r = e.getBoundingClientRect(); "
    "return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; }"
)


def test_emoji_shift_no_highlight_and_are_never_cut_in_half(pages, opened):
    """The payload's offsets count code points (Python's str indices); an emoji is one code point
    but two UTF-16 units. Pointing at each token lights exactly text[start:end]."""
    ex, path = pages["emoji"]
    payload = ex.payload
    texts = {0: payload["text"], 1: payload["pair"]}
    cut = [t for t in payload["tokens"] if t["start"] is not None]

    def astral(text: str) -> bool:
        return any(ord(c) > 0xFFFF for c in text)

    on = [t for t in cut if astral(texts[t["segment"]][t["start"] : t["end"]])]
    after = [t for t in cut if astral(texts[t["segment"]][: t["start"]])]
    assert on and after, "the text must put tokens on and after emoji"
    assert {t["segment"] for t in after} == {0, 1}
    o = opened(path)
    p = o.page
    shown = p.inner_text("#view-tokens .text-shown")
    assert EMOJI in shown and EMOJI_PAIR in shown and "\ufffd" not in shown
    for t in cut:
        p.hover(f'#token-chips .chip[data-i="{t["i"]}"]')
        want = texts[t["segment"]][t["start"] : t["end"]]
        lit = p.locator("#view-tokens .text-shown .ch.hl")
        assert lit.count() == 1, t
        assert lit.inner_text() == want, (t, want)
        assert f'"{want}"' in p.inner_text("#token-detail"), t
    # the spans and the text between them rebuild each segment exactly
    lines = p.eval_on_selector_all(
        "#view-tokens .text-line",
        "ls => ls.map(l => Array.from(l.childNodes).slice(1).map(n => n.textContent).join(''))",
    )
    assert lines == [EMOJI, EMOJI_PAIR]
    o.clean()


def test_the_head_views_overview_returns_when_the_pointer_leaves_a_token(pages, opened):
    """Every row is drawn until a token is pointed at; its row alone while it is; every row again
    once the pointer leaves it, unless a click pinned it."""
    ex, path = pages["tiny"]
    T = len(ex.payload["tokens"])
    o = opened(path)
    p = o.page
    view = p.locator("#head-view")

    def rows() -> set[int]:
        return set(
            p.eval_on_selector_all(
                "#head-view .link:not(.sel)", "ls => ls.map(l => Number(l.dataset.i))"
            )
        )

    def away() -> None:
        p.hover("#view-attention h2")  # not a token

    pair_i = int(p.get_attribute("#worked", "data-i"))
    every = set(range(T)) - {pair_i}  # the pair's own line is drawn apart (.sel)
    assert view.get_attribute("data-shown") == "every row"
    assert rows() >= every
    for chip in (3, 5):
        p.hover(f'#token-chips .chip[data-i="{chip}"]')
        assert view.get_attribute("data-shown") == f"row {chip}"
        assert rows() == {chip}
        away()
        assert view.get_attribute("data-shown") == "every row"
        assert rows() >= every
    # the same from a token of the head view itself
    p.hover('#head-view text.tok[data-side="q"][data-i="2"]')
    assert view.get_attribute("data-shown") == "row 2"
    away()
    assert view.get_attribute("data-shown") == "every row"
    # a click pins the token: its row stays when the pointer leaves; other tokens do not take over
    p.click('#token-chips .chip[data-i="3"]')
    away()
    assert view.get_attribute("data-shown") == "row 3" and rows() == {3}
    p.hover('#token-chips .chip[data-i="5"]')
    away()
    assert view.get_attribute("data-shown") == "row 3" and rows() == {3}
    # a second click lets it go
    p.click('#token-chips .chip[data-i="3"]')
    away()
    assert view.get_attribute("data-shown") == "every row"
    assert rows() >= every
    o.clean()


def test_special_chips_show_their_segment(pages, opened):
    """[CLS] and the first [SEP] are segment A's, the [SEP] that ends the pair is B's."""
    ex, path = pages["tiny"]
    specials = [t for t in ex.payload["tokens"] if t["special"]]
    assert [t["token"] for t in specials] == ["[CLS]", "[SEP]", "[SEP]"]
    assert [t["segment"] for t in specials] == [0, 0, 1]
    o = opened(path)
    p = o.page
    edges = []
    for t, seg in zip(specials, "AAB", strict=True):
        chip = p.locator(f'#token-chips .chip[data-i="{t["i"]}"]')
        assert chip.get_attribute("data-segment") == seg
        assert chip.locator(".meta.seg").inner_text() == f"{seg} · special"
        edges.append(chip.evaluate("e => getComputedStyle(e).boxShadow"))
    # the segment's colour along the chip's edge: the same for A's two, another for B's
    assert edges[0] == edges[1] != edges[2] and "none" not in edges
    # the exported picture says it too
    svg = p.evaluate("() => BL.exportView('tokens', 'svg')")
    text = base64.b64decode(svg.split(",", 1)[1]).decode()
    last = specials[-1]
    assert f"{last['i']} · {last['id']} · B" in text
    o.clean()


@pytest.mark.parametrize("name", ["tiny", "bundled", "long"])
def test_the_worked_examples_score_bars_are_labelled_with_their_tokens(pages, opened, name):
    ex, path = pages[name]
    tokens = ex.payload["tokens"]
    o = opened(path)
    p = o.page
    got = p.eval_on_selector_all(
        "#worked svg.bars",
        f"""([s]) => {{
          const rect = {RECT};
          const bars = Array.from(s.querySelectorAll("rect.bar"),
            b => [Number(b.dataset.i), rect(b)]);
          const labels = Array.from(s.querySelectorAll("text.bar-label"),
            l => [Number(l.dataset.i), l.textContent, rect(l)]);
          return {{bars, labels}};
        }}""",
    )
    assert [i for i, _, _ in got["labels"]] == list(range(len(tokens)))
    assert [s for _, s, _ in got["labels"]] == [clip(t["token"], 12) for t in tokens]
    for (i, bar), (_, _, label) in zip(got["bars"], got["labels"], strict=True):
        middle = (label["left"] + label["right"]) / 2
        assert bar["left"] - 1 <= middle <= bar["right"] + 1, (i, bar, label)
        assert label["top"] >= bar["top"] - 0.5, i  # under the bars
    for (_, _, a), (_, _, b) in pairwise(got["labels"]):
        assert disjoint(a, b), (a, b)
    # a label is a token: pointing at it lights the token's chip
    p.locator('#worked svg.bars text.bar-label[data-i="2"]').hover()
    assert "hl" in p.get_attribute('#token-chips .chip[data-i="2"]', "class").split()
    o.clean()


@pytest.mark.parametrize("name", ["tiny", "bundled"])
def test_the_layer_charts_labels_never_overlap(pages, opened, name):
    """For every token: its label and "mean of tokens" at the lines' ends, and the values line
    under the chart's title, never cover one another and stay inside the chart."""
    ex, path = pages[name]
    o = opened(path)
    drawn = o.page.evaluate(
        f"""() => {{
          const rect = {RECT}, out = [];
          for (let i = 0; i < BL.payload.tokens.length; i++) {{
            BL.set({{token: i}});
            for (const s of document.querySelectorAll("#layers-view svg.bl-lines")) {{
              const r = c => rect(s.querySelector(c));
              out.push({{i, chart: rect(s), focus: r(".bl-focus-label"), mean: r(".bl-mean-label"),
                note: r(".bl-focus-note"), title: r(".bl-title")}});
            }}
          }}
          return out;
        }}"""
    )
    assert len(drawn) == 2 * len(ex.payload["tokens"])
    for d in drawn:
        assert disjoint(d["focus"], d["mean"]), d
        assert disjoint(d["note"], d["title"]), d
        for part in ("focus", "mean", "note", "title"):
            box = d[part]
            inside = d["chart"]["left"] <= box["left"] and box["right"] <= d["chart"]["right"] + 0.5
            assert inside, (part, d)
    o.clean()


def test_the_position_tables_keep_every_cell_and_label_their_axes(pages, opened):
    """The tables: every one of their first positions as columns, dimensions spread over H as rows,
    each a whole number of pixels: every pixel is the colour of its own (position, dimension) value,
    none blended or skipped (a sinusoid's shortest wave is about 6 positions long). The axes are
    titled and ticked with the positions and dimensions shown."""
    ex, path = pages["bundled"]
    stored = ex.payload["embeddings"]["positions"]
    shown = unarray(stored["index"]).tolist()
    rows = unarray(stored["table_index"]).tolist()
    dims = unarray(stored["dims"]).tolist()
    H, P = ex.payload["model"]["hidden"], ex.payload["model"]["max_positions"]
    assert rows == list(range(min(P, 128)))  # every position, none skipped
    assert dims[0] == 0 and dims[-1] >= H - H // 64 and len(dims) == 64  # spread over all of H
    o = opened(path)
    p = o.page
    canvas = p.locator("#positions-canvas")
    axes = json.loads(canvas.get_attribute("data-axes"))
    assert [panel["title"].split()[0] for panel in axes["panels"]] == ["learned", "sinusoidal"]
    ticks = axes["position_ticks"]
    assert ticks[0] == shown[0] and ticks[-1] == shown[-1] and set(ticks) <= set(shown)
    assert len(ticks) >= 3
    table_ticks = axes["table_position_ticks"]
    assert table_ticks[0] == 0 and table_ticks[-1] == rows[-1] and set(table_ticks) <= set(rows)
    assert axes["dimension_ticks"][0] == 0 and axes["dimension_ticks"][-1] == dims[-1]
    assert set(axes["dimension_ticks"]) <= set(dims)
    for panel in axes["panels"]:
        sim, table = panel["similarity"], panel["table"]
        assert (sim["x_axis"], sim["y_axis"]) == ("position", "position")
        assert (table["x_axis"], table["y_axis"]) == ("position", "dimension")
        assert table["cols"] == len(rows) and table["rows"] == len(dims)
        assert table["cw"] >= 1 and table["ch"] >= 2
        assert table["cols"] * table["cw"] <= sim["size"]  # under the matrix, no wider
        # colours saturate at the 98th percentile of |value| (a few outliers do not wash it out)
        values = unarray(stored[panel["title"].split()[0].replace("sinusoidal", "sinusoid")])
        magnitudes = values.abs().flatten().sort().values
        want = float(magnitudes[int(0.98 * len(magnitudes))])
        assert table["scale"] == pytest.approx(want, rel=1e-6)
    # drawn at its own size: the browser does not rescale the canvas either
    assert canvas.evaluate("c => [c.clientWidth, c.clientHeight]") == canvas.evaluate(
        "c => [c.width, c.height]"
    )
    wrong = canvas.evaluate(
        """cv => {
          const ax = JSON.parse(cv.dataset.axes), ctx = cv.getContext("2d");
          const Pp = BL.payload.embeddings.positions;
          return ax.panels.map(panel => {
            const t = panel.table;
            const a = BL.arr(panel.title.startsWith("learned") ? Pp.learned : Pp.sinusoid);
            const n = a.shape[1], m = t.scale;
            const w = t.cols * t.cw, h = t.rows * t.ch, px = ctx.getImageData(t.x, t.y, w, h).data;
            let bad = 0;
            for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
              const v = a.data[Math.floor(x / t.cw) * n + Math.floor(y / t.ch)];
              const want = BL.divergingRGB(v, m);
              const o = (y * w + x) * 4;
              if ([0, 1, 2].some(c => Math.abs(px[o + c] - want[c]) > 1)) bad++;
            }
            return bad;
          });
        }"""
    )
    assert wrong == [0, 0]
    o.clean()


def test_the_attention_thumbnails_are_legible_and_tell_heads_apart(pages, opened):
    """Each thumbnail is large enough to see a token's cell, inked enough to see its structure,
    and the darkness of its cells follows the head: the head that looks most at [CLS]/[SEP] and
    the head that looks most at the neighbours draw different pictures."""
    ex, path = pages["bundled"]
    payload = ex.payload
    att = attention_of(payload)  # (L, A, T, T)
    L, A, T = att.shape[0], att.shape[1], att.shape[2]
    special = torch.tensor([t["special"] for t in payload["tokens"]])
    near = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs() <= 1
    o = opened(path)
    p = o.page
    # darkness (1 - mean of r, g, b / 255) at the centre of every token's cell of every thumbnail
    seen = p.eval_on_selector_all(
        "#attention-grid canvas.cell",
        """cs => cs.map(c => {
          const T = BL.payload.tokens.length, cell = c.width / T, px = c.getContext("2d")
            .getImageData(0, 0, c.width, c.height).data, dark = [];
          for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
            const y = Math.floor(i * cell + cell / 2), x = Math.floor(j * cell + cell / 2);
            const o = (y * c.width + x) * 4;
            dark.push(1 - (px[o] + px[o + 1] + px[o + 2]) / 765);
          }
          return {layer: Number(c.dataset.layer), head: Number(c.dataset.head),
            shown: c.clientWidth, width: c.width, dark};
        })""",
    )
    assert len(seen) == L * A
    dark = torch.zeros(L, A, T, T)
    for s in seen:
        assert s["width"] >= 60 and s["width"] % T == 0, s  # T <= the thumbnail: whole cells
        assert s["shown"] == s["width"], s  # shown at its own size, not rescaled
        dark[s["layer"], s["head"]] = torch.tensor(s["dark"]).view(T, T)
    # the darkest cell is the head's largest weight (row = query, column = key)
    flat, inked = att.flatten(2), dark.flatten(2)
    at_top = inked.gather(-1, flat.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.equal(at_top, inked.max(-1).values)
    # ink: a weight a tenth of its head's largest is still clearly coloured, so that most heads
    # show more than their one largest cell
    tenth = (att / flat.max(-1).values[..., None, None] - 0.1).abs() < 0.03
    assert tenth.any() and float(dark[tenth].mean()) >= 0.15
    # the shares of ink on the special columns and on the diagonal band follow the weights
    share_sp = att[..., special].sum((-1, -2)) / att.sum((-1, -2))
    share_near = (att * (near & ~special[None, :])).sum((-1, -2)) / att.sum((-1, -2))
    ink_sp = dark[..., special].sum((-1, -2)) / dark.sum((-1, -2))
    ink_near = (dark * (near & ~special[None, :])).sum((-1, -2)) / dark.sum((-1, -2))
    a = divmod(int(share_sp.argmax()), A)  # the head most on [CLS]/[SEP]
    b = divmod(int(share_near.argmax()), A)  # the head most on the neighbours
    assert a != b
    assert ink_sp[a] > ink_sp[b] + 0.1 and ink_near[b] > ink_near[a] + 0.1, (a, b)
    o.clean()

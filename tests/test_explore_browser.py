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
def pages(tmp_path_factory, tiny):
    """The explorations the tests open, each saved as a file: name -> (Exploration, path)."""
    root = tmp_path_factory.mktemp("explore")
    model, tok = tiny
    long_text = " ".join(f"word{k % 50} is here." for k in range(400))
    made = {
        "tiny": bertlab.explore(
            "The cat sat on the [MASK].", "It was warm.", model=model, tokenizer=tok
        ),
        "bundled": bertlab.explore("Attention is all you need, they said.", model="default"),
        "html": bertlab.explore(f"Hello {PWN} world", model=model, tokenizer=tok),
        "long": bertlab.explore(long_text, model="default", truncate=True),
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

"""The page: a payload (payload.py) and the scripts and styles of ``static/`` assembled into one
self-contained HTML file, with nothing fetched from anywhere; ``explore()`` is the Python API.

``static/page.html`` holds three markers that are replaced here: the styles, the scripts (in
``SCRIPTS`` order) and the data (the payload and the page's mode, as JSON in script elements
whose text cannot close them).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from bertlab.explore.payload import build_payload, unarray
from bertlab.files import atomic_write, resolve_model_dir
from bertlab.nn.config import read_config_dict
from bertlab.nn.heads import HEADS, head_of
from bertlab.nn.model import BertPreTrainedModel

SCRIPTS = ("core.js", "views_input.js", "views_attention.js", "views_model.js", "boot.js")
# Chromium's names on Debian, Ubuntu and elsewhere, for --png
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@cache
def _static(name: str) -> str:
    return resources.files("bertlab.explore").joinpath("static", name).read_text("utf-8")


def script_json(data: Any) -> str:
    """JSON that is safe inside a <script> element: no character of it can end the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for ch in ("<", ">", "&", "\u2028", "\u2029"):
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def render_html(payload: dict[str, Any], mode: dict[str, Any] | None = None) -> str:
    """The whole page for ``payload``. ``mode``: {"serve": bool, "layer": n, "head": n}."""
    mode = {"serve": False, **(mode or {})}
    data = (
        f'<script type="application/json" id="bertlab-payload">{script_json(payload)}</script>\n'
        f'<script type="application/json" id="bertlab-mode">{script_json(mode)}</script>'
    )
    scripts = "\n".join(_static(name) for name in SCRIPTS)
    page = _static("page.html")
    for marker, text in (
        ("/*BERTLAB_CSS*/", _static("page.css")),
        ("/*BERTLAB_JS*/", scripts.replace("</script", "<\\/script")),
        ("<!--BERTLAB_DATA-->", data),
    ):
        head, sep, tail = page.partition(marker)
        if not sep:
            raise RuntimeError(f"static/page.html has lost its {marker} marker")
        page = head + text + tail
    return page


@dataclass
class Exploration:
    """One sentence through one model: the payload, and the page that shows it.

    In a Jupyter notebook it shows itself inline (each in its own frame, so several per notebook
    do not meet). ``save(path)`` writes the page; ``attention(layer, head)`` and ``hidden(layer)``
    give the payload's numbers as tensors."""

    payload: dict[str, Any]
    layer: int = 0
    head: int = 0
    mode: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_layer_head(self.payload["model"], self.layer, self.head)

    def html(self) -> str:
        return render_html(self.payload, {"layer": self.layer, "head": self.head, **self.mode})

    def save(self, path: str | os.PathLike) -> Path:
        """Write the page to ``path`` (its folder must exist); returns the path."""
        target = check_output_path(path)
        text = self.html()
        atomic_write(target, lambda tmp: Path(tmp).write_text(text, "utf-8"))
        return target

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" '
            'style="width: 100%; height: 820px; border: 1px solid #ccc" '
            'title="bertlab explore"></iframe>'
        )

    @property
    def tokens(self) -> list[str]:
        return [t["token"] for t in self.payload["tokens"]]

    def attention(self, layer: int, head: int) -> torch.Tensor:
        """The attention probabilities of one head, (T, T): row = query, column = key (when the
        payload summarised them, the weights it did not keep are 0)."""
        check_layer_head(self.payload["model"], layer, head)
        stored = self.payload["layers"]["attention"]
        if "topk" not in stored:
            return unarray(stored)[layer, head]
        index, value = unarray(stored["index"])[layer, head], unarray(stored["value"])[layer, head]
        T = index.shape[0]
        return torch.zeros(T, T).scatter_(1, index, value)

    def hidden(self, layer: int) -> torch.Tensor:
        """The hidden states after ``layer`` (0 = the embedding layer's output), (T, H)."""
        L = self.payload["model"]["layers"]
        if not 0 <= layer <= L:
            raise IndexError(f"layer {layer} is out of range: hidden states go from 0 to {L}")
        return unarray(self.payload["layers"]["hidden"])[layer]

    def save_png(self, folder: str | os.PathLike, browser: str | None = None) -> list[Path]:
        """Every view as ``folder/<view>.png``, drawn by the page itself in headless Chromium."""
        return export_png(self.html(), folder, browser)


def explore(
    text: str,
    pair: str | None = None,
    *,
    model: str | os.PathLike | BertPreTrainedModel = "default",
    tokenizer: Any = None,
    head: str | None = None,
    truncate: bool = False,
    layer: int = 0,
    attention_head: int = 0,
) -> Exploration:
    """Run ``text`` (and ``pair``, segment B) through a model and return the page that shows it.

    ``model``: a model folder, "default" for the bundled model, or a model object (then
    ``tokenizer`` is needed). ``head``: which of ``bertlab.nn.heads.HEADS`` to load a folder
    as (default: the one its config.json names). ``truncate``: keep the first positions of an
    input longer than the model reads, instead of refusing it. ``layer``, ``attention_head``:
    the head the page opens on.
    """
    model, tokenizer, path = load(model, tokenizer, head)
    check_layer_head(
        {"layers": model.config.num_hidden_layers, "heads": model.config.num_attention_heads},
        layer,
        attention_head,
    )
    payload = build_payload(model, tokenizer, text, pair, truncate=truncate, path=path)
    return Exploration(payload, layer, attention_head)


def load(
    model: str | os.PathLike | BertPreTrainedModel, tokenizer: Any, head: str | None
) -> tuple[BertPreTrainedModel, Any, str | None]:
    """A model with its tokenizer, and the folder they came from (None for a model object)."""
    from bertlab.tokenizer import BertTokenizer

    if head is not None and head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    if isinstance(model, BertPreTrainedModel):
        if tokenizer is None:
            raise TypeError("explore() got a model object without its tokenizer: pass tokenizer=")
        return model, tokenizer, None
    folder = resolve_model_dir(model)
    config = read_config_dict(folder)
    cls = HEADS[head or head_of(config.get("architectures"))]
    loaded = cls.from_pretrained(folder, dtype=torch.float32)
    if tokenizer is None:
        tokenizer = BertTokenizer.from_pretrained(folder)
    return loaded, tokenizer, str(folder)


def check_layer_head(model: dict[str, Any], layer: int, head: int) -> None:
    L, A = model["layers"], model["heads"]
    if not 0 <= layer < L:
        raise IndexError(f"layer {layer} is out of range: this model has layers 0 to {L - 1}")
    if not 0 <= head < A:
        raise IndexError(
            f"attention head {head} is out of range: each layer has heads 0 to {A - 1}"
        )


def check_output_path(path: str | os.PathLike) -> Path:
    """``path`` as a file to write: its folder must exist and it must not be a folder."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder; give a file name such as page.html")
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"cannot write {target}: the folder {target.parent} does not exist (create it first)"
        )
    return target


def check_png_folder(folder: str | os.PathLike) -> Path:
    """``folder`` as a place for PNGs: a folder, or a new one in a folder that exists."""
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file; --png needs a folder")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"cannot write into {out}: the folder {out.parent} does not exist")
    return out


def find_browser(browser: str | None = None) -> str:
    """The Chromium (or Chrome) to draw PNGs with: ``browser``, $BERTLAB_CHROMIUM, or PATH."""
    wanted = browser or os.environ.get("BERTLAB_CHROMIUM")
    if wanted:
        found = shutil.which(wanted)
        if found is None:
            raise FileNotFoundError(f"no browser at {wanted!r} (from --browser / BERTLAB_CHROMIUM)")
        return found
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(
        "saving PNGs needs Chromium or Chrome, and none was found on PATH (looked for "
        f"{', '.join(BROWSERS)}): install one (Debian: apt-get install chromium) or name it "
        "with --browser / BERTLAB_CHROMIUM"
    )


def export_png(
    page: str, folder: str | os.PathLike, browser: str | None = None, timeout: float = 120
) -> list[Path]:
    """Open ``page`` in headless Chromium in its export mode (the page draws every view as a
    PNG with the same code as its PNG buttons) and write the PNGs into ``folder``."""
    import base64

    exe = find_browser(browser)
    out = check_png_folder(folder)
    with tempfile.TemporaryDirectory(prefix="bertlab-explore-") as tmp:
        page_file = Path(tmp, "page.html")
        page_file.write_text(page, "utf-8")
        command = [
            exe,
            *HEADLESS,
            f"--user-data-dir={tmp}/profile",
            "--virtual-time-budget=60000",
            "--dump-dom",
            page_file.as_uri() + "#export",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    start = done.stdout.rfind('<pre id="bertlab-export"')  # appended last to <body>
    if done.returncode != 0 or start < 0:
        raise RuntimeError(
            f"{exe} did not draw the views (exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    body = done.stdout[done.stdout.index(">", start) + 1 : done.stdout.index("</pre>", start)]
    images = json.loads(html.unescape(body))
    prefix = "data:image/png;base64,"
    missing = [view for view, url in images.items() if not (url or "").startswith(prefix)]
    if missing:
        raise RuntimeError(f"the page drew no PNG for the views {missing}")
    out.mkdir(exist_ok=True)
    written = []
    for view, url in images.items():
        target = out / f"{view}.png"
        data = base64.b64decode(url[len(prefix) :])
        atomic_write(target, lambda tmp, data=data: Path(tmp).write_bytes(data))
        written.append(target)
    return written

"""``bertlab explore TEXT -o page.html``: one sentence through a model, as a self-contained page
of every layer and head (``--png DIR`` saves each view as a PNG, ``--serve`` serves the page
with a text box). The work is ``bertlab.explore``; this file parses, checks and prints.
"""

from __future__ import annotations

import argparse

from bertlab.nn.heads import HEADS

DEFAULT_TEXT = "The cat sat on the [MASK] because it was warm."


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``explore`` to the ``bertlab`` command."""
    p = subparsers.add_parser(
        "explore",
        help="a page that shows what the model does to a sentence, layer by layer",
        description=(
            "Run TEXT (and --pair, segment B) through a model and write one self-contained HTML "
            "file (no network request of any kind) showing the tokens, the embedding sum and "
            "its LayerNorm, every layer's and head's attention with the worked q·k arithmetic, "
            "how each token's vector changes through the layers, the masked-LM predictions at "
            "every layer, the parameter table and the network graph. Every number comes from "
            "the model's own forward pass."
        ),
    )
    p.add_argument("text", nargs="?", help="the sentence (segment A)")
    p.add_argument("--pair", help="a second sentence (segment B)")
    p.add_argument("--model", default="default", help="a model folder (default: the bundled one)")
    p.add_argument(
        "--head",
        choices=list(HEADS),
        help="load the folder with this head (default: the one its config.json names)",
    )
    p.add_argument("-o", "--output", help="the HTML file to write")
    p.add_argument("--png", metavar="DIR", help="also save every view as DIR/<view>.png")
    p.add_argument("--browser", help="the Chromium or Chrome that draws the PNGs (default: PATH)")
    p.add_argument(
        "--truncate",
        action="store_true",
        help="keep the first positions of an input longer than the model reads (the page says so)",
    )
    p.add_argument("--layer", type=int, default=0, help="the layer the page opens on")
    p.add_argument("--attention-head", type=int, default=0, help="the head the page opens on")
    p.add_argument("--serve", action="store_true", help="serve the page with a text box")
    p.add_argument("--host", default="127.0.0.1", help="--serve: the address (default: loopback)")
    p.add_argument("--port", type=int, default=8765, help="--serve: the port (default 8765)")
    p.set_defaults(func=cmd_explore)


def cmd_explore(args: argparse.Namespace) -> int:
    from bertlab.explore.page import check_output_path, check_png_folder, explore, find_browser

    if not (args.output or args.png or args.serve):
        raise ValueError("say where the page goes: -o page.html, --png DIR, or --serve")
    if args.serve and (args.output or args.png):
        raise ValueError("--serve serves the page; it does not combine with -o or --png")
    if args.text is None and not args.serve:
        raise ValueError("give the sentence to explore: bertlab explore 'TEXT' -o page.html")
    if args.output:
        check_output_path(args.output)
    if args.png:
        check_png_folder(args.png)
        find_browser(args.browser)
    if args.serve:
        from bertlab.explore.serve import serve

        return serve(
            args.model,
            args.text or DEFAULT_TEXT,
            pair=args.pair,
            head=args.head,
            host=args.host,
            port=args.port,
        )
    page = explore(
        args.text,
        args.pair,
        model=args.model,
        head=args.head,
        truncate=args.truncate,
        layer=args.layer,
        attention_head=args.attention_head,
    )
    m = page.payload["model"]
    print(
        f"{len(page.tokens)} tokens through {m['name']} ({m['class']}: {m['layers']} layers × "
        f"{m['heads']} heads, hidden {m['hidden']})"
    )
    for note in page.payload["summarised"]:
        print(f"  {note}")
    if args.output:
        target = page.save(args.output)
        print(f"wrote {target} ({target.stat().st_size / 2**20:.1f} MB, opens offline)")
    if args.png:
        for path in page.save_png(args.png, args.browser):
            print(f"wrote {path}")
    return 0

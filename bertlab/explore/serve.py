"""``bertlab explore --serve``: the explore page on a local port, with a text box. The page posts
``{"text", "pair", "truncate"}`` to ``/api/explore`` and draws the payload it gets back.

Python's own HTTP server, one model, one forward pass at a time: a tool for one person at a
desk, bound to loopback by default (the HTTP inference server is another matter). A bad request
gets a 4xx with ``{"error": "..."}``, never a 5xx.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bertlab.explore.page import load, render_html
from bertlab.explore.payload import build_payload

MAX_BODY = 256 * 1024  # bytes of a request: far more than 512 tokens of text


class Explorer:
    """The model, its tokenizer and a lock: payloads one at a time."""

    def __init__(self, model: Any, head: str | None = None) -> None:
        self.model, self.tokenizer, self.path = load(model, None, head)
        self.lock = threading.Lock()

    def payload(self, text: Any, pair: Any = None, truncate: bool = False) -> dict[str, Any]:
        with self.lock:
            return build_payload(
                self.model, self.tokenizer, text, pair, truncate=truncate, path=self.path
            )


def make_handler(explorer: Explorer, first: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    page = render_html(first, {"serve": True}).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per error
            pass

        def send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def error(self, status: int, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send(status, body, "application/json")

        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/", "/index.html"):
                self.send(200, page, "text/html; charset=utf-8")
            else:
                self.error(404, f"no page at {self.path}; the explorer is at /")

        def do_POST(self) -> None:
            if self.path != "/api/explore":
                self.error(404, f"nothing to post to at {self.path}; post to /api/explore")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self.error(400, "the request needs a Content-Length of 0 or more bytes")
                return
            if length > MAX_BODY:
                self.error(413, f"the request is {length} bytes; the limit is {MAX_BODY}")
                return
            try:
                request = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                self.error(400, f"the request is not JSON: {e}")
                return
            if not isinstance(request, dict) or "text" not in request:
                self.error(
                    400, 'expected a JSON object {"text": ..., "pair": ..., "truncate": ...}'
                )
                return
            try:
                payload = explorer.payload(
                    request["text"], request.get("pair") or None, bool(request.get("truncate"))
                )
            except (ValueError, TypeError) as e:
                self.error(400, str(e))
                return
            self.send(200, json.dumps(payload).encode(), "application/json")

    return Handler


def make_server(
    model: Any,
    text: str,
    pair: str | None = None,
    head: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
) -> ThreadingHTTPServer:
    """The server, bound and ready (``serve_forever()`` runs it); port 0 picks a free one."""
    explorer = Explorer(model, head)
    first = explorer.payload(text, pair)
    try:
        return ThreadingHTTPServer((host, port), make_handler(explorer, first))
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from e


def serve(
    model: Any,
    text: str,
    pair: str | None = None,
    head: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
) -> int:
    server = make_server(model, text, pair, head, host, port)
    print(f"bertlab explore: http://{host}:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

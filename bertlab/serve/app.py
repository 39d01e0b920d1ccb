"""The HTTP side: a Starlette application over the served models (``Server.app()``).

Every POST route runs the same steps (``Server._handle``): the API key (``Authorization: Bearer
KEY``, the scheme in any case; 401 without it or without the scheme, 403 for a wrong key), the
concurrency limit (429 past ``max_concurrent_requests``, with ``Retry-After``), the body (413
past ``payload_limit``, 400 for invalid UTF-8 or JSON), the model (the ``model`` field or query
parameter; 404 for an unknown name, 422 for a model whose head does not serve the route), then
the route itself (``routes.py``). A bad request is a 4xx whose JSON body names the field and the
problem: ``{"error": ..., "error_type": ..., "field": ...}``; an input the pipelines' front half
refuses (``InputError``) is one too. A model that fails inside a batch fails that batch's
requests with a 500 saying so; the server goes on. A client that leaves is a 499 in /metrics:
before its body was read (logged on one line), or while its request waited for a batch.

Responses carry their timings in milliseconds, as TEI's do: ``x-tokenization-time``,
``x-queue-time`` (waiting for a batch), ``x-inference-time``, ``x-total-time``; and
``x-compute-tokens``. A client that disconnects while its request waits for a batch is dropped
before its rows are computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from bertlab.nn.compiled import Compiled
from bertlab.pipelines.text import InputError
from bertlab.serve import fields as F
from bertlab.serve.engine import (
    Batcher,
    Job,
    Limits,
    ModelFailed,
    RequestError,
    Row,
    ServedModel,
    calibration_texts,
    check_precision,
)
from bertlab.serve.metrics import Metrics
from bertlab.serve.routes import EVERY_MODEL, ROUTES

try:  # the serve extra's fast JSON writer; the standard library's where it is missing
    import orjson
except ImportError:  # pragma: no cover - the serve extra installs it
    orjson = None

logger = logging.getLogger("bertlab.serve")
OPEN = ("/health",)  # answered without the API key
RETRY_AFTER = 1  # seconds: what a 429 asks a client to wait (batches take milliseconds)


@dataclass
class ServeConfig:
    """``bertlab serve``'s settings; ``models``: (name, folder) pairs."""

    models: list[tuple[str, str | Path]]
    max_concurrent_requests: int = 512
    max_batch_tokens: int = 16384
    max_batch_sequences: int = 256
    max_wait_ms: float = 5.0
    max_client_batch_size: int = 32
    payload_limit: int = 2_000_000  # bytes
    api_key: str | None = None
    dtype: str = "float32"  # float32, bfloat16 or int8
    calibration: str | Path | None = None  # int8: a file of calibration texts, one per line
    compile: bool = False  # run batches through a compiled graph (float32, int8)
    tokenizer_workers: int = 2
    names: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("bertlab serve needs at least one model folder")
        for name in (
            "max_concurrent_requests",
            "max_batch_tokens",
            "max_batch_sequences",
            "max_client_batch_size",
            "payload_limit",
            "tokenizer_workers",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(f"max_wait_ms must be in [0, 1000], got {self.max_wait_ms}")
        check_precision(self.dtype, self.compile)
        if self.calibration is not None and self.dtype != "int8":
            raise ValueError(f"a calibration file is read for int8 only; dtype is {self.dtype}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key is empty: give a key, or none for an open server")
        self.names = [n for n, _ in self.models]
        twice = sorted({n for n in self.names if self.names.count(n) > 1})
        if twice:
            raise ValueError(f"two models are named {', '.join(twice)}: name them NAME=FOLDER")


class ClientGone(Exception):
    """The client disconnected before its rows were computed."""


class RequestContext:
    """One request's view of the server (``routes.Context``), keeping its timings."""

    def __init__(self, server: Server, request: Request):
        self.server, self.request = server, request
        self.max_client_batch_size = server.config.max_client_batch_size
        self.tokenizing = 0.0
        self.queued = 0.0
        self.inference = 0.0

    async def thread(self, fn: Any, *args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.server.pool, functools.partial(fn, *args, **kw))
        finally:
            self.tokenizing += time.perf_counter() - start

    async def _gone(self) -> None:
        while (await self.request.receive())["type"] != "http.disconnect":
            pass

    async def compute(self, model: ServedModel, rows: list[Row], finish: Any = None) -> Any:
        job = Job(rows, asyncio.get_running_loop(), finish)
        self.server.batchers[model.name].submit(job)
        watcher = asyncio.ensure_future(self._gone())
        try:
            await asyncio.wait({job.future, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.future.done():
            job.cancelled = True
            raise ClientGone
        if job.started is not None and job.finished is not None:
            self.queued += job.started - job.queued
            self.inference += job.finished - job.started
        return job.future.result()

    def headers(self, start: float) -> dict[str, str]:
        ms = lambda s: f"{1000 * s:.3f}"  # noqa: E731
        return {
            "x-tokenization-time": ms(self.tokenizing),
            "x-queue-time": ms(self.queued),
            "x-inference-time": ms(self.inference),
            "x-total-time": ms(time.perf_counter() - start),
        }


class JSON(JSONResponse):
    """A JSON answer that may hold numpy arrays (the vectors). orjson writes them directly, each
    float32 in its shortest exact form, more than ten times faster and in about 40% fewer bytes
    than ``json`` (tolist(), float64 forms), which runs on the event loop.
    Without orjson, ``json`` writes them the slow way. Either way a client reads the exact
    float32 values back."""

    def render(self, content: Any) -> bytes:
        if orjson is not None:
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
        text = json.dumps(content, separators=(",", ":"), allow_nan=False, default=_plain)
        return text.encode("utf-8")


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


class ErrorJSON(JSONResponse):
    """An error's JSON, written in ASCII: a message may quote what the client sent, and
    ``\\uXXXX`` escapes carry any code point (an unpaired surrogate among them) that UTF-8
    cannot."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def error(
    status: int,
    message: str,
    field: str | None = None,
    kind: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    kinds = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
    kinds |= {405: "method_not_allowed", 413: "payload_too_large", 422: "validation"}
    kinds |= {429: "overloaded", 500: "backend", 503: "unavailable"}
    body = {"error": message, "error_type": kind or kinds.get(status, "error"), "field": field}
    if status == 429:
        headers = {"Retry-After": str(RETRY_AFTER), **(headers or {})}
    return ErrorJSON(body, status_code=status, headers=headers)


class Server:
    """The models, their batchers and the app. ``close()`` finishes queued work."""

    def __init__(self, config: ServeConfig):
        self.config = config
        calibration = calibration_texts(config.calibration) if config.dtype == "int8" else None
        if config.compile and (why := Compiled.available()) is not None:
            raise RuntimeError(f"--compile: {why}")
        self.batchers: dict[str, Batcher] = {}
        self.inflight = 0  # requests admitted (past the limits) and not yet answered
        self.metrics = Metrics(
            lambda: {n: b.waiting() for n, b in self.batchers.items()}, lambda: self.inflight
        )
        limits = Limits(
            config.max_batch_tokens, config.max_batch_sequences, config.max_wait_ms / 1e3
        )
        for name, folder in config.models:  # each loaded in its batcher's runner thread
            load = functools.partial(
                ServedModel, name, folder, config.dtype, calibration, config.compile
            )
            self.batchers[name] = Batcher(load, limits, functools.partial(self.metrics.batch, name))
        self.models = {name: b.model for name, b in self.batchers.items()}
        self.pool = ThreadPoolExecutor(config.tokenizer_workers, thread_name_prefix="tokenize")
        self.closing = False

    # ------------------------------------------------------------------ steps
    def _authorize(self, request: Request) -> None:
        """``Authorization: Bearer KEY``, the scheme in any case (RFC 9110 makes it
        case-insensitive): 401 without the header or without the scheme, 403 for another key.
        The key is compared in constant time and never echoed."""
        key = self.config.api_key
        if key is None or request.url.path in OPEN:
            return
        given = request.headers.get("authorization", "").strip()
        if not given:
            raise RequestError(401, None, "this server needs an API key: Authorization: Bearer KEY")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise RequestError(
                401,
                None,
                "the Authorization header must name the Bearer scheme before the key: "
                "Authorization: Bearer <key>",
            )
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise RequestError(403, None, "the API key is not this server's")

    async def _json(self, request: Request) -> dict[str, Any]:
        limit = self.config.payload_limit
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, None, f"the body has {declared} bytes; the limit is {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, None, f"the body passes the limit of {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise RequestError(400, None, "the body is empty: send a JSON object")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(400, None, f"the body is not UTF-8 (byte {e.start})") from e

        def constant(name: str) -> None:
            raise ValueError(f"{name} is not a JSON number")

        try:
            data = json.loads(text, parse_constant=constant)
        except json.JSONDecodeError as e:
            raise RequestError(
                400, None, f"the body is not JSON: {e.msg} at line {e.lineno}, column {e.colno}"
            ) from e
        except (ValueError, RecursionError) as e:
            raise RequestError(400, None, f"the body is not usable JSON: {e}") from e
        return F.body(data)

    def _model(self, route: str, data: dict[str, Any], request: Request) -> ServedModel:
        name = data.get("model", request.query_params.get("model"))
        serves = lambda m: route in m.routes or route in EVERY_MODEL  # noqa: E731
        if name is not None:
            if not isinstance(name, str):
                raise RequestError(422, "model", "model must be a string")
            if name not in self.models:
                names = ", ".join(self.models)
                raise RequestError(404, "model", f"unknown model {name!r}; this server has {names}")
            m = self.models[name]
            if not serves(m):
                raise RequestError(
                    422,
                    "model",
                    f"model {name!r} has a {m.head} head, which does not serve /{route}; it "
                    f"serves {', '.join('/' + r for r in (*m.routes, *EVERY_MODEL))}",
                )
            return m
        able = [m for m in self.models.values() if serves(m)]
        if not able:
            heads = ", ".join(f"{m.name} ({m.head})" for m in self.models.values())
            raise RequestError(422, None, f"no model here serves /{route}: {heads}")
        if len(able) > 1:
            names = ", ".join(m.name for m in able)
            raise RequestError(422, "model", f"several models serve /{route}: name one ({names})")
        return able[0]

    async def _handle(self, request: Request, route: str) -> Response:
        start = time.perf_counter()
        try:
            self._authorize(request)
            if self.closing:
                raise RequestError(503, None, "the server is shutting down")
            if self.inflight >= self.config.max_concurrent_requests:
                raise RequestError(
                    429,
                    None,
                    f"the server is at its limit of {self.config.max_concurrent_requests} "
                    "concurrent requests; retry later",
                )
            self.inflight += 1
            try:
                data = await self._json(request)
                model = self._model(route, data, request)
                ctx = RequestContext(self, request)
                result, headers = await ROUTES[route](ctx, model, data)
                response: Response = JSON(result, headers={**headers, **ctx.headers(start)})
            finally:
                self.inflight -= 1
        except RequestError as e:
            response = error(e.status, e.message, e.field)
        except InputError as e:  # refused by the pipelines' front half
            refused = RequestError.of(e)
            response = error(refused.status, refused.message, refused.field)
        except ClientDisconnect:  # the client left while its body was being read
            logger.warning("POST /%s 499: the client disconnected while its body was read", route)
            response = Response(status_code=499)  # nobody is there to read it
        except ClientGone:
            response = Response(status_code=499)
        except ModelFailed as e:
            response = error(500, str(e), kind="backend")
        except Exception as e:  # a fault of the server's own: said, logged, and served on
            logger.exception("internal error on /%s", route)
            response = error(500, f"internal error: {e!r}", kind="internal")
        self.metrics.request(route, response.status_code, time.perf_counter() - start)
        return response

    # ------------------------------------------------------------------ the app
    async def health(self, request: Request) -> Response:
        if self.closing:
            return error(503, "the server is shutting down")
        return JSONResponse({"status": "ok", "models": list(self.models)})

    async def info(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except RequestError as e:
            return error(e.status, e.message)
        c = self.config
        limits = {
            "max_concurrent_requests": c.max_concurrent_requests,
            "max_batch_tokens": c.max_batch_tokens,
            "max_batch_sequences": c.max_batch_sequences,
            "max_wait_ms": c.max_wait_ms,
            "max_client_batch_size": c.max_client_batch_size,
            "payload_limit": c.payload_limit,
        }
        from bertlab import __version__

        body = {
            "version": __version__,
            "models": [m.info() for m in self.models.values()],
            "limits": limits,
            "auth": c.api_key is not None,
        }
        return JSONResponse(body)

    async def prometheus(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except RequestError as e:
            return error(e.status, e.message)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def close(self) -> None:
        """Refuse new requests, finish the queued ones, stop the threads, free the compiled
        programs (and the files they were unpacked into)."""
        self.closing = True
        for b in self.batchers.values():
            b.close()
        self.pool.shutdown(wait=True)
        for m in self.models.values():
            if m.compiled is not None:
                m.compiled.close()

    def app(self) -> Starlette:
        def post(route: str) -> Route:
            async def endpoint(request: Request) -> Response:
                return await self._handle(request, route)

            return Route("/" + route, endpoint, methods=["POST"])

        async def http_error(request: Request, exc: Exception) -> Response:
            status = exc.status_code if isinstance(exc, HTTPException) else 500
            detail = exc.detail if isinstance(exc, HTTPException) else repr(exc)
            where = f"{request.method} {request.url.path}"
            return error(status, f"{detail}: {where}")

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette):
            yield
            await asyncio.get_running_loop().run_in_executor(None, self.close)

        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/info", self.info, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            *(post(r) for r in ROUTES),
        ]
        return Starlette(
            routes=routes,
            exception_handlers={HTTPException: http_error},
            lifespan=lifespan,
        )

"""``bertlab serve MODEL [MODEL ...]``: the HTTP server (``bertlab.serve``) over model folders,
each named by its folder (or NAME=FOLDER). This file parses, checks and calls ``serve.run``."""

from __future__ import annotations

import argparse
import importlib.util
import socket
from pathlib import Path

from bertlab.files import resolve_model_dir


def _models(specs: list[str]) -> list[tuple[str, Path]]:
    out = []
    for spec in specs:
        name, _, folder = spec.rpartition("=") if "=" in spec else ("", "", spec)
        directory = resolve_model_dir(folder)
        out.append((name or (folder if folder == "default" else directory.name), directory))
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(
            f"bertlab serve needs {' and '.join(missing)}: pip install 'bertlab[serve]'"
        )
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is outside 0..65535")
    with socket.socket() as probe:  # a taken port is said before the models load
        try:
            probe.bind((args.host, args.port))
        except OSError as e:
            raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from e
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    from bertlab.serve import ServeConfig, run

    config = ServeConfig(
        models=_models(args.models),
        max_concurrent_requests=args.max_concurrent_requests,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_sequences=args.max_batch_sequences,
        max_wait_ms=args.max_wait_ms,
        max_client_batch_size=args.max_client_batch_size,
        payload_limit=args.payload_limit,
        api_key=args.api_key,
        dtype=args.dtype,
        calibration=args.calibration,
        compile=args.compile,
        tokenizer_workers=args.tokenizer_workers,
    )
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run(config, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``bertlab`` command."""
    p = subparsers.add_parser(
        "serve",
        help="an HTTP inference server (embeddings, classification, NER, QA, fill-mask)",
        description="Serve model folders over HTTP: TEI's and OpenAI's embedding routes, "
        "/predict, /ner, /qa, /fill-mask, /tokenize, /decode, /health, /info and /metrics, with "
        "requests batched under a token budget on the packed path.",
    )
    p.add_argument(
        "models", nargs="+", metavar="MODEL", help="a model folder, default, or NAME=FOLDER"
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--max-concurrent-requests", type=int, default=512, help="past it: 429")
    p.add_argument("--max-batch-tokens", type=int, default=16384, help="real tokens per batch")
    p.add_argument("--max-batch-sequences", type=int, default=256, help="sequences per batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="longest wait to fill a batch")
    p.add_argument("--max-client-batch-size", type=int, default=32, help="texts per request")
    p.add_argument("--payload-limit", type=int, default=2_000_000, help="bytes per request body")
    p.add_argument("--api-key", help="require Authorization: Bearer KEY (401 without, 403 wrong)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "int8"],
        default="float32",
        help="the model's precision; int8: linear layers in int8, calibrated at start-up",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="int8: calibration texts, one per line (first 128 read; default: a bundled sample)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="run batches through a compiled graph, in groups of similar length (float32, "
        "int8; needs a C++ compiler; compiles at start-up)",
    )
    p.add_argument("--threads", type=int, help="torch threads (default: PyTorch's)")
    p.add_argument("--tokenizer-workers", type=int, default=2, help="tokenizing threads")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info"])
    p.set_defaults(func=cmd_serve)

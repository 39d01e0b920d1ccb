"""bertlab's HTTP server against other embedding servers, under the same load: the comparison
behind the serve-<cpu class>-<precision>.json records (``bertlab bench serve`` measures
bertlab's server alone).

    python benchmarks/harness/serve_peers.py [--systems bertlab,fastapi-st,infinity]
        [--infinity-venv PATH] [the options of bertlab bench serve]

The peers, each started from its command line beside ``bertlab serve`` (``bertlab.bench.serve``
runs them all: the same model folder, threads, sentences, load and quality check):
* ``fastapi-st``: FastAPI + sentence-transformers as one would write it plainly (``st_server.py``
  beside this file: one ``encode`` per request in FastAPI's thread pool); needs
  requirements.txt beside this file;
* ``infinity``: ``infinity_emb v2`` (torch engine, CPU) from a virtual environment of its own
  (``--infinity-venv``: it pins older sentence-transformers, transformers and numpy), serving
  ``POST /embeddings`` OpenAI-style. Set-up: README.md beside this file.
A peer that cannot run here is reported as not run, with the reason.

In bfloat16 each peer runs its model in bfloat16 (Infinity's ``--dtype bfloat16``, the plain
server's model cast); in int8, Infinity's ``--dtype int8`` and the plain server both use
torch.ao's dynamic int8, as Infinity does on a CPU.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from bertlab.bench.load import HOST, ServerSpec
from bertlab.bench.serve import Unavailable, embed_body, installed_version
from bertlab.cli.bench import add_serve_options, cmd_bench_serve
from bertlab.cli.main import HelpFormatter  # bertlab's: every default shown
from bertlab.extras import installed

HERE = Path(__file__).resolve().parent
MODEL_NAME = "bench-model"  # the name Infinity serves the model under
SET_UP = "benchmarks/harness/README.md"
REQUIREMENTS = "benchmarks/harness/requirements.txt"


def openai_body(texts: list[str]) -> dict:
    return {"input": texts[0] if len(texts) == 1 else texts, "model": MODEL_NAME}


def openai_vectors(answer: dict) -> list:
    return [d["embedding"] for d in answer["data"]]


def fastapi_st_spec(
    model_dir: str, port: int | str, threads: int, dtype: str = "float32"
) -> ServerSpec:
    missing = [m for m in ("fastapi", "uvicorn", "sentence_transformers") if not installed(m)]
    if missing:
        raise Unavailable(f"{', '.join(missing)} not installed (pip install -r {REQUIREMENTS})")
    command = [sys.executable, str(HERE / "st_server.py"), model_dir, "--host", HOST]
    command += ["--port", str(port), "--threads", str(threads)]
    command += ["--dtype", dtype] if dtype != "float32" else []
    version = f"sentence-transformers {installed_version('sentence-transformers')}"
    return ServerSpec("fastapi-st", command, "/embed", embed_body, list, version)


def infinity_spec(
    model_dir: str, port: int | str, threads: int, dtype: str = "float32", venv: str | None = None
) -> ServerSpec:
    """Infinity's command line; its threads come from OMP_NUM_THREADS, which every server gets
    (``bertlab.bench.load.running``)."""
    if not venv:
        raise Unavailable(f"no --infinity-venv given (set-up: {SET_UP})")
    exe = Path(venv) / "bin" / "infinity_emb"
    if not exe.is_file():
        raise Unavailable(f"--infinity-venv {venv}: no {exe} (pip install infinity-emb there)")
    dist = sorted(Path(venv).glob("lib/python*/site-packages/infinity_emb-*.dist-info"))
    version = dist[-1].name.removesuffix(".dist-info").split("-")[1] if dist else "unknown"
    command = [str(exe), "v2", "--model-id", model_dir, "--served-model-name", MODEL_NAME]
    command += ["--engine", "torch", "--device", "cpu", "--host", HOST, "--port", str(port)]
    command += ["--log-level", "warning"]
    command += ["--dtype", dtype] if dtype != "float32" else []  # float32: its "auto" on CPU
    return ServerSpec("infinity", command, "/embeddings", openai_body, openai_vectors, version)


def peers(infinity_venv: str | None = None) -> dict:
    """The servers compared with bertlab's: name -> bertlab.bench.serve.PeerSpec."""
    return {"fastapi-st": fastapi_st_spec, "infinity": partial(infinity_spec, venv=infinity_venv)}


def main(argv: list[str] | None = None) -> int:
    """Parse ``bertlab bench serve``'s options and these, run, print; bad input is one line on
    standard error and exit status 2, as in ``bertlab``."""
    p = argparse.ArgumentParser(
        prog="serve_peers.py", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
    add_serve_options(p, systems="bertlab, fastapi-st, infinity")
    p.add_argument(
        "--infinity-venv",
        metavar="PATH",
        help=f"a virtual environment with infinity-emb ({SET_UP})",
    )
    args = p.parse_args(argv)
    try:
        return cmd_bench_serve(args, peers(args.infinity_venv))
    except (ValueError, FileNotFoundError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The plain server of ``serve_peers.py``: FastAPI + sentence-transformers, as one would write it
in an afternoon. One ``SentenceTransformer(DIR).encode(...)`` per request, in FastAPI's thread
pool (a plain ``def`` route), no batching across requests, no admission control. Needs
requirements.txt beside it (fastapi, sentence-transformers) and uvicorn.

    python benchmarks/harness/st_server.py DIR --port P [--host 127.0.0.1] [--threads N]
        [--dtype float32|bfloat16|int8]

Routes, the same shapes as ``bertlab serve``'s: ``GET /health`` (200 once the model is
loaded: uvicorn accepts connections only after this module has loaded it) and ``POST /embed``
with ``{"inputs": "text" | ["t1", ...], "normalize": true}`` -> a JSON list of vectors.
"""

import argparse

from pydantic import BaseModel


class EmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


def load_model(model_dir: str, dtype: str = "float32"):  # -> SentenceTransformer
    """The model as the plain server runs it: float32, cast to bfloat16, or int8 as Infinity's
    CPU int8 makes it (torch.ao's dynamic int8 linear layers)."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    elif dtype == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model


def build_app(model_dir: str, dtype: str = "float32"):  # -> fastapi.FastAPI
    from fastapi import FastAPI

    model = load_model(model_dir, dtype)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> list:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        vectors = model.encode(
            texts, normalize_embeddings=request.normalize, convert_to_tensor=True
        )
        return vectors.float().tolist()

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="st_server.py", description=__doc__)
    p.add_argument("model", help="a sentence-transformers model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "int8"], default="float32")
    args = p.parse_args(argv)
    import torch
    import uvicorn

    if args.threads:
        torch.set_num_threads(args.threads)
    app = build_app(args.model, args.dtype)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

"""``bertlab serve``: an HTTP inference server over one or more model folders.

    routes (routes.py) -> batcher (engine.py) -> the model, packed -> the pipelines' finishing

``app.py`` is the HTTP side (Starlette on uvicorn: keys, limits, JSON, errors, timings),
``routes.py`` what each route does, ``fields.py`` how request fields are read and refused,
``engine.py`` the served models and their batchers, ``metrics.py`` the Prometheus page. The
``serve`` extra installs Starlette and uvicorn; nothing else in bertlab imports this package.

    from bertlab.serve import ServeConfig, run
    run(ServeConfig(models=[("minilm", "default")]), port=8080)
"""

from __future__ import annotations

from bertlab.serve.app import ServeConfig, Server

__all__ = ["ServeConfig", "Server", "run"]


def run(
    config: ServeConfig, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"
) -> None:
    """Load the models and serve them until SIGINT/SIGTERM; on either the server stops taking
    connections, answers the requests it has admitted, then stops its batchers.

    The process is made a server's: its C heap keeps freed large blocks for the next batch
    (``bertlab.heap.keep_freed_memory``; the runners still hand free pages back once a second),
    and once the models are loaded every object then alive is moved out of the garbage
    collector's sight (``gc.freeze()``), so that its full collections, which run in whatever
    thread allocates (a runner's too), no longer walk the modules, the models and the
    tokenizers on every pass. Measured in ``bertlab/heap.py``."""
    import gc

    import uvicorn

    from bertlab.heap import keep_freed_memory

    keep_freed_memory()  # None where the C library is not glibc: its defaults then stay
    server = Server(config)
    gc.freeze()
    uvicorn.run(server.app(), host=host, port=port, log_level=log_level, lifespan="on")

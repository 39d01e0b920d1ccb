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
    connections, answers the requests it has admitted, then stops its batchers."""
    import uvicorn

    server = Server(config)
    uvicorn.run(server.app(), host=host, port=port, log_level=log_level, lifespan="on")

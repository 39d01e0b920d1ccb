"""The optional dependencies: which extra of pyproject.toml brings each one, and the check a
command makes before its work starts, so that a missing package is one line naming it and what
to install, never a traceback.

    require(["httpx"], "serve-bench", "the load generator")
    -> MissingDependency: httpx is not installed, needed for the load generator:
       pip install 'bertlab[serve-bench]'

``EXTRAS`` mirrors ``[project.optional-dependencies]`` in pyproject.toml, by import name (a test
keeps the two equal; ``test`` is left out: it is the development set, not a feature's).
``bertlab.cli.main`` also turns a ``ModuleNotFoundError`` of one of these modules, wherever it is
raised, into the same line with the smallest extra that holds it (``extra_for``). A leaf: it
imports nothing of bertlab.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

EXTRAS: dict[str, tuple[str, ...]] = {
    "bench": ("transformers", "matplotlib"),
    "runtimes": ("transformers", "matplotlib", "onnx", "onnxscript", "onnxruntime", "openvino"),
    "plot": ("matplotlib",),
    "serve": ("starlette", "uvicorn", "orjson"),
    "serve-bench": ("starlette", "uvicorn", "orjson", "httpx", "matplotlib"),
    "export": ("onnx", "onnxscript", "onnxruntime"),
    "parquet": ("pyarrow",),
    "zstd": ("zstandard",),
    "ray": ("ray", "aiohttp"),
}


class MissingDependency(ValueError):
    """An optional package a command needs is not installed. A ValueError, so that every
    command reports it as bad input: one line on standard error, exit status 2."""


def installed(module: str) -> bool:
    """Whether ``module`` (a top-level import name) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent, or a module whose spec is unset
        return False


def extra_for(module: str) -> str | None:
    """The smallest extra that installs ``module`` (a top-level import name), or None when no
    extra holds it (then it is not an optional dependency of bertlab)."""
    holding = [name for name, modules in EXTRAS.items() if module in modules]
    return min(holding, key=lambda name: len(EXTRAS[name]), default=None)


def missing_message(modules: list[str], extra: str, purpose: str | None = None) -> str:
    """The line of a missing dependency: "httpx is not installed, needed for the load
    generator: pip install 'bertlab[serve-bench]'"."""
    names = " and ".join(modules)
    verb = "is" if len(modules) == 1 else "are"
    why = f", needed for {purpose}" if purpose else ""
    return f"{names} {verb} not installed{why}: pip install 'bertlab[{extra}]'"


def require(modules: Iterable[str], extra: str, purpose: str | None = None) -> None:
    """Raise ``MissingDependency`` naming every module of ``modules`` that is not installed and
    the extra that brings them; nothing when all are there. Imports nothing."""
    if extra not in EXTRAS:
        raise KeyError(f"no extra {extra!r}; the extras are {', '.join(EXTRAS)}")
    modules = list(modules)
    outside = [m for m in modules if m not in EXTRAS[extra]]
    if outside:
        raise KeyError(f"the extra {extra!r} does not install {', '.join(outside)}")
    absent = [m for m in modules if not installed(m)]
    if absent:
        raise MissingDependency(missing_message(absent, extra, purpose))

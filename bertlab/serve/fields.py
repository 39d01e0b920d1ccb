"""Reading a request's JSON fields: each value checked for type and range, and every problem a
``RequestError`` (422 unless said) that names the field and what is wrong, before any work.

Booleans are never taken for numbers (JSON ``true`` is not 1), strings may not be empty or hold a
NUL character, and numbers have limits that the error states.
"""

from __future__ import annotations

from typing import Any

from bertlab.serve.engine import RequestError

MISSING: Any = object()
NAMES = {bool: "true or false", int: "an integer", str: "a string", float: "a number"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), "a list" if isinstance(value, list) else "an object"
    )


def body(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise RequestError(422, None, f"the request body must be a JSON object, got {_kind(data)}")
    return data


def value(
    data: dict[str, Any],
    name: str,
    kind: type,
    default: Any = MISSING,
    lo: float | None = None,
    hi: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """``data[name]`` as ``kind`` (bool, int, float or str), ``default`` when absent or null;
    ints and floats within [lo, hi], strings among ``choices`` (case-insensitive)."""
    v = data.get(name)
    if v is None:
        if default is MISSING:
            raise RequestError(422, name, f"{name} is required")
        return default
    ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        ok, v = True, float(v)
    if not ok:
        raise RequestError(422, name, f"{name} must be {NAMES[kind]}, got {_kind(v)}")
    if kind in (int, float):
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise RequestError(422, name, f"{name} {v} is outside [{lo}, {hi}]")
    if choices is not None:
        if v.lower() not in choices:
            raise RequestError(422, name, f"{name} {v!r} is not one of {', '.join(choices)}")
        v = v.lower()
    return v


def text(v: Any, name: str) -> str:
    """One input text: a non-empty string without NUL characters."""
    if not isinstance(v, str):
        raise RequestError(422, name, f"{name} must be a string, got {_kind(v)}")
    if not v.strip():
        raise RequestError(422, name, f"{name} is empty")
    if "\x00" in v:
        raise RequestError(422, name, f"{name} holds a NUL character (at {v.index(chr(0))})")
    return v


def texts(data: dict[str, Any], name: str, most: int) -> tuple[list[str], bool]:
    """``data[name]``: a string or a list of 1..``most`` strings -> (the list, whether it was
    one string). Past ``most`` (the server's --max-client-batch-size): 413."""
    v = data.get(name)
    if v is None:
        raise RequestError(422, name, f"{name} is required")
    if isinstance(v, str):
        return [text(v, name)], True
    if not isinstance(v, list):
        raise RequestError(
            422, name, f"{name} must be a string or a list of strings, got {_kind(v)}"
        )
    if not v:
        raise RequestError(422, name, f"{name} is an empty list")
    if len(v) > most:
        raise RequestError(
            413, name, f"{name} holds {len(v)} texts; this server takes at most {most} per request"
        )
    return [text(t, f"{name}[{i}]") for i, t in enumerate(v)], False


def long_policy(data: dict[str, Any], windows_ok: bool = True) -> tuple[str, str]:
    """(what to do with texts past the model's length, truncation side) from ``truncate``,
    ``windows`` and ``truncation_direction``."""
    truncate = value(data, "truncate", bool, False)
    windows = value(data, "windows", bool, False) if windows_ok else False
    if truncate and windows:
        raise RequestError(422, "windows", "truncate and windows exclude each other: send one")
    direction = value(data, "truncation_direction", str, "right", choices=("right", "left"))
    return ("truncate" if truncate else "windows" if windows else "error"), direction

"""Reading a request's JSON fields: each value checked for type and range, and every problem a
``RequestError`` (422 unless said) that names the field as the request has it (``inputs[3]``,
``inputs.sentences[1]``, ``texts[0]``) and what is wrong, before any work.

Booleans are never taken for numbers (JSON ``true`` is not 1), numbers have limits that the
error states, texts may not be blank and pass the pipelines' text rules (``bertlab.pipelines.text``:
no surrogate code points; NUL, control characters and every other character are text), and a
field of texts holds at most the server's ``--max-client-batch-size`` of them, counted in that
field alone (413, ``too_many``).
"""

from __future__ import annotations

from typing import Any

from bertlab.pipelines.text import InputError, check_text
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
    """One input text: a string, not blank, that passes the text rules (``check_text``)."""
    if not isinstance(v, str):
        raise RequestError(422, name, f"{name} must be a string, got {_kind(v)}")
    try:
        return check_text(v, name, blank="{field} is empty")
    except InputError as e:
        raise RequestError.of(e) from None


def too_many(name: str, n: int, most: int, what: str = "texts") -> None:
    """The one count limit of every route: past ``most`` (the server's --max-client-batch-size)
    ``name`` is refused with a 413 that names it, its count and the limit."""
    if n > most:
        raise RequestError(
            413, name, f"{name} holds {n} {what}; this server takes at most {most} per request"
        )


def names(name: str, n: int, single: bool) -> list[str]:
    """How a field's texts are named in refusals: ``name`` for one string, else ``name[i]``."""
    return [name] if single else [f"{name}[{i}]" for i in range(n)]


def texts(
    data: dict[str, Any], name: str, most: int, label: str | None = None
) -> tuple[list[str], bool]:
    """``data[name]``: a string or a list of 1..``most`` strings -> (the list, whether it was
    one string), each read by ``text``. ``label``: the field's name in the request when
    ``data`` is nested (``inputs.sentences``). Past ``most``: 413 (``too_many``)."""
    label = name if label is None else label
    v = data.get(name)
    if v is None:
        raise RequestError(422, label, f"{label} is required")
    if isinstance(v, str):
        return [text(v, label)], True
    if not isinstance(v, list):
        raise RequestError(
            422, label, f"{label} must be a string or a list of strings, got {_kind(v)}"
        )
    if not v:
        raise RequestError(422, label, f"{label} is an empty list")
    too_many(label, len(v), most)
    return [text(t, f"{label}[{i}]") for i, t in enumerate(v)], False


def long_policy(data: dict[str, Any], windows_ok: bool = True) -> tuple[str, str]:
    """(what to do with texts past the model's length, truncation side) from ``truncate``,
    ``windows`` and ``truncation_direction``."""
    truncate = value(data, "truncate", bool, False)
    windows = value(data, "windows", bool, False) if windows_ok else False
    if truncate and windows:
        raise RequestError(422, "windows", "truncate and windows exclude each other: send one")
    direction = value(data, "truncation_direction", str, "right", choices=("right", "left"))
    return ("truncate" if truncate else "windows" if windows else "error"), direction

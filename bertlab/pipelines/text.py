"""The rules every input text meets, in one place: the pipelines of both name sets, ``bertlab
predict``, the server's routes and the explorer check their texts here, before any work.

What is refused: a code point that is not a Unicode scalar value, that is a surrogate
(U+D800 to U+DFFF). A Python string can hold one (``json.loads`` turns an unpaired ``"\\ud800"``
escape into one, and a string built from UTF-16 code units may hold a pair as two), but UTF-8
cannot encode it and the tokenizer cannot read it. The refusal names the field, the code point
and its position, counted in characters from 0 as the offsets of tokens and answers are:
``inputs[3] holds an unpaired surrogate U+D800 at character 5``.

What is text and taken: every other code point. NUL and the other control characters (the
tokenizer's normalizer drops them, as BERT's own does, and offsets still point into the text as
given), combining marks, right-to-left scripts, emoji and other characters past U+FFFF,
noncharacters such as U+FFFF, private-use code points, and characters the vocabulary lacks (they
become [UNK]).

Whether a blank text is an input depends on the task, not on the text: the server's routes, the
question-answering pipelines and the explorer refuse one (each with its own words, ``blank``);
the pipelines' batch calls read it as transformers' do ([CLS] [SEP]).

A refusal is an ``InputError``, a ValueError that names its field; ``limit`` marks one that
passes a limit (a count or a length) rather than one that is malformed, which the server answers
with a 413 instead of a 422. Imports nothing of bertlab.
"""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """A refused input: the field it came in (as the caller names it: ``inputs[3]``,
    ``question``), and whether it passed a limit (``limit``) rather than being malformed."""

    def __init__(self, field: str | None, message: str, limit: bool = False):
        super().__init__(message)
        self.field, self.limit = field, limit


SURROGATES = range(0xD800, 0xE000)


def invalid_code_point(text: str) -> str | None:
    """What makes ``text`` invalid ("an unpaired surrogate U+D800 at character 5"), or None
    when it is valid text. Fast for valid text: one encode in C."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        i = e.start
    high = ord(text[i])
    if 0xD800 <= high < 0xDC00 and i + 1 < len(text) and 0xDC00 <= ord(text[i + 1]) < 0xE000:
        low = ord(text[i + 1])
        joined = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
        return (
            f"a surrogate pair U+{high:04X} U+{low:04X} at character {i} (UTF-16 code units, "
            f"not text: decode them to U+{joined:04X} first)"
        )
    return f"an unpaired surrogate U+{high:04X} at character {i}"


def check_text(text: str, field: str, blank: str | None = None) -> str:
    """``text`` (a str) as given, or an ``InputError`` naming ``field``: for an invalid code
    point, and, when ``blank`` is given, for a text of nothing but white space, with the message
    ``blank.format(field=field)`` (e.g. ``"{field} is empty"``)."""
    if blank is not None and not text.strip():
        raise InputError(field, blank.format(field=field))
    why = invalid_code_point(text)
    if why is not None:
        raise InputError(
            field,
            f"{field} holds {why}: a text must be valid Unicode, without surrogate code points "
            "(U+D800 to U+DFFF)",
        )
    return text


def check_texts(
    texts: Any, field: str, blank: str | None = None, kind: type[Exception] = TypeError
) -> tuple[list[str], bool]:
    """A text or a list (or tuple) of texts -> (the list, whether one text was given), each
    checked by ``check_text`` as ``field`` (one text) or ``field[i]``. Anything else is a
    ``kind`` error saying what is expected."""
    if isinstance(texts, str):
        return [check_text(texts, field, blank)], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise kind(f"{field} must be a str or a list of str")
    return [check_text(t, f"{field}[{i}]", blank) for i, t in enumerate(texts)], False

"""One status line for long work (training, corpus preparation, benchmarks). A leaf.

On a terminal the line is rewritten in place (``\\r``) and ended with a newline when the work
ends, so the next message starts on a line of its own. Anywhere else (a log file, a pipe) a
``\\r`` would glue every update and the next message into one line, so the status is written
as plain lines instead, the first at once, then at most one every ``every`` seconds, and the
last one at the end; ``note`` writes a line of its own at once.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, every: float = 30.0):
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last = ""  # the last status given
        self.shown = ""  # the last status written
        self.written_at = float("-inf")
        self.open = False  # a \r line is on the screen without its newline

    def update(self, text: str) -> None:
        """The current status; written now on a terminal, else when ``every`` has passed."""
        self.last = text
        now = time.monotonic()
        if self.live:
            self.stream.write("\r" + text)
            self.stream.flush()
            self.open = True
        elif now - self.written_at >= self.every:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.shown, self.written_at = text, now

    def note(self, text: str) -> None:
        """A line of its own, written now whatever ``every`` says (e.g. what starts), leaving
        the status's pace as it was; an open terminal status line is ended first."""
        if self.live and self.open:
            self.stream.write("\n")
            self.open = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the status: the terminal line gets its newline; a log gets the final status."""
        if self.live and self.open:
            self.stream.write("\n")
            self.open = False
        elif not self.live and self.last and self.last != self.shown:
            self.stream.write(self.last + "\n")
            self.shown = self.last
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

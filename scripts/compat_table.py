"""The "Coming from transformers" guide's table, generated from the snippets that
tests/test_transformers_compat.py runs with transformers and with bertlab.

    python scripts/compat_table.py            # print the table
    python scripts/compat_table.py --check    # exit 1 if the guide's table or count differs
    python scripts/compat_table.py --write    # write the table and the count into the guide

The table sits in the guide between the marker comments below. A row says "same result" only
for a snippet whose two results the test compares equal; a deliberate difference or a snippet
still pending says what differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "from-transformers.md"
TESTS = ROOT / "tests" / "test_transformers_compat.py"
START = "<!-- compat-table:start -->"
END = "<!-- compat-table:end -->"
COUNT = re.compile(r"\b\d+ snippets, each run")


def load_snippets():
    """The test module's ``SECTIONS``, ``SNIPPETS`` and ``PENDING``."""
    spec = importlib.util.spec_from_file_location("test_transformers_compat", TESTS)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules[spec.name])
    module = sys.modules[spec.name]
    return module.SECTIONS, module.SNIPPETS, module.PENDING


def outcome(snippet) -> str:
    if snippet.pending is not None:
        return f"not yet the same: {snippet.pending}"
    if snippet.difference is not None:
        return f"deliberate difference: {snippet.difference}"
    return "same result"


def table(sections, snippets, pending=()) -> str:
    """The Markdown table: one row per snippet, grouped by section in ``sections``' order;
    pending snippets last in their section."""
    rows = ["| area | transformers code | with `from bertlab import ...` |", "| --- | --- | --- |"]
    everything = list(snippets) + list(pending)
    unknown = {s.section for s in everything} - set(sections)
    if unknown:
        raise ValueError(f"snippets name sections {sorted(unknown)} not in {list(sections)}")
    for section in sections:
        for i, snippet in enumerate(s for s in everything if s.section == section):
            area = f"**{section}**" if i == 0 else ""
            rows.append(f"| {area} | {snippet.what} | {outcome(snippet)} |")
    return "\n".join(rows)


def guide_table(text: str) -> str:
    """The text between the guide's markers, without the blank lines around it."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"the guide must hold {START} and {END} once each")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def with_table(text: str, generated: str, count: int) -> str:
    """``text`` with ``generated`` between the markers and the paragraph's count of snippets
    ("N snippets, each run") set to ``count``."""
    guide_table(text)  # checks the markers
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    head, n = COUNT.subn(f"{count} snippets, each run", head)
    if n != 1:
        raise ValueError("the guide's paragraph before the table must say 'N snippets, each run'")
    return f"{head}{START}\n{generated}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the guide's table differs")
    mode.add_argument("--write", action="store_true", help="write the table into the guide")
    args = parser.parse_args(argv)
    sections, snippets, pending = load_snippets()
    generated = table(sections, snippets, pending)
    text = GUIDE.read_text(encoding="utf-8")
    if args.check:
        if with_table(text, generated, len(snippets)) != text:
            print("the guide's compat table is stale: run python scripts/compat_table.py --write")
            return 1
        print(f"the guide's compat table matches the {len(snippets)} snippets")
        return 0
    if args.write:
        GUIDE.write_text(with_table(text, generated, len(snippets)), encoding="utf-8")
        print(f"wrote the table of {len(snippets)} snippets into the guide")
        return 0
    print(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())

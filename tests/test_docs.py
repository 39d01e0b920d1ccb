"""The documentation site (mkdocs.yml, docs/): it builds under ``mkdocs build --strict`` (a broken
link, a page missing from the navigation or an API object that does not resolve fails it), and
every example on its pages runs as written, its output checked where the page shows it.

The pages hold code in three kinds of fenced blocks:

``pycon``
    Python at ``>>>`` and ``...`` prompts, run by doctest (ELLIPSIS, NORMALIZE_WHITESPACE).
    The blocks of one page share one namespace, as one interactive session would.
``console``
    Shell commands after ``$ `` (continuation lines start with ``> ``); the lines up to the next
    ``$ `` are the command's output (standard output and error together), compared as doctest
    compares, ``...`` matching anything. A command that is a plain ``bertlab ARGS`` runs
    ``bertlab.cli.main.main(ARGS)`` in this process (what the ``bertlab`` script calls, without
    a new interpreter importing torch for every line); any other line runs in bash. A line ending
    in `` &`` starts a background process, stopped when the page is done. Every command must
    exit with 0.
``bash``
    Set-up commands that install packages, not run here: each line must be one of the README's
    two set-up commands, which CI runs (tests/test_readme.py).

Every page runs in a new empty folder of its own, its blocks in page order. A printed number
with a fraction may differ from the page by one unit in its last digit: float32 sums are ordered
differently on different CPUs. Any other fenced block (text, json, toml) holds no code.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bertlab.nn.precision import int8_supported

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md"))
RUN = ("pycon", "console", "bash")
NOT_CODE = ("text", "json", "toml", "yaml")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
COMMAND_SECONDS = 300  # a command still running after this fails the page instead of hanging
COLUMNS = 80  # the width help texts wrap to, as on a terminal of 80 columns
SHELL = re.compile(r"[|&;<>()$`*?\[\]{}~\\]")  # outside quotes: a line for bash, not main()
QUOTED = re.compile(r"'[^']*'|\"[^\"$`\\]*\"")


@dataclass
class Block:
    page: str
    line: int  # of the block's first line of code, counted from 1
    lang: str
    text: str


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of a page, in order (fences at any indentation, as in lists)."""
    found, lines = [], (ROOT / page).read_text("utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        body, start = [], i + 2
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        found.append(Block(page, start, lang, "\n".join(body) + "\n"))
        i += 1
    return found


# ============================================================================ output
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


class Checker(doctest.OutputChecker):
    """doctest's comparison, and where it fails, the same with every number that has a fraction
    allowed one unit of difference in its last printed digit (and 2e-3 relative in exponent
    notation): float32 sums are ordered differently on different CPUs. Integers, and everything
    that is not a number, must match."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return super().check_output(want, got, optionflags) or close(want, got)


def close(want: str, got: str) -> bool:
    pattern, wanted, pos = [], [], 0
    for m in re.finditer(r"\.\.\.|" + NUMBER.pattern, want):
        pattern.append(_literal(want[pos : m.start()]))
        if m.group() == "...":
            pattern.append(".*?")
        else:
            pattern.append(f"({NUMBER.pattern})")
            wanted.append(m.group())
        pos = m.end()
    pattern.append(_literal(want[pos:]))
    m = re.fullmatch(r"\s*" + "".join(pattern) + r"\s*", got, re.DOTALL)
    return m is not None and all(
        _same_number(w, g) for w, g in zip(wanted, m.groups(), strict=True)
    )


def _literal(text: str) -> str:
    return r"\s+".join(re.escape(part) for part in re.split(r"\s+", text)) if text else ""


def _same_number(want: str, got: str) -> bool:
    if want == got:
        return True
    w, g = want.replace(",", ""), got.replace(",", "")
    if "." not in w and "e" not in w:
        return False  # integers match exactly
    try:
        a, b = float(w), float(g)
    except ValueError:
        return False
    if "e" in w:
        return abs(a - b) <= 2e-3 * abs(a)
    unit = 10.0 ** -len(w.split(".")[1])
    return abs(a - b) <= unit * 1.01


# ============================================================================ running a page
class Session:
    """One page's examples: a doctest namespace, a working folder, background processes."""

    def __init__(self, page: str, folder: Path):
        self.page, self.folder = page, folder
        self.globs: dict = {"__name__": "__docs__"}
        self.background: list[subprocess.Popen] = []
        self.parser = doctest.DocTestParser()
        self.checker = Checker()

    def pycon(self, block: Block) -> None:
        test = self.parser.get_doctest(block.text, {}, self.page, self.page, block.line - 1)
        test.globs = self.globs  # one namespace for the page (DocTest would copy it)
        if not test.examples:
            pytest.fail(f"{self.page}:{block.line}: a pycon block without >>> prompts")
        report = io.StringIO()
        runner = doctest.DocTestRunner(checker=self.checker, optionflags=FLAGS, verbose=False)
        runner.run(test, out=report.write, clear_globs=False)
        if runner.failures:
            first = report.getvalue().split("*" * 70)[1].strip()
            pytest.fail(f"{self.page}: an example failed\n{first}", pytrace=False)

    def console(self, block: Block) -> None:
        commands: list[tuple[int, str, list[str]]] = []
        for n, line in enumerate(block.text.splitlines(), block.line):
            if line.startswith("$ "):
                commands.append((n, line[2:], []))
            elif (line == ">" or line.startswith("> ")) and commands and not commands[-1][2]:
                commands[-1] = (commands[-1][0], commands[-1][1] + "\n" + line[2:], [])
            elif commands:
                commands[-1][2].append(line)
            elif line.strip():
                pytest.fail(f"{self.page}:{n}: a console block must start with a $ command")
        for n, command, output in commands:
            want = "\n".join(output).strip()
            if command.rstrip().endswith(" &"):
                if want:
                    pytest.fail(f"{self.page}:{n}: a background command shows no output")
                self.start(command)
                continue
            code, got = self.run(command)
            where = f"{self.page}:{n}: $ {command}"
            if code != 0:
                pytest.fail(f"{where}\nexited with {code}:\n{got}", pytrace=False)
            if want and not self.checker.check_output(want + "\n", got, FLAGS):
                pytest.fail(f"{where}\nexpected:\n{want}\ngot:\n{got}", pytrace=False)

    def run(self, command: str) -> tuple[int, str]:
        bare = QUOTED.sub("", command)
        if command.startswith("bertlab ") and not SHELL.search(bare) and "\n" not in command:
            return self.in_process(shlex.split(command)[1:])
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env=self.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_SECONDS,
        )
        return done.returncode, done.stdout

    def in_process(self, argv: list[str]) -> tuple[int, str]:
        from bertlab.cli.main import main

        out = io.StringIO()
        # warnings reach standard error as the command's own process shows them (Python's
        # last-resort handler: the message alone), whatever handlers pytest has added
        shown = logging.StreamHandler(out)
        shown.setLevel(logging.WARNING)
        root = logging.getLogger()
        stdin, columns = sys.stdin, os.environ.get("COLUMNS")
        sys.stdin = io.StringIO("")
        os.environ["COLUMNS"] = str(COLUMNS)
        root.addHandler(shown)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                try:
                    code = main(argv)
                except SystemExit as e:  # argparse: --help, or a usage error
                    code = e.code if isinstance(e.code, int) else 1
        finally:
            root.removeHandler(shown)
            sys.stdin = stdin
            if columns is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = columns
        return code, out.getvalue()

    def start(self, command: str) -> None:
        self.background.append(
            subprocess.Popen(
                ["bash", "-c", command.rstrip()[:-1]],
                cwd=self.folder,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, stopped as one
            )
        )

    def env(self) -> dict[str, str]:
        """The test's environment, with this interpreter's scripts (bertlab, python) first."""
        bin_dir = str(Path(sys.executable).parent)
        path = bin_dir + os.pathsep + os.environ.get("PATH", "")
        return {**os.environ, "PATH": path, "COLUMNS": str(COLUMNS)}

    def close(self) -> None:
        for p in self.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text("utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("page", [p for p in PAGES if any(b.lang in RUN for b in blocks(p))])
def test_examples_run_as_written(page, tmp_path, monkeypatch):
    """Every example of the page, in page order, in a new folder; output checked where shown."""
    found = [b for b in blocks(page) if b.lang in RUN]
    int8 = re.compile(r"quantize_int8|--dtype[ =]int8|dtype=.int8.")
    if any(int8.search(b.text) for b in found) and (why := int8_supported()) is not None:
        pytest.skip(f"{page}'s examples run int8, which does not run on this CPU: {why}")
    monkeypatch.chdir(tmp_path)
    session = Session(page, tmp_path)
    try:
        for block in found:
            if block.lang == "pycon":
                session.pycon(block)
            elif block.lang == "console":
                session.console(block)
            else:
                setup = readme_setup_commands()
                for n, line in enumerate(block.text.splitlines(), block.line):
                    if line.strip() and line not in setup:
                        pytest.fail(f"{page}:{n}: not one of the README's set-up commands: {line}")
    finally:
        session.close()


def test_every_block_is_a_known_kind():
    """A block in a language the runner does not know would be shown and never run."""
    unknown = [
        f"{b.page}:{b.line - 1}: ```{b.lang}"
        for page in PAGES
        for b in blocks(page)
        if b.lang not in RUN and b.lang not in NOT_CODE
    ]
    assert not unknown, "use pycon, console or bash (see this file's docstring):\n" + "\n".join(
        unknown
    )


def test_every_page_is_in_the_navigation():
    """mkdocs builds a page left out of the navigation without a warning: this test says so."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads mkdocs.yml (mkdocs installs it)")

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold tags such as !!python/name:..., which only mkdocs resolves
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=Loader)

    def files(nav) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [f for item in nav for f in files(item)]
        if isinstance(nav, dict):
            return [f for value in nav.values() for f in files(value)]
        return []

    listed = set(files(config["nav"]))
    pages = {p.removeprefix("docs/") for p in PAGES}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav entries without a page"


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: every link and API object resolves, no warning."""
    for module, extra in (("mkdocs", "mkdocs"), ("material", "mkdocs-material")):
        pytest.importorskip(module, reason=f"{extra} builds the site: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python]: .[docs]")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's notice, not ours
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "api" / "models" / "index.html").is_file()


@pytest.mark.parametrize(
    ("want", "got", "same"),
    [
        ("x = 0.1234", "x = 0.1235", True),
        ("x = 0.1234", "x = 0.1236", False),
        ("109,705,010 params", "109,705,011 params", False),
        ("diff 4.77e-07 ok", "diff 4.771e-07 ok", True),
        ("tensor([ 0.12, ..., -0.50])", "tensor([ 0.13,  0.2, 0.3, -0.50])", True),
        ("[CLS] the cat", "[CLS] a cat", False),
    ],
)
def test_numbers_may_differ_in_their_last_digit_only(want, got, same):
    assert Checker().check_output(want, got, FLAGS) is same

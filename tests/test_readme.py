"""The README opens with the two set-up commands, CI runs the second one verbatim, and the
README's own examples run as written. (Its serving lines are run by tests/test_serve.py and
tests/test_serve_int8.py, its compatibility table is checked by tests/test_transformers_compat.py,
and the examples of the documentation site by tests/test_docs.py.)"""

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def job(title: str) -> str:
    """The README's section ``### <title>...`` of "The jobs", up to the next heading."""
    text = (ROOT / "README.md").read_text()
    return text.split(f"\n### {title}", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


def fenced(section: str, lang: str) -> list[str]:
    return [b.split("```", 1)[0] for b in section.split(f"```{lang}\n")[1:]]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert commands[0].endswith("bertlab demo")
    assert "torch==2.13.0" in commands[0] and "torch==2.13.0" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_the_readme_stays_a_front_door():
    """The details live in docs/; the README keeps to its size and links to every guide."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for page in (
        "getting-started.md",
        "understanding-bert.md",
        "guides/pretraining.md",
        "guides/fine-tuning.md",
        "guides/inference.md",
        "guides/serving.md",
        "guides/export.md",
        "guides/from-transformers.md",
        "guides/explore.md",
        "performance.md",
        "architecture.md",
        "contributing.md",
    ):
        assert f"(docs/{page})" in text, page


def test_the_understand_commands_run_as_written(monkeypatch, tmp_path, capsys):
    """The shell block of "Understand", run in an empty folder: every command succeeds, and the
    parameter count its comment gives is the one bertlab prints."""
    from bertlab.cli.main import main

    (block,) = fenced(job("Understand"), "bash")
    monkeypatch.chdir(tmp_path)
    for line in block.strip().splitlines():
        argv = shlex.split(line, comments=True)
        assert argv[0] == "bertlab"
        capsys.readouterr()
        assert main(argv[1:]) in (0, None), line
        printed = capsys.readouterr().out
        if argv[1] == "summary":
            total = line.rsplit(":", 1)[1].strip()
            assert f"Total params: {total}" in printed
    assert (tmp_path / "page.html").stat().st_size > 100_000


def test_the_explore_example_runs_as_written(monkeypatch, tmp_path):
    """The Python block of "Understand", run in an empty folder, writes the page and gives what
    its comments say; the picture beside it is in the repository."""
    section = job("Understand")
    (block,) = fenced(section, "python")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert (tmp_path / "page.html").stat().st_size > 100_000
    assert scope["page"].tokens[:4] == ["[CLS]", "the", "cat", "sat"]
    assert tuple(scope["page"].attention(layer=0, head=3).shape) == (14, 14)
    pictures = [part.split(")", 1)[0] for part in section.split("](docs/explore/")[1:]]
    assert pictures
    for name in pictures:
        assert (ROOT / "docs" / "explore" / name).stat().st_size > 10_000


def test_the_predict_example_runs_as_written(monkeypatch):
    """The Python block of "Predict", copied as a newcomer would, runs from the repository root
    and gives what its comments say."""
    (block,) = fenced(job("Predict"), "python")
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert sorted(scope["out"].keys()) == ["logits", "loss"]
    assert scope["out"].loss.shape == () and scope["out"].logits.shape == (2, 2)
    assert scope["tok"].padding_side == "left" and scope["enc"]["attention_mask"][1, 0] == 0
    assert scope["model"].config.id2label == {0: "negative", 1: "positive"}
    assert len(scope["extract"]("a gorgeous film")[0]) == 5

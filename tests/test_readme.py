"""The README opens with the two set-up commands, and CI runs the second one verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert commands[0].endswith("bertlab demo")
    assert "torch==2.13.0" in commands[0] and "torch==2.13.0" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_readme_parameter_table_is_what_bertlab_prints(capsys):
    from bertlab.cli.main import main

    main(["summary", "base", "--head", "pretraining", "--vocab-size", "30000", "--collapse"])
    printed = capsys.readouterr().out.strip()
    assert printed in (ROOT / "README.md").read_text()


def test_the_use_it_examples_run_as_written(monkeypatch):
    """The Python blocks of "Use it", copied as a newcomer would, run from the repository root
    and print what their comments say."""
    import torch

    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    assert len(blocks) == 3
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)
    assert tuple(scope["out"].keys()) == ("loss", "logits")
    assert scope["loss"].shape == () and scope["logits"].shape == (2, 2)
    assert scope["tok"].padding_side == "left" and scope["enc"]["attention_mask"][1, 0] == 0
    assert len(scope["extract"]("a gorgeous film")[0]) == 5
    assert scope["tf_model"].config.hidden_size == 32
    assert isinstance(scope["hub_model"], torch.nn.Module)


def test_the_explore_example_runs_as_written(monkeypatch, tmp_path):
    """The Python block of "See inside", run in an empty folder, writes the page and gives what
    its comments say."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## See inside", 1)[1].split("\n## ", 1)[0]
    (block,) = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert (tmp_path / "page.html").stat().st_size > 100_000
    assert scope["page"].tokens[:4] == ["[CLS]", "the", "cat", "sat"]
    assert tuple(scope["page"].attention(layer=0, head=3).shape) == (14, 14)
    for name in ("tokens", "embeddings", "attention", "worked", "layers", "parameters"):
        assert f"(docs/explore/{name}.png)" in section
        assert (ROOT / "docs" / "explore" / f"{name}.png").stat().st_size > 10_000


def test_the_compiled_example_runs_as_written(monkeypatch):
    """The Compiled block of "Export and compile" runs as written and gives what its comments
    say (it compiles the bundled model: needs a C++ compiler)."""
    import pytest

    from bertlab.nn.compiled import Compiled

    why = Compiled.available()
    if why is not None:
        pytest.skip(f"torch.compile cannot build CPU kernels here: {why}")
    text = (ROOT / "README.md").read_text()
    section = text.split("## Export and compile", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    (block,) = [b for b in blocks if "Compiled(" in b]
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert tuple(scope["out"].last_hidden_state.shape) == (1, 5, 384)
    assert scope["fast"].calls == {"compiled": 1, "eager": 0}
    got = scope["embed"]("a gorgeous film")
    assert tuple(got.shape) == (384,)
    assert scope["embed"].forward.calls["compiled"] == 2
    want = scope["pipeline"]("embed")("a gorgeous film")  # the same pipeline, not compiled
    assert (got - want).abs().max() < 1e-5

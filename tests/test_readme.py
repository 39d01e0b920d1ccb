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

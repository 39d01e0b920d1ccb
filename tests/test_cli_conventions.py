"""The command line's conventions: --version, python -m bertlab, defaults in --help, positionals
before or after options, a closed pipe, the demo's sentence on standard input, bench's
subcommands and their own options, Ctrl-C during a benchmark, and a package that reads nothing
outside itself."""

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bertlab
from bertlab.cli.main import DEMO_REVIEW, build_parser, demo_sentence, main

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def bertlab_process(*argv: str, **kwargs) -> subprocess.Popen:
    """``python -m bertlab ARGV`` in a new process, importing this checkout's package."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "bertlab", *argv], cwd=ROOT, env=env, text=True, **kwargs
    )


def leaf_parsers(parser: argparse.ArgumentParser):
    """Every command's parser that takes options itself: (its name, the parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser.prog, parser
    for sub in subs:
        for child in sub.choices.values():
            yield from leaf_parsers(child)


# ============================================================================ version, -m
def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"bertlab {bertlab.__version__}\n" == "bertlab 0.1.0\n"


def test_python_m_bertlab_is_the_same_command_line():
    proc = bertlab_process("--version", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out == f"bertlab {bertlab.__version__}\n"


# ============================================================================ --help
def test_every_option_with_a_default_shows_it_in_help():
    """On every command, pretrain, finetune and predict included: an option whose default is
    not None (nor a switch's False) has that default in its --help, unless its help already
    says what the default is in words."""
    leaves = dict(leaf_parsers(build_parser()))
    assert {"bertlab predict", "bertlab bench speed", "bertlab bench finetune"} <= set(leaves)
    for name, parser in leaves.items():
        text = " ".join(parser.format_help().split())  # one line: wrapping moves words
        for action in parser._actions:
            if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
                continue
            if action.help and ("(default" in action.help or "default:" in action.help):
                continue  # says its default in words, e.g. "(default: bundled)"
            shown = f"default: {action.default}"
            assert shown in text, f"{name} {action.option_strings[0]}: no {shown!r} in --help"


def test_help_shows_a_default_the_user_can_read(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "speed", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--repeats REPEATS timed runs per side (default: 5)" in text
    assert "(default: float32,bfloat16)" in text and "default: None" not in text


# ============================================================================ positionals
def test_positional_texts_go_before_or_after_the_options(capsys):
    """The README's shape, `predict TASK --model M "text"`, and the text first, give the same."""
    after = run(capsys, "predict", "embed", "--model", "default", "a gorgeous film")
    before = run(capsys, "predict", "embed", "a gorgeous film", "--model", "default")
    between = run(capsys, "predict", "embed", "a gorgeous film", "--batch-size", "2", "a dull one")
    assert after[0] == before[0] == between[0] == 0
    assert after[1] == before[1] and after[1].startswith("a gorgeous film\t[")
    assert [line.split("\t")[0] for line in between[1].splitlines()] == [
        "a gorgeous film",
        "a dull one",
    ]


def test_an_unknown_option_is_named_by_the_command_that_refuses_it(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "tokenizer", "--draws", "2"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "bertlab bench tokenizer: error: unrecognized arguments: --draws 2" in err


# ============================================================================ pipes, stdin
def test_a_closed_pipe_ends_quietly():
    """`bertlab tokenize ... | head -0`: the reader is gone before bertlab writes a line. The
    command ends with 141 (128 + SIGPIPE, as a shell reports `cat big | head -1`), no
    traceback, nothing on standard error."""
    proc = bertlab_process(
        "tokenize", "a text long enough " * 20, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader leaves at once; bertlab is still importing torch
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_demo_sentence_comes_from_standard_input_when_it_is_not_a_terminal():
    assert demo_sentence(io.StringIO("a gorgeous film\nsecond line\n")) == "a gorgeous film"
    assert demo_sentence(io.StringIO("")) == DEMO_REVIEW  # nothing piped in: the example
    assert demo_sentence(io.StringIO("   \n")) == DEMO_REVIEW
    assert demo_sentence(None) == DEMO_REVIEW


def test_demo_classifies_a_sentence_piped_in(capsys, tmp_path, monkeypatch):
    """`echo "a gorgeous film" | bertlab demo`: the piped sentence is the one classified. The
    fine-tuning itself is test_cli.py's; here a stand-in saves an untrained classifier at once,
    and the machine's measured speed is given."""
    import bertlab.train.finetune as training
    from bertlab import BertForSequenceClassification, BertTokenizer
    from bertlab.files import bundled_model_dir

    def finetune(config, out, overwrite=False):
        labels = {0: "negative", 1: "positive"}
        model = BertForSequenceClassification.from_pretrained(config.model, id2label=labels)
        model.save_pretrained(out / "model")
        BertTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(out / "model")
        dev = {"accuracy": 0.5, "f1": 0.5, "mcc": 0.0}
        return {"dev": dev, "steps": 0, "seconds": 0.0, "wall_seconds": 0.0}

    import bertlab.train.demo as planner

    monkeypatch.setattr(training, "finetune", finetune)
    # The demo times a few steps before it plans: a fast machine's figures, at once.
    monkeypatch.setattr(planner, "measure", lambda prepared: planner.Speed(0.01, 0.001, 0.0001))
    monkeypatch.setattr(sys, "stdin", io.StringIO("a gorgeous film\n"))  # not a terminal
    code, out, _ = run(capsys, "demo", "--output", str(tmp_path / "demo"))
    assert code == 0
    label = re.search(r"'a gorgeous film' -> (\w+) \(([0-9.]+)\)", out)
    assert label and label.group(1) in ("negative", "positive") and float(label.group(2)) >= 0.5


# ============================================================================ bench
def bench_help(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit):
        main(["bench", *argv, "--help"])
    return capsys.readouterr().out


def test_each_bench_subcommand_has_only_its_own_options(capsys):
    options = {}
    for name in ("speed", "tokenizer", "int8", "memory", "pretrain", "finetune"):
        options[name] = set(re.findall(r"(--[a-z0-9-]+)", bench_help(name, capsys=capsys)))
    assert {"--draws", "--dtypes", "--kernel", "--models", "--plot"} <= options["speed"]
    assert options["tokenizer"] == {"--help", "--model", "--data", "--repeats", "--out"}
    assert options["memory"] == {
        "--help",
        "--model",
        "--batch-size",
        "--seq-len",
        "--repeats",
        "--device",
        "--out",
    }
    assert "--draws" not in options["int8"] and "--corpus" not in options["int8"]
    assert {"--corpus", "--eval-corpus", "--steps", "--segment"} <= options["pretrain"]
    assert {"--train", "--dev", "--seconds", "--epochs"} <= options["finetune"]
    assert not options["pretrain"] & {"--train", "--dev", "--draws", "--dtypes", "--models"}
    assert not options["finetune"] & {"--corpus", "--steps", "--draws", "--dtypes"}
    assert not options["speed"] & {"--corpus", "--train", "--steps", "--seconds"}


def test_bench_subcommands_refuse_missing_and_foreign_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "pretrain", "--corpus", "c128"])  # --eval-corpus is required
    assert "--eval-corpus" in capsys.readouterr().err
    assert main(["bench", "finetune", "warp", "--train", "x"]) == 2
    assert "one of classify, tag, qa; got warp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "pretrain", "--corpus", "a", "--eval-corpus", "b", "--dtypes", "float32"])
    assert "unrecognized arguments: --dtypes float32" in capsys.readouterr().err


def test_bench_with_no_subcommand_is_bench_speed():
    from bertlab.cli.bench import default_subcommand

    readme = ["bench", "--repeats", "5", "--out", "benchmarks/cpu.json"]
    assert default_subcommand(readme) == ["bench", "speed", *readme[1:]]
    assert default_subcommand(["bench", "variable"]) == ["bench", "speed", "variable"]
    assert default_subcommand(["bench"]) == ["bench", "speed"]
    for kept in (["bench", "int8"], ["bench", "--help"], ["tokenize", "bench"]):
        assert default_subcommand(kept) == kept


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtypes", "float16"], "unknown dtype 'float16'; choose from float32, bfloat16"),
        (["--models", "/no/such/model"], "no model folder at '/no/such/model'"),
        (["--models", ""], "give at least one model and one dtype"),
        (["fixed128", "warp"], "unknown workload 'warp'"),
    ],
)
def test_bench_speed_bad_input_is_named_before_any_run(capsys, monkeypatch, argv, message):
    import bertlab.bench.speed as speed

    def never(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(speed, "bench_model", never)
    monkeypatch.setattr(speed, "bench_tokenizer", never)
    code, out, err = run(capsys, "bench", "speed", *argv)
    assert code == 2 and message in err and out == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["tokenizer"],
        ["speed", "latency", "--models", "tiny"],
        ["pretrain", "--corpus", "c", "--eval-corpus", "e"],
        ["finetune", "classify", "--train", "t", "--dev", "d"],
    ],
)
def test_bench_without_transformers_says_how_to_install_it(capsys, monkeypatch, argv):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    code, _, err = run(capsys, "bench", *argv)
    assert code == 2 and "pip install 'bertlab[bench]'" in err


def test_bench_data_folder_without_the_files_is_named(capsys, tmp_path):
    code, out, err = run(capsys, "bench", "tokenizer", "--data", str(tmp_path))
    assert code == 2 and f"--data {tmp_path}: no {tmp_path / 'sst2' / 'train.tsv'}" in err
    assert "tokens/s" not in out


def test_bench_ctrl_c_writes_what_was_measured(capsys, tmp_path, monkeypatch):
    """The first workload measured, Ctrl-C during the second: the report holds the first,
    says it was interrupted, and the command exits 130."""
    import bertlab.bench.speed as speed

    calls = []

    def measured(model, workload, dtype, *args):
        calls.append(workload)
        if len(calls) == 2:
            raise KeyboardInterrupt
        sides = {"bertlab": 2.0, "transformers": 1.0}
        return {
            "model": model,
            "workload": workload,
            "dtype": dtype,
            "tokens_per_s": sides,
            "ratio": 2.0,
            "peak_memory_mb": sides,
            "useful_share_of_matmul": {"bertlab": 0.5, "transformers": 0.25},
        }

    monkeypatch.setattr(speed, "bench_model", measured)
    out_file = tmp_path / "r.json"
    argv = ["bench", "variable", "train", "--models", "tiny", "--dtypes", "float32"]
    code, out, err = run(capsys, *argv, "--repeats", "1", "--out", str(out_file))
    assert code == 130 and calls == ["variable", "train"]
    assert "interrupted" in err and "tiny     variable" in out
    report = json.loads(out_file.read_text())
    assert report["interrupted"] is True
    assert [r["workload"] for r in report["results"]] == ["variable"]


# ============================================================================ the package
def test_no_package_file_reads_the_tests_or_the_shared_folder():
    """bertlab installed is bertlab: no path to the repository's tests/ or to ../shared in the
    package's code (a docstring naming a test file is fine)."""
    patterns = ("tests/fixtures", '"tests"', "'tests'", "shared/data", '"shared"', "'shared'")
    patterns += ("parents[2]", "parents[3]", ".parent.parent")
    found = [
        f"{path.relative_to(ROOT)}: {pattern}"
        for path in sorted((ROOT / "bertlab").rglob("*.py"))
        for pattern in patterns
        if pattern in path.read_text(encoding="utf-8")
    ]
    assert found == []


def test_the_benchmark_samples_are_package_data():
    from bertlab.bench.speed import SAMPLES, tokenizer_texts

    texts, origin = tokenizer_texts()
    assert SAMPLES.is_relative_to(ROOT / "bertlab") and "bundled samples" in origin
    assert len(texts) > 6000 and any("@-@" in t for t in texts)  # WikiText-2 lines included
    pyproject = (ROOT / "pyproject.toml").read_text()
    for path in (p for p in SAMPLES.iterdir() if p.name != "README.md"):
        assert f'"data/samples/*{path.suffix}"' in pyproject, f"{path.name} is not installed"
        assert path.name in (SAMPLES / "README.md").read_text(), f"{path.name}: no source given"

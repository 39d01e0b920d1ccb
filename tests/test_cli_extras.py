"""A command whose optional package is missing says so in one line, naming the package and the
extra that installs it, and exits 2 before any work: no traceback. A package is made missing
the way Python sees an absent one, ``sys.modules[name] = None`` (import fails, find_spec finds
nothing); the work each command would start is replaced by a function that fails the test if
it is called. bertlab.extras mirrors pyproject.toml's extras."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bertlab.bench.pretrain
import bertlab.bench.runtimes
import bertlab.bench.serve
import bertlab.bench.speed
import bertlab.cli.bench
import bertlab.train.curves
from bertlab.cli.main import main
from bertlab.extras import EXTRAS, MissingDependency, extra_for, require

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]


def never(*args, **kwargs):
    raise AssertionError("the command started its work")


@pytest.fixture
def no_work(monkeypatch):
    """Every long-running function the bench commands call, replaced by ``never``."""
    monkeypatch.setattr(bertlab.bench.speed, "bench_model", never)
    monkeypatch.setattr(bertlab.bench.speed, "bench_tokenizer", never)
    monkeypatch.setattr(bertlab.bench.runtimes, "bench_runtimes", never)
    monkeypatch.setattr(bertlab.bench.pretrain, "bench_pretrain", never)
    monkeypatch.setattr(bertlab.bench.serve, "reference_vectors", never)
    monkeypatch.setattr(bertlab.bench.serve, "running", never)


def plotted(tmp_path) -> list[str]:
    return ["--plot", str(tmp_path / "chart.png")]


CASES = {
    # name: (argv after "bertlab", the module made missing, the line's text)
    "bench serve, the load generator": (
        ["bench", "serve", "--seconds", "1"],
        "httpx",
        "httpx is not installed, needed for the load generator: pip install 'bertlab[serve-bench]'",
    ),
    "bench serve, bertlab's server": (
        ["bench", "serve", "--workloads", "batch1"],
        "uvicorn",
        "uvicorn is not installed, needed for bertlab's server: pip install 'bertlab[serve-bench]'",
    ),
    "bench serve --plot": (
        ["bench", "serve", "PLOT"],
        "matplotlib",
        "matplotlib is not installed, needed for --plot: pip install 'bertlab[serve-bench]'",
    ),
    "bench speed --plot": (
        ["bench", "speed", "latency", "--models", "tiny", "PLOT"],
        "matplotlib",
        "matplotlib is not installed, needed for --plot: pip install 'bertlab[bench]'",
    ),
    "bench runtimes --plot": (
        ["bench", "runtimes", "PLOT"],
        "matplotlib",
        "matplotlib is not installed, needed for --plot: pip install 'bertlab[runtimes]'",
    ),
    "bench pretrain --plot": (
        ["bench", "pretrain", "--corpus", "c", "--eval-corpus", "e", "PLOT"],
        "matplotlib",
        "matplotlib is not installed, needed for --plot: pip install 'bertlab[bench]'",
    ),
    "bench finetune --plot": (
        ["bench", "finetune", "classify", "--train", "t.tsv", "--dev", "d.tsv", "PLOT"],
        "matplotlib",
        "matplotlib is not installed, needed for --plot: pip install 'bertlab[bench]'",
    ),
    "bench tokenizer": (
        ["bench", "tokenizer"],
        "transformers",
        "pip install 'bertlab[bench]' (or pip install transformers)",
    ),
    "bench memory": (
        ["bench", "memory", "--model", "tiny"],
        "transformers",
        "pip install 'bertlab[bench]' (or pip install transformers)",
    ),
    "serve": (
        ["serve", "default"],
        "starlette",
        "bertlab serve needs starlette: pip install 'bertlab[serve]'",
    ),
    "export onnx": (
        ["export", "onnx", "default", "-o", "OUT"],
        "onnxruntime",
        "ONNX export needs onnxruntime: pip install 'bertlab[export]'",
    ),
    "plot": (
        ["plot", "RUN"],
        "matplotlib",
        "plotting needs matplotlib: pip install 'bertlab[plot]'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_missing_optional_package_is_one_line_naming_the_extra(
    case, no_work, monkeypatch, capsys, tmp_path
):
    argv, module, text = CASES[case]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    replace = {"PLOT": plotted(tmp_path), "OUT": [str(tmp_path / "onnx")], "RUN": [str(run)]}
    argv = [word for arg in argv for word in replace.get(arg, [arg])]
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (case, out, err)
    assert err.count("\n") == 1 and text in err, (case, err)
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "chart.png").exists() and not (tmp_path / "onnx").exists()


def test_bench_serve_without_httpx_is_one_line_in_a_fresh_process():
    """The issue's own case: ``bertlab bench serve`` in an interpreter where httpx cannot be
    imported ended in a traceback; it is now one line and exit status 2."""
    program = (
        "import sys; sys.modules['httpx'] = None; from bertlab.cli.main import main; "
        "sys.exit(main(['bench', 'serve']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "bertlab bench serve: error: httpx is not installed, needed for the load generator: "
        "pip install 'bertlab[serve-bench]'\n"
    )
    assert done.stdout == ""


def test_a_missing_optional_module_reached_unchecked_still_names_its_extra(monkeypatch, capsys):
    """A command that imports an optional package without checking for it first: the command
    line turns the ModuleNotFoundError into the same one line; a module that is no optional
    dependency is a fault, and stays a traceback."""

    def imports(name):
        def command(args):
            __import__(name)
            return 0

        return command

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setattr(bertlab.cli.bench, "cmd_bench_precision", imports("pyarrow"))
    assert main(["bench", "precision"]) == 2
    assert capsys.readouterr().err == (
        "bertlab bench precision: error: pyarrow is not installed: pip install 'bertlab[parquet]'\n"
    )
    monkeypatch.setattr(bertlab.cli.bench, "cmd_bench_precision", imports("no_such_module_here"))
    with pytest.raises(ModuleNotFoundError, match="no_such_module_here"):
        main(["bench", "precision"])


def test_require_names_every_missing_module_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "starlette", None)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(MissingDependency) as e:
        require(["starlette", "uvicorn", "orjson"], "serve", "the server")
    assert str(e.value) == (
        "starlette and uvicorn are not installed, needed for the server: "
        "pip install 'bertlab[serve]'"
    )
    assert isinstance(e.value, ValueError)  # bad input to every command: exit 2
    require(["orjson"], "serve")  # installed: nothing
    with pytest.raises(KeyError, match="does not install httpx"):
        require(["httpx"], "serve")  # a wrong extra is a fault of the caller
    assert [extra_for(m) for m in ("matplotlib", "transformers", "httpx", "openvino")] == [
        "plot",
        "bench",
        "serve-bench",
        "runtimes",
    ]
    assert extra_for("torch") is None


def test_the_extras_are_pyproject_toml_s():
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11 or later)")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    declared.pop("test")  # the development set, not a feature's
    declared.pop("docs")  # the documentation site's tools, not a feature's
    as_imported = {
        name: {re.split(r"[<>=!~;\[ ]", r)[0].lower().replace("-", "_") for r in requirements}
        for name, requirements in declared.items()
    }
    assert as_imported == {name: set(modules) for name, modules in EXTRAS.items()}

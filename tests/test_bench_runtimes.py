"""bertlab bench runtimes: every installed system runs the same batches, bertlab float32 agrees
with itself exactly and with transformers to float rounding, lower precisions are reported with
their cost, a peer that is missing is named as such, and bad arguments are refused first. Speed
is recorded in benchmarks/, never asserted here."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import skylake_x

from bertlab.bench import runtimes
from bertlab.bench.runtimes import batches, bench_runtimes, markdown_table, runtime_texts
from bertlab.nn import cpu
from bertlab.nn.precision import int8_supported

TEXTS = [
    "EU rejects German call to boycott British lamb.",
    "Peter Blackburn",
    "The European Commission said on Thursday it disagreed with German advice to consumers.",
    "Germany 's representative to the European Union 's veterinary committee Werner Zwingmann "
    "said on Wednesday consumers should buy sheepmeat from countries other than Britain.",
    "Rare Hendrix song draft sells for almost $ 17,000 .",
]


def test_the_workloads_hold_the_same_texts_in_their_orders():
    from bertlab import BertTokenizer, bundled_model_dir

    tok = BertTokenizer.from_pretrained(bundled_model_dir())
    texts, origin = runtime_texts()
    assert len(texts) == runtimes.TEXTS and "SST-2" in origin
    file_order = batches(tok, texts[:70], "file-order")
    ordered = batches(tok, texts[:70], "sorted")
    one = batches(tok, texts[:70], "batch-1")
    assert [len(b["input_ids"]) for b in file_order] == [32, 32, 6]
    assert len(one) == 64 and all(b["attention_mask"].all() for b in one)
    real = [int(b["attention_mask"].sum()) for b in file_order]
    assert sum(real) == sum(int(b["attention_mask"].sum()) for b in ordered)
    lengths = [int(n) for b in ordered for n in b["attention_mask"].sum(1)]
    assert lengths == sorted(lengths)


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory) -> Path:
    """The bundled model's first layer alone, with its tokenizer: every runner's set-up (the
    ONNX export and its optimizer, int8's calibration) takes a third of the six layers' time,
    and int8 still differs from float32 by a measurable amount."""
    from bertlab import BertModel, BertTokenizer, bundled_model_dir

    folder = tmp_path_factory.mktemp("one-layer")
    BertModel.from_pretrained(bundled_model_dir(), num_hidden_layers=1).save_pretrained(folder)
    BertTokenizer.from_pretrained(bundled_model_dir()).save_pretrained(folder)
    return folder


def test_every_installed_system_runs_and_reports_its_agreement(monkeypatch, one_layer):
    # openvino hidden as if not installed: a None in sys.modules makes its import fail (a hook on
    # builtins.__import__ would do the same but slow every other import of the run)
    monkeypatch.setitem(sys.modules, "openvino", None)
    report = bench_runtimes(
        one_layer,
        systems=(
            "bertlab-fp32",
            "bertlab-int8",
            "transformers-fp32",
            "onnxruntime-fp32",
            "openvino-f32",
        ),
        workloads=("sorted", "batch-1"),
        repeats=1,
        threads=2,
        texts=TEXTS,
    )
    missing = {"openvino-f32": "openvino is not installed (pip install 'bertlab[runtimes]')"}
    if int8_supported() is not None:  # (Arm, x86 without AVX2) named, the others still run
        missing["bertlab-int8"] = int8_supported()
    assert report["unavailable"] == missing
    rows = report["workloads"]["sorted"]["systems"]
    ran = {"bertlab-fp32", "bertlab-int8", "transformers-fp32", "onnxruntime-fp32"} - set(missing)
    assert set(rows) == ran
    assert rows["bertlab-fp32"]["cosine_min"] == pytest.approx(1.0, abs=1e-6)
    assert rows["transformers-fp32"]["cosine_min"] > 0.99999
    assert rows["onnxruntime-fp32"]["cosine_min"] > 0.9999
    if "bertlab-int8" in rows:
        assert 0.5 < rows["bertlab-int8"]["cosine_mean"] < 1.0  # int8 costs something, measured
    assert rows["transformers-fp32"]["relative_to_transformers_fp32"] == 1.0
    assert report["workloads"]["batch-1"]["padding_share"] == 0.0
    # the CPU's class and bertlab's kernels on it, as bertlab.nn.cpu chose them
    assert report["cpu"] == cpu.current().describe()
    assert time.strptime(report["date"], "%Y-%m-%d %H:%M UTC")  # when it ran (a bad form raises)
    line = runtimes.cpu_line(report["cpu"])
    assert line.startswith(f"CPU class {cpu.current().cpu_class} (")
    assert (cpu.current().int8_kernel or "no int8") in line
    few, f32 = cpu.current().few_rows, cpu.current().float32_kernel
    assert (f"float32 products on {f32};" in line) == (f32 is not None)
    # (few rows are named where they may take another kernel than the rest)
    shown = few is not None and f32 in (None, "onednn")
    assert (f"float32 products of few rows on {few}" in line) == shown
    assert ("prepacked above few rows" in line) == cpu.current().int8_prepacked
    for precision, cap in cpu.current().compiled_tokens.items():
        assert f"{precision} (batches of at most {cap} positions)" in line
    avx2 = {**report["cpu"], "compiled": ["float32"], "compiled_tokens": {"float32": 48}}
    assert "compiled: float32 (batches of at most 48 positions);" in runtimes.cpu_line(avx2)
    table = markdown_table(report)
    assert table.count("\n") == 3 and "| sorted (" in table and "| batch-1 (0% padding) |" in table
    # each bertlab system paired round by round with the fastest float32 peer that ran
    fp32 = [p for p in report["workloads"]["sorted"]["paired"] if p["system"] == "bertlab-fp32"]
    assert len(fp32) == 1 and fp32[0]["peer"] in ("transformers-fp32", "onnxruntime-fp32")
    assert len(rows["bertlab-fp32"]["round_seconds"]) == 1  # (repeats=1)
    assert json.loads(json.dumps(report)) == report


def test_rounds_are_paired_with_the_fastest_peer_of_the_same_precision():
    # a machine whose speed halves in some rounds: each round's ratio is what is reported
    drift = [1.0, 2.0, 1.0, 2.0, 2.0]
    times = {
        "bertlab-int8": [0.8 * d for d in drift],
        "onnxruntime-int8": [1.0 * d for d in drift],
        "bertlab-fp32": [2.0 * d for d in drift],
        "transformers-fp32": [4.0 * d for d in drift],
        "onnxruntime-fp32": [3.0 * d for d in drift],  # the fastest float32 peer
        "bertlab-bf16": [1.0 * d for d in drift],  # (no bfloat16 peer ran: no pair)
    }
    times["bertlab-int8"][1] = 2.0  # one round where bertlab ran as slowly as its peer
    pairs = {p["system"]: p for p in runtimes.paired(times)}
    assert set(pairs) == {"bertlab-int8", "bertlab-fp32"}
    assert pairs["bertlab-int8"]["peer"] == "onnxruntime-int8"
    assert pairs["bertlab-int8"]["median"] == pytest.approx(1.25)
    assert pairs["bertlab-int8"]["low"] == pytest.approx(1.125)  # (1.0, 1.25, 1.25, 1.25, 1.25)
    assert pairs["bertlab-int8"]["high"] == pytest.approx(1.25)
    assert pairs["bertlab-fp32"]["peer"] == "onnxruntime-fp32"
    assert pairs["bertlab-fp32"]["median"] == pytest.approx(1.5)
    one = runtimes.paired({"bertlab-int8": [2.0], "onnxruntime-int8": [3.0]})
    assert one == [
        {"system": "bertlab-int8", "peer": "onnxruntime-int8", "median": 1.5, "low": 1.5,
         "high": 1.5}
    ]  # fmt: skip
    report = {"workloads": {"batch-1": {"paired": one}, "sorted": {}}}
    assert runtimes.paired_lines(report) == [
        "batch-1: bertlab-int8 1.50x onnxruntime-int8 round by round (quartiles 1.50-1.50)"
    ]


def _report(cls, rows):
    systems = {name: {"tokens_per_s": rate} for name, rate in rows.items()}
    return {"benchmark": "runtimes", "cpu": {"class": cls},
            "workloads": {"batch-1": {"systems": systems}}}  # fmt: skip


def test_saved_reports_are_read_back_side_by_side(tmp_path, capsys):
    """``--compare``: each report's bertlab systems over the fastest peer of their precision
    (ratio of the medians), eager and compiled, a row per report and workload; nothing timed."""
    from bertlab.cli.main import main

    a = _report("avx2", {"bertlab-fp32": 90.0, "bertlab-fp32-compiled": 120.0,
                         "onnxruntime-fp32": 100.0, "transformers-fp32": 50.0,
                         "bertlab-int8": 200.0, "onnxruntime-int8": 160.0,
                         "bertlab-bf16": 70.0})  # fmt: skip
    cells = runtimes.against_peers(a)["batch-1"]
    assert cells["fp32"] == {"peer": "onnxruntime-fp32", "eager": 0.9, "compiled": 1.2}
    assert cells["int8"] == {"peer": "onnxruntime-int8", "eager": 1.25, "compiled": None}
    assert "bf16" not in cells  # (no bfloat16 peer ran)
    b = _report("amx", {"openvino-bf16": 100.0, "bertlab-bf16-compiled": 150.0})
    b["date"] = "2026-11-29 05:45 UTC"  # (reports before that day have none)
    assert runtimes.side_by_side([("a.json", a), ("b.json", b)]).splitlines()[2:] == [
        "| `a.json` | avx2 | batch-1 | 0.90x / 1.20x onnxruntime-fp32 | not run "
        "| 1.25x / - onnxruntime-int8 |",
        "| `b.json` (2026-11-29) | amx | batch-1 | not run | - / 1.50x openvino-bf16 | not run |",
    ]
    for name, report in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(report))
    code = main(["bench", "runtimes", "--compare", str(tmp_path / "a.json"),
                 str(tmp_path / "b.json")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "| `a.json` | avx2 | batch-1 | 0.90x / 1.20x" in out
    assert "| `b.json` (2026-11-29) | amx |" in out


def test_a_file_that_is_not_a_runtimes_report_is_refused_by_name(tmp_path, capsys):
    from bertlab.cli.main import main

    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "speed.json").write_text(json.dumps({"benchmark": "speed"}))
    (tmp_path / "ok.json").write_text(json.dumps(_report("avx2", {})))
    for args, message in (
        ([tmp_path / "missing.json"], "missing.json: no such report"),
        ([tmp_path / "text.json"], "text.json: not a JSON report"),
        ([tmp_path / "speed.json"], "not a report of bertlab bench runtimes (its benchmark is "
                                    "'speed')"),
        ([tmp_path / "ok.json", "--out", tmp_path / "x.json"], "no --out or --plot"),
    ):  # fmt: skip
        code = main(["bench", "runtimes", "--compare", *map(str, args)])
        err = capsys.readouterr().err
        assert code == 2 and message in err, err
    assert not (tmp_path / "x.json").exists()


def test_the_performance_pages_classes_table_is_what_the_command_prints():
    """docs/performance.md's table of the classes side by side is the output of the command
    above it, on the records it names, which the repository holds."""
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "performance.md").read_text(encoding="utf-8")
    section = page.split("## Where each class stands\n", 1)[1].split("\n## ", 1)[0]
    command = section.split("```text\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    assert command.split()[:4] == ["bertlab", "bench", "runtimes", "--compare"]
    files = command.split()[4:]
    assert {runtimes.read_report(root / f)["cpu"]["class"] for f in files} >= {
        "amx",
        "avx512-bf16",
        "avx2",
    }  # (every class a machine of the project's measured)
    table = [line for line in section.splitlines() if line.startswith("| ")]
    reports = [(Path(f).name, runtimes.read_report(root / f)) for f in files]
    assert "\n".join(table) == runtimes.side_by_side(reports)


def test_quality_figures():
    a = np.eye(3, dtype=np.float32)
    q = runtimes.quality(a, a)
    assert q == {"cosine_mean": 1.0, "cosine_min": 1.0, "nearest_neighbour_kept": 1.0}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--systems", "tensorrt-fp32"], "unknown system 'tensorrt-fp32'"),
        (["--workloads", "batch-8"], "unknown workload 'batch-8'"),
        (["--repeats", "0"], "repeats must be at least 1, got 0"),
        (["--data", "/nowhere"], "no /nowhere/conll2003/train.txt"),
        (["--plot", "/nowhere/chart.png"], "the folder does not exist"),
    ],
)
def test_bad_arguments_are_refused_before_work(args, message, capsys, monkeypatch):
    """Exit status 2 and the reason on standard error, before any system is loaded (the command
    line in this process, as ``bertlab bench runtimes`` runs it)."""
    from bertlab.cli.main import main

    loaded = []
    monkeypatch.setattr(runtimes, "make_runner", lambda name, *a: loaded.append(name))
    code = main(["bench", "runtimes", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and not loaded, err


def test_the_compiled_systems_are_the_models_behind_compiled(monkeypatch):
    """bertlab-*-compiled runs its precision's model through bertlab.nn.compiled.Compiled (which
    tests/test_compiled.py holds to the eager results; compiling here would only repeat it), and
    is reported unavailable, with the reason, where nothing can be compiled."""
    from bertlab import BertModel, bundled_model_dir
    from bertlab.nn import compiled

    wrapped = []

    class Recorded(compiled.Compiled):
        def __init__(self, model):
            wrapped.append(model)
            super().__init__(model)

    monkeypatch.setattr(compiled, "Compiled", Recorded)
    monkeypatch.setattr(Recorded, "available", staticmethod(lambda: None))
    # a CPU whose policy compiles float32 (what this one's compiles is tests/test_cpu.py's)
    everything = frozenset(("float32", "bfloat16", "int8"))
    here = cpu.current()
    monkeypatch.setattr(
        cpu, "_CURRENT", [replace(here, compiled=everything, not_compiled={}, compiled_tokens={})]
    )
    runtimes.make_runner("bertlab-fp32-compiled", bundled_model_dir(), None, 2)
    (model,) = wrapped
    assert isinstance(model, BertModel) and not model.training
    assert model.embeddings.word_embeddings.weight.dtype == torch.float32
    monkeypatch.setattr(Recorded, "available", staticmethod(lambda: "no C++ compiler here"))
    with pytest.raises(runtimes.Unavailable, match="no C\\+\\+ compiler here"):
        runtimes.make_runner("bertlab-int8-compiled", bundled_model_dir(), None, 2)
    # where Compiled would call the model itself, the row would repeat the uncompiled one
    monkeypatch.setattr(Recorded, "available", staticmethod(lambda: None))
    monkeypatch.setattr(cpu, "_CURRENT", [cpu.policy(skylake_x(here.features), {})])
    with pytest.raises(runtimes.Unavailable, match="runs the float32 model itself on this CPU"):
        runtimes.make_runner("bertlab-fp32-compiled", bundled_model_dir(), None, 2)


def test_busy_neighbours_spin_while_timed_and_are_gone_after():
    def cpu_ticks(pid: int) -> int:  # user + system time, /proc/PID/stat fields 14 and 15
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    with runtimes.neighbours(2) as spinning:
        assert len(spinning) == 2 and all(p.poll() is None for p in spinning)
        time.sleep(0.5)
        assert all(cpu_ticks(p.pid) > 0 for p in spinning)  # spinning, not sleeping
    assert all(p.poll() is not None for p in spinning)


def test_the_busy_run_reports_what_each_system_kept():
    report = bench_runtimes(
        systems=("bertlab-fp32",),
        workloads=("batch-1",),
        repeats=1,
        threads=1,
        texts=TEXTS[:8],
        busy=1,
    )
    row = report["workloads"]["batch-1"]["systems"]["bertlab-fp32"]
    assert report["busy_neighbours"] == 1
    assert row["kept"] == pytest.approx(row["busy_tokens_per_s"] / row["tokens_per_s"])
    assert "| batch-1, kept beside 1 busy processes |" in markdown_table(report)
    with pytest.raises(
        ValueError, match="busy must be between 0 and 64 neighbour processes, got -1"
    ):
        bench_runtimes(systems=("bertlab-fp32",), texts=TEXTS[:2], busy=-1)


def test_the_chart_gives_every_system_its_own_colour(tmp_path, monkeypatch):
    """matplotlib's default cycle has 10 colours: the 11th system's bars took the first one's."""
    import matplotlib.figure

    saved = []
    save = matplotlib.figure.Figure.savefig

    def keep(figure, *args, **kwargs):
        saved.append(figure)
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    every = {
        s: {"relative_to_transformers_fp32": 1.0 + k / 10} for k, s in enumerate(runtimes.SYSTEMS)
    }
    report = {
        "workloads": {"sorted": {"systems": every}, "batch-1": {"systems": every}},
        "machine": {"cpu": "a CPU"},
        "threads": 2,
    }
    runtimes.plot(report, tmp_path / "chart.png")
    bars = saved[0].axes[0].containers
    colours = [tuple(b.patches[0].get_facecolor()) for b in bars]
    assert len(bars) == len(runtimes.SYSTEMS) == 11
    assert len(set(colours)) == len(colours), colours
    assert (tmp_path / "chart.png").stat().st_size > 0

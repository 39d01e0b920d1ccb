"""bertlab bench kernels: every float32 kernel this CPU runs is timed on the same model and
sentences, the class's kernel is kept unless another is clearly faster, and a saved choice is
what the policy of a later process on this CPU runs, unless a kernel is forced, the file is for
another CPU or names a kernel this one cannot run. Speed is recorded in benchmarks/, never
asserted here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.bench.kernels import (
    DROP,
    FLOOR,
    MARGIN,
    SAVE_ROUNDS,
    WINS,
    bench_kernels,
    choose,
    save,
)
from bertlab.bench.runtimes import cpu_line
from bertlab.cli.main import main
from bertlab.nn import cpu, measured


def x86(top: str, vendor: str = "GenuineIntel", family: int = 6) -> cpu.Features:
    names = [n for n, _ in cpu.LEVELS if n != "avx2_vnni"]
    flags = {f for n, fl in cpu.LEVELS if n in names[: names.index(top) + 1] for f in fl}
    return cpu.Features(
        arch="x86_64",
        model=f"simulated {top}",
        flags=frozenset(flags),
        vendor=vendor,
        family=family,
    )


def record(
    folder: Path, f: cpu.Features, float32: str | None = None, int8: str | None = None, **changes
) -> Path:
    """A file as ``bench kernels --save`` writes it, for the features ``f``."""
    path = measured.measured_path(f, {measured.MEASURED_DIR: str(folder)})
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"key": measured.machine_key(f), "date": "2026-11-29 09:00 UTC", **changes}
    for precision, kernel in (("float32", float32), ("int8", int8)):
        if kernel is not None:
            data[precision] = {"kernel": kernel, "why": "1.20x the class's kernel"}
    path.write_text(json.dumps(data))
    return path


def entry(class_kernel: str, paired: dict[str, dict[str, float]]) -> dict:
    """One precision of a report of bench_kernels' shape: paired ratios by workload, kernel."""
    kernels = list(next(iter(paired.values())))
    return {
        "class_kernel": class_kernel,
        "kernels": kernels,
        "workloads": {
            w: {
                "kernels": {
                    k: {"paired": r, "wins": float(r > 1), "cosine_to_float32": 0.999}
                    for k, r in by.items()
                }
            }
            for w, by in paired.items()
        },
    }


def test_the_class_kernel_is_kept_unless_another_is_clearly_faster_everywhere():
    close = entry(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx512": MARGIN - 0.02},
            "sorted": {"onednn": 1.0, "sgemm-avx512": MARGIN},
        },
    )
    assert choose(close)[0] == "onednn" and "class's kernel" in choose(close)[1]
    faster = entry(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx512": 1.30, "sgemm-avx2": 1.1},
            "sorted": {"onednn": 1.0, "sgemm-avx512": 1.02, "sgemm-avx2": 1.1},
        },
    )
    kernel, why = choose(faster)
    assert kernel == "sgemm-avx512" and "1.15x the class's kernel (onednn)" in why
    # much faster on one workload, slower than FLOOR on the other: the class's
    uneven = entry(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx2": 1.5},
            "sorted": {"onednn": 1.0, "sgemm-avx2": FLOOR - 0.01},
        },
    )
    assert choose(uneven)[0] == "onednn"
    # faster by the median of the rounds, but not in enough of them: the class's
    erratic = entry("onednn", {"batch-1": {"onednn": 1.0, "sgemm-avx2": 1.2}})
    assert choose(erratic)[0] == "sgemm-avx2"
    erratic["workloads"]["batch-1"]["kernels"]["sgemm-avx2"]["wins"] = WINS - 0.15
    assert choose(erratic)[0] == "onednn"
    # faster everywhere, but further from float32's embeddings than the class's: the class's
    apart = entry("onednn", {"batch-1": {"onednn": 1.0, "sgemm-avx2": 1.2}})
    kernel = apart["workloads"]["batch-1"]["kernels"]["sgemm-avx2"]
    kernel["cosine_to_float32"] = 0.999 - DROP + 1e-6
    assert choose(apart)[0] == "sgemm-avx2"  # (as far as DROP allows)
    kernel["cosine_to_float32"] = 0.999 - DROP - 1e-4
    assert choose(apart)[0] == "onednn"


def test_a_saved_choice_is_what_the_policy_runs_on_that_cpu_only(tmp_path):
    env = {measured.MEASURED_DIR: str(tmp_path)}
    skylake = x86("avx512_core")
    assert cpu.policy(skylake, env).float32_kernel == "onednn"  # the class's, nothing saved
    path = record(tmp_path, skylake, float32="sgemm-avx512")
    p = cpu.policy(skylake, env)
    assert p.float32_kernel == "sgemm-avx512"
    assert p.float32_kernel_why.startswith("measured here") and str(path) in p.float32_kernel_why
    assert "1.20x the class's kernel" in p.float32_kernel_why
    assert p.describe()["float32_kernel"] == "sgemm-avx512"
    assert "not measured faster than the model on this class" in p.not_compiled["float32"]
    line = "float32 products on sgemm-avx512 (measured on this machine: bertlab bench kernels"
    assert line in cpu_line(p.describe())  # (what bench runtimes prints above its table)
    # a kernel forced by name still comes first
    forced = cpu.policy(skylake, {**env, "BERTLAB_FLOAT32_KERNEL": "onednn"})
    assert forced.float32_kernel == "onednn" and "forced" in forced.float32_kernel_why
    # another CPU (here: another model name) reads a file of its own, which does not exist
    other = dataclasses.replace(skylake, model="another model")
    assert measured.measured_path(other, env) != path
    assert cpu.policy(other, env).float32_kernel == "onednn"


def test_a_saved_int8_kernel_runs_where_it_rounds_as_the_class_kernel_does(tmp_path):
    env = {measured.MEASURED_DIR: str(tmp_path)}
    xeon = x86("avx512_core_amx")  # the class's int8 kernel: onednn-s8, 8-bit activations
    assert cpu.policy(xeon, env).int8_kernel == "onednn-s8"
    record(tmp_path, xeon, int8="u8-vnni")  # bertlab's own VNNI kernel, 8 bits too
    p = cpu.policy(xeon, env)
    assert p.int8_kernel == "u8-vnni" and p.int8_kernel_why.startswith("measured here")
    assert p.int8_fallback == "onednn-s8"  # where u8-vnni cannot be built in the process
    assert p.int8_levels == 127
    # the compiled program calling u8-vnni was not measured on this class: int8 runs the model
    assert "int8" not in p.compiled and "measured only on the" in p.not_compiled["int8"]
    assert "int8" in cpu.policy(xeon, {}, measured=False).compiled
    record(tmp_path, xeon, float32="sgemm-avx512", int8="u8-vnni")  # (the same for float32)
    p = cpu.policy(xeon, env)
    assert p.float32_kernel == "sgemm-avx512" and "float32" not in p.compiled
    assert "calling the sgemm-avx512 kernel was measured only" in p.not_compiled["float32"]
    assert "int8 on u8-vnni (8-bit activations) (measured on this machine" in cpu_line(p.describe())
    forced = cpu.policy(xeon, {**env, "BERTLAB_INT8_KERNEL": "fbgemm-u8"})
    assert forced.int8_kernel == "fbgemm-u8" and "forced" in forced.int8_kernel_why
    # u8-avx2 keeps 7 bits: other numbers than the class's kernel, so it is passed over
    path = record(tmp_path, xeon, int8="u8-avx2")
    p = cpu.policy(xeon, env)
    assert p.int8_kernel == "onednn-s8" and p.int8_levels == 127
    assert f"{path} was passed over: its int8 kernel u8-avx2 rounds the activations to other "
    assert "levels than onednn-s8" in p.int8_kernel_why and str(path) in p.int8_kernel_why
    # a kernel this CPU cannot run (VNNI on an AVX2 CPU) is passed over, naming what it lacks
    zen3 = x86("avx2", vendor="AuthenticAMD", family=25)
    path = record(tmp_path, zen3, int8="u8-vnni")
    p = cpu.policy(zen3, env)
    assert p.int8_kernel == "u8-avx2" and "needs AVX512-VNNI" in p.int8_kernel_why


@pytest.mark.parametrize("case", ["another key", "not a kernel", "cannot run", "not json"])
def test_a_file_that_does_not_hold_here_is_passed_over_saying_why(tmp_path, case):
    env = {measured.MEASURED_DIR: str(tmp_path)}
    haswell = x86("avx2")  # Intel AVX2: the class's kernel is oneDNN's
    if case == "another key":
        path = record(tmp_path, haswell, float32="sgemm-avx2", key="0123456789abcdef")
        said = "it was not measured on this CPU with this PyTorch"
    elif case == "not a kernel":
        path = record(tmp_path, haswell, float32="fastest")
        said = "its float32 kernel 'fastest' cannot run here"
    elif case == "cannot run":  # an AVX-512 kernel for a CPU without AVX-512F
        path = record(tmp_path, haswell, float32="sgemm-avx512")
        said = "its float32 kernel 'sgemm-avx512' cannot run here"
    else:
        path = record(tmp_path, haswell, float32="sgemm-avx2")
        path.write_text("{half a file")
        said = "it could not be read"
    p = cpu.policy(haswell, env)
    assert p.float32_kernel == "onednn"
    assert f"{path} was passed over: {said}" in p.float32_kernel_why


TEXTS = [
    "EU rejects German call to boycott British lamb.",
    "Peter Blackburn",
    "Rare Hendrix song draft sells for almost $ 17,000 .",
    "The dog barked.",
]


def test_every_kernel_this_cpu_runs_is_timed_and_the_saved_choices_are_what_runs_next(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(measured.MEASURED_DIR, str(tmp_path))
    own = cpu.policy(cpu.features(), {}, measured=False)
    if own.float32_kernel is None and own.int8_kernel is None:  # (Arm, x86 without AVX2)
        with pytest.raises(ValueError, match="there is no kernel to choose on this CPU"):
            bench_kernels(texts=TEXTS)
        return
    rep = bench_kernels(texts=TEXTS, workloads=("batch-1",), repeats=SAVE_ROUNDS, threads=1)
    path = Path(save(rep))
    saved = json.loads(path.read_text())
    assert path == measured.measured_path(cpu.features()) and saved["key"] == rep["key"]
    for precision, names in (("float32", cpu.FLOAT32_KERNELS), ("int8", cpu.INT8_KERNELS)):
        e = rep["precisions"][precision]
        if e["class_kernel"] is None:  # (said by name, nothing timed, nothing saved)
            assert e["left_out"][precision] and precision not in saved
            continue
        assert e["class_kernel"] == getattr(own, f"{precision}_kernel") in e["kernels"]
        assert set(e["kernels"]) | set(e["left_out"]) == set(names)
        rows = e["workloads"]["batch-1"]["kernels"]
        assert set(rows) == set(e["kernels"]) and rows[e["class_kernel"]]["paired"] == 1.0
        assert all(len(r["round_seconds"]) == SAVE_ROUNDS for r in rows.values())
        assert all(r["tokens_per_s"] > 0 and 0 <= r["wins"] <= 1 for r in rows.values())
        # the float32 kernels give float32's embeddings up to rounding; the int8 ones meet the
        # int8 quality bar (a mean cosine of at least 0.995)
        bar = 0.99999 if precision == "float32" else 0.995
        assert all(r["cosine_to_float32"] > bar for r in rows.values()), rows
        assert saved[precision]["kernel"] == e["choice"] in e["kernels"]
    if own.int8_kernel is not None:  # kernels rounding to other levels compete with nothing
        levels = own.int8_levels
        for kernel in rep["precisions"]["int8"]["kernels"]:
            forced = cpu.policy(cpu.features(), {"BERTLAB_INT8_KERNEL": kernel}, measured=False)
            assert forced.int8_levels == levels
    # a later process on this CPU runs the saved choices, and says where they came from
    probe = (
        "from bertlab.nn import cpu; p = cpu.current(); "
        "print(p.float32_kernel, p.float32_kernel_why); print(p.int8_kernel, p.int8_kernel_why)"
    )
    later = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    for line, precision in zip(later.stdout.splitlines(), ("float32", "int8"), strict=True):
        if precision in saved:
            assert line.startswith(f"{saved[precision]['kernel']} measured here"), line
            assert str(path) in line


def test_the_command_prints_each_kernel_and_the_choice(capsys):
    if cpu.current().float32_kernel is None:
        assert main(["bench", "kernels", "--precisions", "float32"]) == 2
        assert "there is no kernel to choose" in capsys.readouterr().err
        return
    args = ["--precisions", "float32", "--workloads", "batch-1", "--repeats", "1"]
    assert main(["bench", "kernels", *args, "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"| {cpu.current().float32_kernel} (the class's) | " in out
    assert "| onednn | " in out and "float32 choice: " in out and "saved" not in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repeats", "0"], "repeats must be at least 1, got 0"),
        (["--workloads", "batch-1,file-order"], "unknown workload 'file-order'"),
        (["--precisions", "bfloat16"], "unknown precision 'bfloat16'"),
        (["--save", "--repeats", "3"], "--save needs at least 5 rounds (--repeats), got 3"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(capsys, args, message):
    assert main(["bench", "kernels", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_for_the_choices_that_cannot_be_written_is_refused_before_timing(
    tmp_path, monkeypatch, capsys
):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv(measured.MEASURED_DIR, str(blocked / "measured"))
    assert main(["bench", "kernels", "--save", "--model", str(tmp_path / "no model")]) == 2
    err = capsys.readouterr().err
    assert f"--save: the choices cannot be kept in {blocked / 'measured'}" in err
    assert measured.MEASURED_DIR in err

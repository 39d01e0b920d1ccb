"""bertlab bench kernels: every float32 kernel this CPU runs is timed on the same model and
sentences, the class's kernel is kept unless another is clearly faster, and a saved choice is
what the policy of a later process on this CPU runs, unless a kernel is forced, the file is for
another CPU or names a kernel this one cannot run. Speed is recorded in benchmarks/, never
asserted here."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.bench.kernels import FLOOR, MARGIN, choose
from bertlab.bench.runtimes import cpu_line
from bertlab.cli.main import main
from bertlab.nn import cpu


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


def record(folder: Path, f: cpu.Features, kernel: str, **changes) -> Path:
    path = cpu.measured_path(f, {cpu.MEASURED_DIR: str(folder)})
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "key": cpu.machine_key(f),
        "float32_kernel": kernel,
        "date": "2026-11-29 09:00 UTC",
        "why": "1.20x the class's kernel (onednn)",
        **changes,
    }
    path.write_text(json.dumps(data))
    return path


def report(class_kernel: str, paired: dict[str, dict[str, float]]) -> dict:
    """A report of bench_kernels' shape: paired ratios by workload and kernel."""
    kernels = list(next(iter(paired.values())))
    return {
        "class_kernel": class_kernel,
        "kernels": kernels,
        "workloads": {
            w: {"kernels": {k: {"paired": r} for k, r in by.items()}} for w, by in paired.items()
        },
    }


def test_the_class_kernel_is_kept_unless_another_is_clearly_faster_everywhere():
    close = report(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx512": MARGIN - 0.02},
            "sorted": {"onednn": 1.0, "sgemm-avx512": MARGIN},
        },
    )
    assert choose(close)[0] == "onednn" and "class's kernel" in choose(close)[1]
    faster = report(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx512": 1.30, "sgemm-avx2": 1.1},
            "sorted": {"onednn": 1.0, "sgemm-avx512": 1.02, "sgemm-avx2": 1.1},
        },
    )
    kernel, why = choose(faster)
    assert kernel == "sgemm-avx512" and "1.15x the class's kernel (onednn)" in why
    # much faster on one workload, slower than FLOOR on the other: the class's
    uneven = report(
        "onednn",
        {
            "batch-1": {"onednn": 1.0, "sgemm-avx2": 1.5},
            "sorted": {"onednn": 1.0, "sgemm-avx2": FLOOR - 0.01},
        },
    )
    assert choose(uneven)[0] == "onednn"


def test_a_saved_choice_is_what_the_policy_runs_on_that_cpu_only(tmp_path):
    env = {cpu.MEASURED_DIR: str(tmp_path)}
    skylake = x86("avx512_core")
    assert cpu.policy(skylake, env).float32_kernel == "onednn"  # the class's, nothing saved
    path = record(tmp_path, skylake, "sgemm-avx512")
    p = cpu.policy(skylake, env)
    assert p.float32_kernel == "sgemm-avx512"
    assert p.float32_kernel_why.startswith("measured here") and str(path) in p.float32_kernel_why
    assert "1.20x the class's kernel" in p.float32_kernel_why
    assert p.describe()["float32_kernel"] == "sgemm-avx512"
    line = "float32 products on sgemm-avx512 (measured on this machine: bertlab bench kernels"
    assert line in cpu_line(p.describe())  # (what bench runtimes prints above its table)
    # a kernel forced by name still comes first
    forced = cpu.policy(skylake, {**env, "BERTLAB_FLOAT32_KERNEL": "onednn"})
    assert forced.float32_kernel == "onednn" and "forced" in forced.float32_kernel_why
    # another CPU (here: another model name) reads a file of its own, which does not exist
    other = dataclasses.replace(skylake, model="another model")
    assert cpu.measured_path(other, env) != path
    assert cpu.policy(other, env).float32_kernel == "onednn"


@pytest.mark.parametrize("case", ["another key", "not a kernel", "cannot run", "not json"])
def test_a_file_that_does_not_hold_here_is_passed_over_saying_why(tmp_path, case):
    env = {cpu.MEASURED_DIR: str(tmp_path)}
    haswell = x86("avx2")  # Intel AVX2: the class's kernel is oneDNN's
    if case == "another key":
        path = record(tmp_path, haswell, "sgemm-avx2", key="0123456789abcdef")
        said = "it was not measured on this CPU with this PyTorch"
    elif case == "not a kernel":
        path = record(tmp_path, haswell, "fastest")
        said = "its kernel 'fastest' cannot run here"
    elif case == "cannot run":  # an AVX-512 kernel for a CPU without AVX-512F
        path = record(tmp_path, haswell, "sgemm-avx512")
        said = "its kernel 'sgemm-avx512' cannot run here"
    else:
        path = record(tmp_path, haswell, "sgemm-avx2")
        path.write_text("{half a file")
        said = "it could not be read"
    p = cpu.policy(haswell, env)
    assert p.float32_kernel == "onednn"
    assert f"{path} was passed over: {said}" in p.float32_kernel_why


def test_the_command_times_every_kernel_this_cpu_runs_and_saves_its_choice(tmp_path):
    env = {**os.environ, cpu.MEASURED_DIR: str(tmp_path)}
    out = tmp_path / "report.json"
    command = [
        sys.executable,
        "-m",
        "bertlab.cli.main",
        "bench",
        "kernels",
        "--workloads",
        "batch-1",
        "--repeats",
        "1",
        "--threads",
        "1",
        "--save",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if cpu.current().float32_kernel is None:  # (Arm, x86 without AVX2: nothing to choose)
        assert done.returncode == 2 and "there is no float32 kernel to choose" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    rep = json.loads(out.read_text())
    assert set(rep["kernels"]) | set(rep["left_out"]) == set(cpu.FLOAT32_KERNELS)
    assert "onednn" in rep["kernels"] and rep["class_kernel"] in rep["kernels"]
    rows = rep["workloads"]["batch-1"]["kernels"]
    assert rows[rep["class_kernel"]]["paired"] == 1.0
    assert all(r["tokens_per_s"] > 0 and len(r["round_seconds"]) == 1 for r in rows.values())
    assert f"choice: {rep['choice']}" in done.stdout and "saved: " in done.stdout
    # a later process on this CPU runs the saved choice, and says where it came from
    saved = cpu.measured_path(cpu.features(), env)
    assert json.loads(saved.read_text())["float32_kernel"] == rep["choice"]
    probe = (
        "from bertlab.nn import cpu; p = cpu.current(); "
        "print(p.float32_kernel, p.float32_kernel_why)"
    )
    later = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert later.stdout.startswith(f"{rep['choice']} measured here") and str(saved) in later.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repeats", "0"], "repeats must be at least 1, got 0"),
        (["--workloads", "batch-1,file-order"], "unknown workload 'file-order'"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(capsys, args, message):
    assert main(["bench", "kernels", *args]) == 2
    assert message in capsys.readouterr().err

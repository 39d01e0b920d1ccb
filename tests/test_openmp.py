"""bertlab.openmp: the OpenMP threads' wait is chosen before torch loads, as a default only."""

from __future__ import annotations

import os
import subprocess
import sys

from bertlab.openmp import SPIN, choose_wait

WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def test_an_empty_environment_gets_the_bounded_spin():
    env: dict[str, str] = {}
    said = choose_wait(env, torch_loaded=False)
    assert env == {"GOMP_SPINCOUNT": str(SPIN)} and "bertlab's default" in said


def test_the_environment_and_an_earlier_torch_import_win():
    for name, value in (("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "300000")):
        env = {name: value}
        assert choose_wait(env, torch_loaded=False) == f"{name}={value} (the environment's)"
        assert env == {name: value}  # untouched
    env = {}
    assert "torch was imported before bertlab" in choose_wait(env, torch_loaded=True)
    assert env == {}  # libgomp has read its settings: setting one now would mislead


def run(code: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS} | extra
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_bertlab_sets_it_before_torch_loads_and_reports_it():
    code = (
        "import os, bertlab; from bertlab.nn import cpu; "
        "print(os.environ.get('GOMP_SPINCOUNT'), '|', cpu.current().describe()['openmp_wait'])"
    )
    assert run(code) == f"{SPIN} | GOMP_SPINCOUNT={SPIN} (bertlab's default)"
    assert (
        run(code, OMP_WAIT_POLICY="PASSIVE") == "None | OMP_WAIT_POLICY=PASSIVE (the environment's)"
    )
    late = "import os, torch, bertlab; print(os.environ.get('GOMP_SPINCOUNT'), bertlab.openmp.WAIT)"
    assert run(late).startswith("None libgomp's default (torch was imported before bertlab")


def test_the_command_line_reaches_it_first():
    # ``bertlab`` and ``python -m bertlab`` import the package, so torch loads after the choice
    code = "import os, sys; import bertlab.cli.main; print(os.environ.get('GOMP_SPINCOUNT'))"
    assert run(code) == str(SPIN)

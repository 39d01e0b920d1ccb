"""Fixtures shared by several test files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def sst2(tmp_path_factory):
    """The 200-row SST-2 sample split in 160 training and 40 dev rows."""
    root = tmp_path_factory.mktemp("sst2")
    lines = (FIXTURES / "sst2_sample.tsv").read_text("utf-8").splitlines(keepends=True)
    (root / "train.tsv").write_text("".join(lines[:161]), "utf-8")
    (root / "dev.tsv").write_text(lines[0] + "".join(lines[161:]), "utf-8")
    return root


class ModuleTemp:
    """``tmp_path_factory.mktemp`` for a test module's fixtures: the folders it makes are removed
    when the module's last test ends. The models and checkpoints a module writes are then not
    held to the end of the run (held, they came to several GB, and CI's disk ran out once)."""

    def __init__(self, factory: pytest.TempPathFactory):
        self.factory = factory
        self.made: list[Path] = []

    def mktemp(self, name: str) -> Path:
        self.made.append(self.factory.mktemp(name))
        return self.made[-1]


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    folders = ModuleTemp(tmp_path_factory)
    yield folders
    for folder in folders.made:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    """The policy reads no kernel measured on this machine by ``bertlab bench kernels --save``
    (nn/measured.py): the tests see the classes' own choices, wherever they run. A test of that
    file points BERTLAB_MEASURED_DIR at a folder of its own."""
    import os
    import tempfile

    os.environ["BERTLAB_MEASURED_DIR"] = os.path.join(
        tempfile.gettempdir(), f"bertlab-tests-{os.getpid()}-measured-nothing"
    )
    _share_cores()


def _share_cores() -> None:
    """Under pytest-xdist (the README's test command runs two workers) the cores are shared out
    between the workers: two workers of two threads each on two cores would wait on each other
    at every parallel region. The processes a test starts (the command line, servers, torchrun,
    Ray's workers) get the same share through the environment, and so do the Rust tokenizers
    the parity tests compare against: a subprocess computing on every core beside the other
    worker made that worker's tests up to three times slower."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_RS_NUM_CPUS"):
            os.environ.setdefault(name, str(share))
        torch.set_num_threads(share)


# The files that take longest, longest first (seconds of one worker's time under the README's
# test command on a 2-core AMD EPYC, `--durations=0` summed by file). pyproject.toml's addopts
# give each file whole to one worker, in this order, and the next file to whichever worker is
# free: the long ones start first and the many short ones, alphabetically after them, fill in
# at the end, so the two workers finish close together. A file missing here only runs later.
LONGEST = (
    "test_compiled.py",  # 120-140
    "test_export.py",  # 110-117
    "test_tokenizer_parity.py",  # 113-115
    "test_docs.py",  # 110-115
    "test_cli.py",  # 96-100
    "test_predict_ray.py",  # 78-100
    "test_serve.py",  # 60-76
    "test_finetune.py",  # 72-90
    "test_serve_int8.py",  # 70
    "test_pretrain_elastic.py",  # 55-59
    "test_explore_browser.py",  # 50-65
    "test_bench_runtimes.py",  # 38-41
    "test_transformers_compat.py",  # 37-46
    "test_pipeline_transformers_tasks.py",  # 32
    "test_predict_corpus.py",  # 29
    "test_precision.py",  # 27
    "test_bench_precision.py",  # 26-30
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))  # (stable: else as found)

"""``bertlab predict TASK INPUT --out OUT --ray local|ADDRESS``: a Parquet dataset through a
pipeline on Ray Data's actors, into one Parquet or JSON-lines file.

    bertlab predict embed "corpus/*.parquet" --out vectors.parquet --ray local --actors 2

The input (a Parquet file, a folder of them, or a glob) is checked first: its text column (and
the pair or context column) must be there, or it is refused naming the columns it has. Then
``ray.data.read_parquet`` reads it and ``map_batches`` runs a ``Predictor`` (predictor.py) on
``actors`` actors of ``threads`` torch threads each, in the Arrow format; every actor loads the
model once. The actors leave one of the cluster's CPUs unreserved for Ray Data's reading tasks
(``reservation``). An actor that dies is started again and its batch run again (Ray's
``max_restarts`` and ``max_task_retries``): a batch's rows reach the output once, from the run
that finished. The driver writes the rows as they come, in the input's order
(``preserve_order``), to a temporary file renamed to OUT at the end, and checks that it wrote
as many rows as the input holds: OUT is whole or absent. A row whose text is null, empty or
invalid is written with its result columns null and the reason in ``error``; it never fails
the job.

``local`` starts a Ray instance on this machine for the run (all its CPUs) and stops it after;
an ADDRESS (``ray://host:10001``, or ``auto``) joins a running cluster, whose workers need
bertlab and the model folder at the same path. When Ray is already initialized in this
process (a notebook, a test), that instance is used and left running.

Imports predictor.py, bertlab.extras and bertlab.files; ray and pyarrow when a job runs.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertlab.extras import require
from bertlab.files import atomic_write, resolve_model_dir
from bertlab.pipelines.predictor import ALIASES, TASKS, Predictor

FORMATS = ("parquet", "jsonl")
SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


@dataclass(frozen=True)
class RayJob:
    """One ``bertlab predict --ray`` run. ``threads`` None: the local CPUs shared among the
    actors (``local``), else 1. ``rows_per_batch``: Ray's batch, which the model runs
    ``batch_size`` rows at a time. ``options``: the task's (Predictor)."""

    task: str
    input: str | os.PathLike
    out: str | os.PathLike
    ray: str = "local"
    model: str | os.PathLike = "default"
    column: str | None = None  # default: "text" ("question" for answer)
    pair_column: str | None = None
    format: str | None = None
    actors: int = 1
    threads: int | None = None
    batch_size: int = 32
    rows_per_batch: int = 256
    max_restarts: int = 3
    overwrite: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RayResult:
    out: Path
    rows: int
    errors: int  # rows written with an error instead of a result
    format: str
    actors: int
    threads: int


def parquet_files(source: str | os.PathLike) -> list[Path]:
    """The Parquet files of a file, a folder (its ``*.parquet``) or a glob, sorted."""
    import glob

    path = Path(source)
    if path.is_dir():
        found = sorted(path.glob("*.parquet"))
        if not found:
            raise FileNotFoundError(f"the folder {path} holds no .parquet file")
        return found
    if path.is_file():
        return [path]
    if glob.has_magic(str(source)):
        found = sorted(Path(p) for p in glob.glob(str(source), recursive=True))
        if found:
            return found
        raise FileNotFoundError(f"no Parquet file matches {source}")
    raise FileNotFoundError(f"no Parquet input at {path}")


def check_job(job: RayJob) -> tuple[str, str, list[Path], int]:
    """Everything a run needs, checked before Ray starts: (the task, OUT's format, the input
    files, their rows). Refusals name what is wrong."""
    task = ALIASES.get(job.task, job.task)
    if task not in TASKS:
        raise ValueError(f"--ray runs the tasks {', '.join(TASKS)}, not {job.task!r}")
    fmt = job.format or SUFFIXES.get(Path(job.out).suffix.lower(), "jsonl")
    if fmt not in FORMATS:
        raise ValueError(f"--ray writes {' or '.join(FORMATS)}, not {fmt}")
    for name, value in (("--actors", job.actors), ("--threads", job.threads or 1)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be 1 or more, got {value!r}")
    out = Path(job.out)
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder; give a file name")
    if out.exists() and not job.overwrite:
        raise FileExistsError(f"{out} exists; --overwrite replaces it")
    require(["ray"], "ray", "--ray")
    import pyarrow.parquet as pq

    files, rows = parquet_files(job.input), 0
    column, pair = _columns(job, task)
    named = "--text-column" + (" and --pair-column" if pair else "")
    for path in files:
        meta = pq.read_metadata(path)
        names = meta.schema.to_arrow_schema().names
        for name in (column, pair):
            if name is not None and name not in names:
                raise ValueError(
                    f"{path} has no column {name!r} (its columns: {', '.join(names)}); name "
                    f"the texts with {named}"
                )
        rows += meta.num_rows
    if not rows:
        raise ValueError(f"the input {job.input} has no rows")
    return task, fmt, files, rows


def _columns(job: RayJob, task: str) -> tuple[str, str | None]:
    column = job.column or ("question" if task == "answer" else "text")
    pair = job.pair_column or ("context" if task == "answer" else None)
    return column, pair


def predict_ray(job: RayJob, predictor: type[Predictor] = Predictor) -> RayResult:
    """Run ``job`` (module docstring). ``predictor``: the class the actors build (Predictor,
    or a subclass of it)."""
    task, fmt, files, rows = check_job(job)
    import ray
    import ray.data

    model = str(resolve_model_dir(job.model))  # one path for every actor
    _settle_fsspec_http()
    started, preserve = not ray.is_initialized(), None
    if started and job.ray == "local":
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False)
    elif started:
        ray.init(address=job.ray)
    try:
        cpus = float(ray.cluster_resources().get("CPU", 1))
        threads = job.threads or (max(1, int(cpus) // job.actors) if job.ray == "local" else 1)
        context = ray.data.DataContext.get_current()
        preserve = context.execution_options.preserve_order
        context.execution_options.preserve_order = True  # OUT in the input's order
        with warnings.catch_warnings():  # Ray 2.5x: max_restarts as a named parameter is to
            # come; until then it goes through ray_remote_args, which warns. Ray's own default
            # (-1) would restart an actor that dies on every batch for ever.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            column, pair = _columns(job, task)
            settings = dict(task=task, model=model, column=column, pair_column=pair)
            settings |= dict(threads=threads, batch_size=job.batch_size, **job.options)
            dataset = _mapped(
                ray, files, predictor, settings, job, reservation(cpus, job.actors, threads)
            )
        written, errors = _write(dataset, Path(job.out), fmt, rows)
    finally:
        if preserve is not None:  # the caller's Ray Data setting, as it was
            context.execution_options.preserve_order = preserve
        if started:
            ray.shutdown()
    return RayResult(Path(job.out), written, errors, fmt, job.actors, threads)


def _mapped(
    ray: Any, files: list[Path], predictor: type, settings: dict, job: RayJob, cpus: float
) -> Any:
    """The input read by Ray Data and mapped by ``job.actors`` actors that each build
    ``predictor(**settings)`` and reserve ``cpus``."""
    return ray.data.read_parquet([str(p) for p in files]).map_batches(
        predictor,
        fn_constructor_kwargs=settings,
        batch_format="pyarrow",
        batch_size=job.rows_per_batch,
        concurrency=job.actors,
        num_cpus=cpus,
        max_restarts=job.max_restarts,
        max_task_retries=job.max_restarts,
    )


def reservation(cpus: float, actors: int, threads: int) -> float:
    """The CPUs each actor reserves in Ray's scheduler: its ``threads``, but together at most
    the cluster's ``cpus`` less one. Ray Data lists and reads the files in tasks of one CPU
    each, which run beside the actors; actors that reserved every CPU would leave them none, and
    the job would wait forever without a word (2 actors of 1 thread on 2 CPUs did). The
    reservation is bookkeeping, not a limit: an actor computes with its ``threads`` whatever it
    reserved, so on a small machine the reading shares the actors' cores for its moments."""
    share = max(0.0, (cpus - 1) / actors)
    return min(float(threads), int(share * 100) / 100)  # Ray takes hundredths of a CPU


def _settle_fsspec_http() -> None:
    """Decide once, in this thread, whether fsspec's HTTP filesystem imports. Ray Data asks
    (``_is_http_filesystem``) from several threads at once while it lists the input files;
    without aiohttp (``ray[data]`` does not install it; bertlab's ray extra does, since the
    same race runs in Ray's own worker processes) the module fails half-way through, the
    threads' imports race, and one of them can get the half-made module and raise ImportError
    ("cannot import name 'HTTPFileSystem'"), which Ray does not catch, in place of the
    ModuleNotFoundError it does. A module that failed to import is recorded as None in
    ``sys.modules``, so that every later import fails at once with ModuleNotFoundError."""
    import importlib
    import sys

    name = "fsspec.implementations.http"
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
    except ImportError:
        sys.modules[name] = None  # type: ignore[assignment]


def _write(dataset: Any, out: Path, fmt: str, expected: int) -> tuple[int, int]:
    """The dataset's rows, as they come, into ``out`` (written under a temporary name, then
    renamed): (rows, rows with an error). Refused unless it wrote ``expected`` rows."""
    import pyarrow.parquet as pq

    counts = {"rows": 0, "errors": 0}

    def write(tmp: str) -> None:
        writer = None
        with open(tmp, "wb") as f:
            try:
                for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                    counts["rows"] += batch.num_rows
                    counts["errors"] += batch.num_rows - batch.column("error").null_count
                    if fmt == "parquet":
                        if writer is None:
                            writer = pq.ParquetWriter(f, batch.schema)
                        writer.write_table(batch.cast(writer.schema))
                    else:
                        lines = "".join(
                            json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist()
                        )
                        f.write(lines.encode("utf-8"))
            finally:
                if writer is not None:
                    writer.close()
        if counts["rows"] != expected:
            raise RuntimeError(
                f"the job gave {counts['rows']} rows for the input's {expected}; {out} is not "
                "written"
            )

    atomic_write(out, write)
    return counts["rows"], counts["errors"]

"""The served models and their batchers: the requests' rows packed into batches under a token
budget.

    model = ServedModel("name", folder)     the folder loaded with the head its config names
    encoded = model.encode(texts, ...)      the pipelines' front half: checked, tokenized, long
                                            texts refused, cut or split into windows
    batcher = Batcher(load, limits)         one per model: its runner thread loads and runs it
    job = Job(rows, loop); batcher.submit(job); outputs = await job.future

Everything between a text and its outputs is the pipelines' front half
(``bertlab.pipelines.front``): ``encode`` makes the rows (``Row.want`` says what each yields: a
mean or [CLS] vector, a classifier's logits, a tagger's per-token probabilities, a reader's start
and end logits, or the masked-LM logits at its [MASK]s), ``pad_rows`` pads them and
``front.Reader`` reads each row's output from the model's. What is the server's own is how rows
are gathered: the batcher takes rows from the waiting jobs in arrival order until the batch holds
``max_batch_tokens`` real tokens or ``max_batch_sequences`` rows, or until the oldest has waited
``max_wait`` seconds, or at once when the model is free (nothing runs and no batch is ready:
waiting would only add latency); it pads them into one batch, which the model runs packed (its
default "packed" kernel removes the padding again, so the budget counts real tokens). While one
batch runs, the former thread builds the next. Jobs whose client left are dropped before their rows
are computed; a batch that raises fails its jobs alone (``ModelFailed``), and the batcher goes on.
The routes finish the outputs with the pipelines' methods (``ServedModel.classify`` and the
others), so a response holds what the Python pipelines return for the same input.

Imports the pipelines (front half, text rules, the pipelines whose methods finish results) and
the network; routes.py and app.py import this.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertlab.data import sample_sentences
from bertlab.heap import release_freed_memory
from bertlab.nn.compiled import Compiled
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import HEADS, head_of
from bertlab.nn.packing import window_order
from bertlab.nn.precision import CALIBRATION, int8_supported, quantize_int8, text_batches
from bertlab.pipelines.base import load_model
from bertlab.pipelines.front import (
    HEADED,
    Encoded,
    Reader,
    Row,
    TooLong,
    encode,
    max_tokens,
    pad_rows,
    runnable,
)
from bertlab.pipelines.predict import (
    AnswerPipeline,
    ClassifyPipeline,
    FillMaskPipeline,
    TagPipeline,
)
from bertlab.pipelines.text import InputError
from bertlab.tokenizer import BertTokenizer

__all__ = [
    "Batcher",
    "Encoded",
    "Job",
    "Limits",
    "ModelFailed",
    "RequestError",
    "Row",
    "ServedModel",
    "pad_rows",
]

# What each head serves, beyond /tokenize, /decode and /info.
EMBED = ("embed", "v1/embeddings", "similarity", "rerank")
ROUTES_BY_HEAD: dict[str, tuple[str, ...]] = {
    "base": EMBED,
    "pretraining": (*EMBED, "fill-mask"),
    "masked-lm": (*EMBED, "fill-mask"),
    "sequence-classification": ("predict", "rerank"),
    "token-classification": ("ner",),
    "question-answering": ("qa",),
}
# The pipeline whose methods finish a head's results; its ``needs`` are the weights that head
# must find in the folder (a masked-LM folder without its head cannot fill masks).
FINISHED_BY = {
    "pretraining": FillMaskPipeline,
    "masked-lm": FillMaskPipeline,
    "sequence-classification": ClassifyPipeline,
    "token-classification": TagPipeline,
    "question-answering": AnswerPipeline,
}
WARM_UP_OUTPUT = dict(zip(HEADED, ("logits", "tokens", "span"), strict=True))  # else "mean"
DTYPES = ("float32", "bfloat16", "int8")
# Compiled serving (``ServedModel(compile=True)``). A batch with little padding runs through the
# compiled program in float32 and int8. A batch of mixed lengths is cut into groups of similar
# length (at most COMPILED_ROWS rows each) in int8 only, where they hold GROUP_ROWS rows on
# average: there the compiled groups ran a request of 256 short sentences in about half the
# packed batch's time (the program fuses int8's activation rounding into its kernels), while
# in float32 the groups were no faster than the packed batch, as were groups of 2-3 rows in
# either, and in bfloat16 the packed batch was the faster (docs/performance.md has the timings).
COMPILED_DTYPES = ("float32", "int8")
GROUPED_DTYPES = ("int8",)
COMPILED_ROWS = 32
GROUP_ROWS = 8
# The precisions whose packed batch runs in ``window_order``: each row's numbers are the same in
# any order there. int8's products on CPUs with AMX round a row by its place in the
# batch (up to 5e-3 apart in a sentence vector), so int8 keeps the request's order and gives
# the int8 pipeline's numbers.
WINDOW_ORDERED = ("float32", "bfloat16")


def check_precision(dtype: str, compile: bool) -> None:
    """Refuse a precision, or compiling in it, that the server does not serve (by name)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be True or False, got {compile!r}")
    if compile and dtype not in COMPILED_DTYPES:
        raise ValueError(
            f"compile serves {' and '.join(COMPILED_DTYPES)}; in {dtype} the packed batch is the "
            "faster path"
        )
    if dtype == "int8" and (why := int8_supported()) is not None:  # before any model loads
        raise ValueError(f"dtype int8 cannot run here: {why}")  # (as bench serve says)


MIN_CALIBRATION = 8  # texts: the fewest an int8 calibration reads


def calibration_texts(path: str | Path | None, count: int = CALIBRATION) -> tuple[list[str], str]:
    """int8's calibration texts and where they came from: the first ``count`` non-empty lines
    of ``path`` (one text per line), or the bundled SST-2 sample's first ``count`` sentences."""
    if path is None:
        return sample_sentences(count), f"{count} bundled SST-2 sentences"
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"calibration file {str(path)!r}: {e.strerror or e}") from e
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"calibration file {str(path)!r} is not UTF-8 text: {e}") from e
    texts = [t for line in lines if (t := line.strip())][:count]
    if len(texts) < MIN_CALIBRATION:
        raise ValueError(
            f"calibration file {str(path)!r} has {len(texts)} non-empty lines; int8 calibration "
            f"needs at least {MIN_CALIBRATION} texts, one per line (it reads up to {count})"
        )
    return texts, f"{len(texts)} texts of {path}"


class RequestError(Exception):
    """A bad request: the HTTP status, the field at fault and what is wrong with it."""

    def __init__(self, status: int, field: str | None, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message

    @classmethod
    def of(cls, e: InputError) -> RequestError:
        """An input the front half refused, as the server answers it: a text past the model's
        length says how a request asks for a cut (413; 422 for windows of a pair); another
        refusal is a 413 when it passes a limit, else a 422."""
        if isinstance(e, TooLong) and e.windows:
            return cls(422, e.field, f'{e}; send "truncate": true')
        if isinstance(e, TooLong):
            split = "" if e.pair else ' or "windows": true to split it'
            return cls(413, e.field, f'{e}: send "truncate": true to cut it{split}')
        return cls(413 if e.limit else 422, e.field, str(e))


class ModelFailed(Exception):
    """The model raised inside a batch: every job of that batch fails with this."""


class Job:
    """One request's rows on their way through a batcher; ``future`` gets the rows' outputs in
    order (or ``finish(outputs)``, run in the model's runner thread), or the exception that
    failed them. Timings are perf_counter seconds."""

    def __init__(
        self,
        rows: list[Row],
        loop: asyncio.AbstractEventLoop,
        finish: Callable[[list[Any]], Any] | None = None,
    ):
        self.rows, self.loop, self.finish = rows, loop, finish
        self.outputs: list[Any] = [None] * len(rows)
        self.taken = 0  # rows handed to a batch so far
        self.done = 0  # rows computed
        self.future: asyncio.Future = loop.create_future()
        self.cancelled = False  # the client left: rows not yet taken are never computed
        self.failed = False
        self.queued = time.perf_counter()
        self.started: float | None = None
        self.finished: float | None = None

    def _settle(self, result: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        self.finished = time.perf_counter()
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass


class ServedModel:
    """A model folder loaded for serving: its head (from config.json's ``architectures``), the
    routes that head serves, its tokenizer, and the pipelines whose methods finish results."""

    def __init__(
        self,
        name: str,
        folder: str | Path,
        dtype: str = "float32",
        calibration: tuple[list[str], str] | None = None,
        compile: bool = False,
    ):
        """``dtype``: float32, bfloat16 or int8 (``quantize_int8`` calibrated on
        ``calibration``, texts and where they came from; default: ``calibration_texts(None)``).
        ``compile``: run batches through a ``Compiled`` graph, as groups of similar length
        (``prepare``); compiled once here, before the first request."""
        check_precision(dtype, compile)  # (Compiled says why it cannot compile here, if so)
        self.name, self.folder = name, Path(folder)
        config = BertConfig.from_pretrained(self.folder)
        self.head = head_of(getattr(config, "architectures", None))
        if self.head not in ROUTES_BY_HEAD:
            raise ValueError(
                f"model {name!r} ({self.folder}) has a {self.head} head, which bertlab serve does "
                f"not serve; it serves {', '.join(ROUTES_BY_HEAD)}"
            )
        self.dtype = dtype
        self.torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        finisher = FINISHED_BY.get(self.head)
        try:  # a folder without the weights its head needs is refused, by name
            self.model = load_model(
                HEADS[self.head],
                self.folder,
                finisher.needs if finisher else (),
                finisher.task if finisher else "",
                dtype=self.torch_dtype,
            ).eval()
        except ValueError as e:
            raise ValueError(f"model {name!r} cannot be served: {e}") from None
        self.config = self.model.config
        self.tokenizer = BertTokenizer.from_pretrained(self.folder)
        self.max_length = max_tokens(self.config, self.tokenizer)
        self.int8: dict[str, Any] | None = None
        if dtype == "int8":
            texts, source = calibration or calibration_texts(None)
            batches = text_batches(self.tokenizer, texts, max_length=self.max_length)
            self.model = quantize_int8(self.model, calibrate=batches)
            report = self.model.int8_report
            self.int8 = {
                "calibration": source,
                "int8_layers": len(report["int8"]),
                "kept_float32": report["kept_float32"],
                "always_float32": report["always_float32"],
            }
        self.routes = ROUTES_BY_HEAD[self.head]
        if self.head == "sequence-classification" and self.config.num_labels != 1:
            self.routes = ("predict",)  # reranking needs one relevance score per pair
        kw = {"tokenizer": self.tokenizer}
        self.classify = ClassifyPipeline(self.model, **kw) if "predict" in self.routes else None
        self.tag = TagPipeline(self.model, **kw) if "ner" in self.routes else None
        self.answer = AnswerPipeline(self.model, **kw) if "qa" in self.routes else None
        self.fill = FillMaskPipeline(self.model, **kw) if "fill-mask" in self.routes else None
        self.compiled: Compiled | None = None
        self.not_compiled: str | None = None  # why compile=True runs the model itself here
        self.run = runnable(self.model, self.head)  # what a batch goes through
        if compile:
            compiled = Compiled(self.run)  # (it warns where this CPU runs the model itself)
            if compiled.why_eager is None:
                self.compiled = self.run = compiled
            else:  # batches run packed, as without compile=True
                self.not_compiled = compiled.why_eager
        self.reader = Reader(self.model, self.run, self.head, self.tokenizer.mask_token_id)
        if self.compiled is not None:
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile before the first request: a batch of several rows and a single row (a
        dynamic graph specialises a batch of one)."""
        start = time.perf_counter()
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        for rows, length in ((3, 12), (1, 9)):
            ids = [cls] + [self.tokenizer.unk_token_id] * (length - 2) + [sep]
            self.forward([Row(ids, [0] * length, WARM_UP_OUTPUT.get(self.head, "mean"))] * rows)
        self.compile_seconds = round(time.perf_counter() - start, 1)

    def info(self) -> dict[str, Any]:
        labels = self.config.labels if self.head.endswith("classification") else None
        return {
            "name": self.name,
            "folder": str(self.folder),
            "head": self.head,
            "routes": ["/" + r for r in self.routes],
            "labels": labels,
            "max_input_length": self.max_length,
            "hidden_size": self.config.hidden_size,
            "vocab_size": self.config.vocab_size,
            "dtype": self.dtype,
            "int8": self.int8,
            "compiled": self.compiled is not None,
            **({"not_compiled": self.not_compiled} if self.not_compiled else {}),
        }

    # ------------------------------------------------------------------ tokenizing
    def encode(
        self,
        texts: list[str],
        want: str,
        pairs: list[str] | None = None,
        long: str = "error",
        direction: str = "right",
        offsets: bool = False,
        field: str = "inputs",
        fields: list[str] | None = None,
        pair_fields: list[str] | None = None,
    ) -> list[Encoded]:
        """Each text (with its pair) as rows, by the pipelines' front half (``front.encode``)
        under this model's length. ``long`` says what happens past it: "error" (a 413 naming
        the text), "truncate" (cut on the ``direction`` side) or "windows" (split into windows,
        side by side for vectors and labels, overlapping for tagging). ``fields``: each text's
        name in the request (default ``field``, or ``field[i]`` for several); a refused input
        is a ``RequestError`` naming it."""
        if fields is None:
            single = len(texts) == 1 and field == "inputs"
            fields = [field] if single else [f"{field}[{i}]" for i in range(len(texts))]
        try:
            return encode(
                self.tokenizer,
                texts,
                want,
                limit=self.max_length,
                pairs=pairs,
                fields=fields,
                pair_fields=pair_fields,
                long=long,
                truncation_direction=direction,
                offsets=offsets,
            )
        except InputError as e:
            raise RequestError.of(e) from None

    # ------------------------------------------------------------------ running
    def prepare(self, rows: list[Row]) -> list[tuple[list[int], dict[str, np.ndarray]]]:
        """The rows as the padded batches the model runs, each with the indices of its rows:
        one batch, which the model runs packed, its rows in ``window_order`` in WINDOW_ORDERED
        precisions; or, compiled, groups of similar length with little padding
        (``Compiled.groups``) where the rows make one group, or, in int8, groups of GROUP_ROWS
        rows or more on average (the figures beside COMPILED_DTYPES)."""
        pad = self.tokenizer.pad_token_id
        if self.compiled is not None:
            groups = self.compiled.groups([len(r) for r in rows], COMPILED_ROWS)
            grouped = self.dtype in GROUPED_DTYPES and len(rows) >= GROUP_ROWS * len(groups)
            if len(groups) == 1 or grouped:
                return [(g, pad_rows([rows[i] for i in g], pad)) for g in groups]
        order = list(range(len(rows)))
        if self.dtype in WINDOW_ORDERED:  # short rows side by side in the attention windows
            order = window_order([len(r) for r in rows])
        return [(order, pad_rows([rows[i] for i in order], pad, self.max_length))]

    @torch.inference_mode()
    def forward(
        self, rows: list[Row], parts: list[tuple[list[int], dict[str, np.ndarray]]] | None = None
    ) -> list[Any]:
        """One batch: each row's output, in order, from the padded batches ``parts`` (made by
        ``prepare``, which runs when they are not given)."""
        results: list[Any] = [None] * len(rows)
        for index, arrays in self.prepare(rows) if parts is None else parts:
            outputs = self._outputs([rows[i] for i in index], arrays)
            for i, out in zip(index, outputs, strict=True):
                results[i] = out
        return results

    def _outputs(self, rows: list[Row], arrays: dict[str, np.ndarray]) -> list[Any]:
        """One padded batch run (packed inside the model, unless compiled) and each row's
        output, read by the front half's reader (``front.Reader``)."""
        return self.reader(rows, {k: torch.from_numpy(v) for k, v in arrays.items()})


TRIM_EVERY = 1.0  # seconds: the runner hands freed heap pages back at most this often


@dataclass
class Limits:
    """The batcher's budget: real tokens and rows per batch, and the longest wait (seconds)."""

    max_batch_tokens: int = 16384
    max_batch_sequences: int = 256
    max_wait: float = 0.005


@dataclass
class Batch:
    rows: list[Row]
    owners: list[tuple[Job, int]]  # per row: its job and its index there
    tokens: int = 0
    parts: list | None = None  # the rows padded (ServedModel.prepare), made while the last ran


class Batcher:
    """One model's queue and its two threads: the former (takes rows, pads the next batch) and
    the runner (loads the model, runs batches, hands each job its outputs). ``load()`` builds
    the ``ServedModel``; ``on_batch(tokens, rows, seconds)`` is told of every batch run.

    Every tensor operation of a model happens in its runner thread, its loading included: with
    GNU OpenMP, a second thread that runs parallel regions starts a second team of workers, and
    with more workers than cores the library stops spinning between regions, which made the
    packed attention's thousands of small regions about a third slower. So the routes hand
    their tensor work to the runner too (``Job.finish``)."""

    def __init__(self, load: Callable[[], ServedModel], limits: Limits, on_batch: Any = None):
        self.limits, self.on_batch = limits, on_batch
        self._jobs: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._ready: queue.Queue[Batch | None] = queue.Queue(maxsize=1)
        self._closing = False
        self._idle = False  # the runner waits for a batch and none is ready (under _cv)
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        runner = threading.Thread(target=self._run, args=(load,), name="runner", daemon=True)
        runner.start()
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        model = self.model
        runner.name = f"{model.name}-runner"
        if limits.max_batch_tokens < model.max_length:
            self._ready.put(None)  # stop the runner
            raise ValueError(
                f"max_batch_tokens {limits.max_batch_tokens} is below the model's length "
                f"{model.max_length}: a full-length text could never be run"
            )
        former = threading.Thread(target=self._form, name=f"{model.name}-batcher", daemon=True)
        former.start()
        self._threads = [former, runner]

    def submit(self, job: Job) -> None:
        if not job.rows:
            job._settle(result=[])
            return
        with self._cv:
            if self._closing:
                raise RequestError(503, None, "the server is shutting down")
            self._jobs.append(job)
            self._cv.notify()

    def waiting(self) -> int:
        """Rows waiting for a batch (the queue depth)."""
        with self._cv:
            return sum(len(j.rows) - j.taken for j in self._jobs)

    def close(self) -> None:
        """Finish the jobs already queued, then stop the threads."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        for t in self._threads:
            t.join()

    def _take(self) -> Batch | None:
        lim = self.limits
        with self._cv:
            while not self._jobs and not self._closing:
                self._cv.wait()
            if not self._jobs:
                return None
            deadline = self._jobs[0].queued + lim.max_wait
            while not self._closing:
                rows = [r for j in self._jobs for r in j.rows[j.taken :]]
                left = deadline - time.perf_counter()
                full = len(rows) >= lim.max_batch_sequences
                if full or sum(map(len, rows)) >= lim.max_batch_tokens or left <= 0:
                    break
                if self._idle and self._ready.empty():
                    break  # nothing runs: waiting would only add latency (continuous batching)
                self._cv.wait(left)
            batch = Batch([], [])
            while self._jobs:
                job = self._jobs[0]
                if job.cancelled or job.failed:
                    self._jobs.popleft()
                    continue
                row = job.rows[job.taken]
                full = batch.tokens + len(row) > lim.max_batch_tokens
                if batch.rows and (full or len(batch.rows) >= lim.max_batch_sequences):
                    break
                batch.rows.append(row)
                batch.owners.append((job, job.taken))
                batch.tokens += len(row)
                job.taken += 1
                if job.taken == len(job.rows):
                    self._jobs.popleft()
            return batch

    def _form(self) -> None:
        while True:
            try:
                batch = self._take()
                if batch is not None and batch.rows:
                    batch.parts = self.model.prepare(batch.rows)
            except Exception as e:  # a fault here would stall every queued job: fail them
                with self._cv:
                    jobs, self._jobs = list(self._jobs), collections.deque()
                for job in jobs:
                    job.failed = True
                    job._settle(error=ModelFailed(f"the batcher failed: {e!r}"))
                continue
            self._ready.put(batch)
            if batch is None:
                return

    def _run(self, load: Callable[[], ServedModel]) -> None:
        try:
            self.model = load()
        except BaseException as e:  # said in the thread that built the batcher
            self._load_error = e
            return
        finally:
            self._loaded.set()
        trimmed = time.perf_counter()
        while True:
            with self._cv:  # the former stops waiting for more rows: the model is free
                self._idle = True
                self._cv.notify()
            batch = self._ready.get()
            with self._cv:
                self._idle = False
            if batch is None:
                return
            if time.perf_counter() - trimmed > TRIM_EVERY:
                # Batches of every size free blocks all over glibc's heaps, which keeps the
                # pages (bertlab.heap); handing them back (cheap, at most once a second) keeps a
                # long-running server's memory at the level of its working set instead of
                # creeping up.
                release_freed_memory()
                trimmed = time.perf_counter()
            live = [
                (row, owner)
                for row, owner in zip(batch.rows, batch.owners, strict=True)
                if not owner[0].cancelled
            ]
            if not live:
                continue
            start = time.perf_counter()
            for _, (job, _) in live:
                job.started = job.started or start
            try:
                whole = len(live) == len(batch.rows)  # else the padding is made again
                outputs = self.model.forward(
                    [row for row, _ in live], batch.parts if whole else None
                )
            except Exception as e:  # the model failed: this batch's jobs fail, the server goes on
                error = ModelFailed(f"the model failed on a batch of {len(live)} sequences: {e!r}")
                for _, (job, _) in live:
                    if not job.failed:
                        job.failed = True
                        job._settle(error=error)
                continue
            if self.on_batch is not None:
                tokens = sum(len(row) for row, _ in live)
                with contextlib.suppress(Exception):  # the metrics never stop the serving
                    self.on_batch(tokens, len(live), time.perf_counter() - start)
            for out, (_, (job, i)) in zip(outputs, live, strict=True):
                if job.failed:
                    continue
                job.outputs[i] = out
                job.done += 1
                if job.done == len(job.rows):
                    try:
                        result = job.finish(job.outputs) if job.finish else job.outputs
                    except Exception as e:
                        job._settle(error=ModelFailed(f"finishing the outputs failed: {e!r}"))
                    else:
                        job._settle(result=result)

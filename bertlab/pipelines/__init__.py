"""Inference pipelines: text in, answers out. ``bertlab predict`` is the command-line face.

    from bertlab.pipelines import pipeline
    pipeline("embed")(["a sentence", "another"])              # (2, 384), unit length
    pipeline("classify", "runs/sst2/model")("a gorgeous film")  # [{"label": "1", "score": ..}]
    pipeline("tag", "runs/ner/model")("Ann lives in Paris")    # entities with character spans
    pipeline("answer", "runs/squad/model")(question, context)   # best span, score, offsets
    pipeline("fill-mask", "runs/mini/model")("Paris is the [MASK] of France.")

Each pipeline loads a model folder and its tokenizer once, runs batches without gradients and
returns plain Python values. A folder without the weights a task needs (a fill-mask model
without its masked-LM head, a classifier without its classifier) is refused by name: a randomly
initialised head would answer, but with noise.

For ``bertlab predict`` each class also reads its own input lines (``parse``), takes the
command's options it uses (``run``) and formats its own results, as a line of text (``text``)
or of JSON (``json_line``), so the command never asks which pipeline it runs.

``pipeline()`` also takes transformers' task names (``bertlab.pipeline("ner", model=folder,
aggregation_strategy="simple")``): those pipelines live in tasks.py, on base.py's class, and
answer in transformers' result shapes; fill-mask, a name of both, is in predict.py and
answers in transformers' shape too. ``model`` may be a folder, "default" or a bertlab model
object (with ``tokenizer=``); ``device`` is -1, "cpu", 0, "cuda:0" or a torch.device.

The two name sets are two result formats over one engine, which the server (bertlab.serve) and
the explorer (bertlab.explore) use too:
    text.py     the rules every input text meets (invalid code points), ``InputError``
    front.py    the one front half: texts -> checked, encoded rows under the model's length
                (cut, split into windows or refused) -> padded batches -> the model -> each
                row's output -> windows merged back per text
    base.py     the Pipeline class: a model and tokenizer loaded once, rows run through front.py
    predict.py  bertlab's own pipelines and their formats (``bertlab predict``)
    tasks.py    transformers' task names and result shapes
    corpus.py   ``bertlab predict --out``: a file of millions of lines, streamed and resumable
    predictor.py  ``Predictor``: a task as a function of batches of rows (numpy, pandas,
                Arrow), for Ray Data's ``map_batches``; raydata.py runs it: ``predict --ray``
QA spans come from the one span decoder, bertlab.data.squad.decode_spans. Imports point down:
this package imports the network, the tokenizer and the data, never the server, the explorer
or the commands.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from bertlab.distributed import Device
from bertlab.pipelines.base import Pipeline
from bertlab.pipelines.predict import (
    PIPELINES,
    AnswerPipeline,
    ClassifyPipeline,
    EmbedPipeline,
    FillMaskPipeline,
    TagPipeline,
)
from bertlab.pipelines.predictor import Predictor
from bertlab.pipelines.tasks import ALIASES, TASKS
from bertlab.tokenizer import BertTokenizer

__all__ = [
    "ALIASES",
    "PIPELINES",
    "TASKS",
    "AnswerPipeline",
    "ClassifyPipeline",
    "EmbedPipeline",
    "FillMaskPipeline",
    "Pipeline",
    "Predictor",
    "TagPipeline",
    "pipeline",
]


def pipeline(
    task: str,
    model: str | os.PathLike | torch.nn.Module | None = "default",
    device: Device = None,
    batch_size: int = 32,
    *,
    tokenizer: str | os.PathLike | BertTokenizer | None = None,
    compile: bool = False,
    **options: Any,
) -> Pipeline:
    """A pipeline by task name: bertlab's own (embed, classify, tag, answer, fill-mask) or
    transformers' (feature-extraction, text-classification alias sentiment-analysis,
    token-classification alias ner, question-answering, zero-shot-classification), which answer
    in transformers' shapes. ``model``: a folder, "default" (the bundled model; also None) or a
    bertlab model object (then ``tokenizer=``: a BertTokenizer or a folder). ``device``: -1 or
    "cpu", a GPU index or "cuda:0", a torch.device. ``compile=True``: single texts (and batches
    with little padding) run as one compiled graph (bertlab.nn.compiled), the first call
    compiling.
    ``options``: defaults for every call (e.g. ``aggregation_strategy="simple"``)."""
    cls = PIPELINES.get(task) or TASKS.get(ALIASES.get(task, task))
    if cls is None:
        names = sorted({*PIPELINES, *TASKS, *ALIASES})
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(names)}")
    model = "default" if model is None else model
    return cls(model, device, batch_size, tokenizer, compile=compile, **options)

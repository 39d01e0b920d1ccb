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
aggregation_strategy="simple")``): those pipelines live in pipeline_tasks.py, on this module's
base class, and answer in transformers' result shapes; fill-mask, a name of both, is here and
answers in transformers' shape too. ``model`` may be a folder, "default" or a bertlab model
object (with ``tokenizer=``); ``device`` is -1, "cpu", 0, "cuda:0" or a torch.device.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from typing import Any

import torch

from bertlab.data.batch import pad
from bertlab.files import resolve_model_dir
from bertlab.metrics import conll_entities, to_iob2
from bertlab.nn.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.nn.model import BertModel
from bertlab.tokenizer import BertTokenizer

Device = int | str | torch.device | None


def _device(device: Device) -> torch.device:
    """transformers' device argument: -1 or "cpu" the CPU, 0 (or "cuda:0") the first GPU, a
    torch.device as it is; None the CPU."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, torch.device):
        found = device
    elif isinstance(device, int) and not isinstance(device, bool):
        if device < -1:
            raise ValueError(f"device {device} is not -1 (the CPU) or a GPU index (0 or more)")
        found = torch.device("cpu" if device == -1 else f"cuda:{device}")
    elif isinstance(device, str):
        try:
            found = torch.device(device)
        except RuntimeError:
            raise ValueError(
                f"device {device!r} is not a device name such as 'cpu', 'cuda' or 'cuda:0'"
            ) from None
    else:
        raise TypeError(f"device must be an int, a str or a torch.device, got {device!r}")
    if found.type == "cuda":
        count = torch.cuda.device_count()
        if found.index is not None and found.index >= count or count == 0:
            raise ValueError(f"device {device!r} asked for, but this machine has {count} CUDA GPUs")
    return found


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Pipeline:
    task = "base"
    model_class: type = BertModel
    needs: tuple[str, ...] = ()  # weight names that must come from the folder

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module = "default",
        device: Device = None,
        batch_size: int = 32,
        tokenizer: str | os.PathLike | BertTokenizer | None = None,
        **defaults: Any,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.device, self.batch_size = _device(device), batch_size
        if isinstance(model, torch.nn.Module):
            self.directory = None
            if tokenizer is None:
                raise ValueError(
                    f"a {self.task} pipeline built on a model object needs tokenizer= "
                    "(a BertTokenizer or a folder with vocab.txt)"
                )
        else:
            self.directory = resolve_model_dir(model)
        if isinstance(tokenizer, BertTokenizer):
            self.tokenizer = tokenizer
        else:
            folder = self.directory if tokenizer is None else resolve_model_dir(tokenizer)
            self.tokenizer = BertTokenizer.from_pretrained(folder)
        self.defaults: dict[str, Any] = {}
        self._settings(defaults)  # checked before the model is loaded
        self.defaults = defaults
        self.model = self._model(model)
        if device is None and self.directory is None:  # a model object stays where it is
            self.device = next(self.model.parameters()).device
        else:
            self.model.to(self.device)
        self.model.eval()

    def _options(self) -> dict[str, Any]:
        """The call's options (keywords) with their defaults, each checked. bertlab's own
        pipelines take theirs as arguments when called, so they have none here."""
        return {}

    def _settings(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` over those given when the pipeline was built, checked."""
        allowed = list(inspect.signature(self._options).parameters)
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            takes = ", ".join(allowed) if allowed else "none when it is built"
            raise TypeError(
                f"the {self.task} pipeline has no option {', '.join(unknown)} (its options: "
                f"{takes})"
            )
        return self._options(**{**self.defaults, **options})

    def _model(self, model: str | os.PathLike | torch.nn.Module) -> torch.nn.Module:
        if isinstance(model, torch.nn.Module):
            if not isinstance(model, self.model_class):
                raise TypeError(
                    f"a {self.task} pipeline needs a {self.model_class.__name__}, "
                    f"got a {type(model).__name__}"
                )
            return model
        loaded, info = self.model_class.from_pretrained(self.directory, output_loading_info=True)
        missing = [k for k in info.missing_keys if k.startswith(self.needs)] if self.needs else []
        if missing:
            raise ValueError(
                f"the model in {self.directory} has no trained weights for "
                f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in missing}))}: a {self.task} "
                f"pipeline needs a model trained for it"
            )
        return loaded

    @classmethod
    def parse(cls, line: str, n: int, **options: Any) -> Any:
        """One input line (the ``n``-th, counted from 1) -> this pipeline's input: the text."""
        return line

    def run(self, items: list, **options: Any) -> list:
        """The results of ``items``, one each, under ``bertlab predict``'s options (those this
        pipeline does not use are ignored)."""
        return self(items)

    @classmethod
    def text(cls, item: Any, result: Any) -> str:
        """One result as a line of text: the input, a tab, the result."""
        return f"{item}\t{result}"

    @classmethod
    def json_line(cls, item: Any, result: Any) -> str:
        """One result as a line of JSON: {"input": ..., "output": ...}."""
        return json.dumps({"input": item, "output": result}, ensure_ascii=False)

    def _encode(self, texts: list[str], pairs: list[str] | None = None, **kw) -> Any:
        return self.tokenizer(texts, pairs, truncation=True, **kw)

    def _run(self, features: list[dict]) -> Any:
        padded = pad(features, self.tokenizer.pad_token_id)
        batch = {k: v.to(self.device) for k, v in padded.items()}
        with torch.no_grad():
            return self.model(**batch), batch


def _features(enc: Any) -> list[dict[str, list[int]]]:
    return [
        {"input_ids": i, "token_type_ids": t}
        for i, t in zip(enc["input_ids"], enc["token_type_ids"], strict=True)
    ]


def _check_top_k(top_k: Any, none_ok: bool = False) -> None:
    if top_k is None and none_ok:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        allowed = "a positive int or None (every label)" if none_ok else "a positive int"
        raise ValueError(f"top_k {top_k!r} is not {allowed}")


def _check_flags(**flags: Any) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} {value!r} is not True or False")


def _texts(texts: str | list[str]) -> tuple[list[str], bool]:
    if isinstance(texts, str):
        return [texts], True
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a str or a list of str")
    return list(texts), False


class EmbedPipeline(Pipeline):
    """Sentence vectors: mean over real tokens (or the [CLS] vector), normalised to unit length
    by default. For the bundled checkpoint these are sentence-transformers' vectors."""

    task = "embed"

    def __call__(
        self, texts: str | list[str], pooling: str = "mean", normalize: bool = True
    ) -> torch.Tensor:
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling {pooling!r} is not 'mean' or 'cls'")
        items, single = _texts(texts)
        out = []
        for chunk in _batches(items, self.batch_size):
            enc = self._encode(chunk, return_attention_mask=False)
            feats = _features(enc)
            result, batch = self._run(feats)
            h = result.last_hidden_state.float()  # (B, T, H)
            if pooling == "cls":
                v = h[:, 0]
            else:
                m = batch["attention_mask"].unsqueeze(-1).float()
                v = (h * m).sum(1) / m.sum(1)
            out.append(torch.nn.functional.normalize(v, dim=-1) if normalize else v)
        vectors = torch.cat(out).cpu()
        return vectors[0] if single else vectors

    def run(
        self, items: list, pooling: str = "mean", normalize: bool = True, **_: Any
    ) -> list[list[float]]:
        return self(items, pooling=pooling, normalize=normalize).tolist()

    @classmethod
    def text(cls, item: str, result: list[float]) -> str:
        shown = ", ".join(f"{x:+.4f}" for x in result[:6])
        return f"{item}\t[{shown}, ...] ({len(result)} dims)"


class ClassifyPipeline(Pipeline):
    """Labels with their probabilities (softmax), best first; regression models give a value."""

    task = "classify"
    model_class = BertForSequenceClassification
    needs = ("classifier.",)

    def __call__(
        self, texts: str | list[str], pairs: str | list[str] | None = None, top_k: int | None = 1
    ) -> list:
        items, single = _texts(texts)
        pair_items = None if pairs is None else _texts(pairs)[0]
        if pair_items is not None and len(pair_items) != len(items):
            raise ValueError(f"{len(items)} texts but {len(pair_items)} pairs")
        names = self.model.config.labels
        results: list = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            pchunk = None if pair_items is None else pair_items[start : start + self.batch_size]
            enc = self._encode(chunk, pchunk, return_attention_mask=False)
            feats = _features(enc)
            out, _ = self._run(feats)
            logits = out.logits.float().cpu()
            if self.model.config.problem_type == "regression" or logits.shape[-1] == 1:
                results += [{"value": float(x)} for x in logits[:, 0]]
                continue
            probs = logits.softmax(-1)
            for row in probs:
                order = row.argsort(descending=True).tolist()[: top_k or len(names)]
                results.append([{"label": names[i], "score": float(row[i])} for i in order])
        return results[0] if single else results

    def run(self, items: list, top_k: int | None = None, pair: str | None = None, **_: Any) -> list:
        """``pair``: one second text for every input."""
        return self(items, [pair] * len(items) if pair else None, top_k=top_k or 1)

    @classmethod
    def text(cls, item: str, result: list | dict) -> str:
        if isinstance(result, dict):  # regression
            return f"{item}\t{result['value']:.4f}"
        return f"{item}\t" + ", ".join(f"{c['label']} {c['score']:.3f}" for c in result)


class TagPipeline(Pipeline):
    """Entities in raw text: each word's label from its first word piece, whole entities by the
    conlleval rules, with their text, character span and mean probability."""

    task = "tag"
    model_class = BertForTokenClassification
    needs = ("classifier.",)

    def __call__(self, texts: str | list[str]) -> list:
        items, single = _texts(texts)
        names = self.model.config.labels
        results = []
        for chunk in _batches(items, self.batch_size):
            enc = self._encode(chunk, return_offsets_mapping=True, return_attention_mask=False)
            feats = _features(enc)
            out, _ = self._run(feats)
            probs = out.logits.float().softmax(-1).cpu()
            for r, text in enumerate(chunk):
                word_ids, offsets = enc.word_ids(r), enc["offset_mapping"][r]
                words: dict[int, dict] = {}  # word -> its span, first-piece label and score
                for p, w in enumerate(word_ids):
                    if w is None:
                        continue
                    if w not in words:
                        best = int(probs[r, p].argmax())
                        words[w] = {
                            "label": names[best],
                            "score": float(probs[r, p, best]),
                            "start": offsets[p][0],
                            "end": offsets[p][1],
                        }
                    words[w]["end"] = offsets[p][1]  # the word's later pieces extend it
                order = sorted(words)
                tags = to_iob2([words[w]["label"] for w in order])
                entities = []
                for kind, first, last in sorted(conll_entities(tags), key=lambda c: c[1]):
                    span = [words[order[i]] for i in range(first, last + 1)]
                    a, b = span[0]["start"], span[-1]["end"]
                    score = sum(s["score"] for s in span) / len(span)
                    entities.append(
                        {"entity": kind, "text": text[a:b], "start": a, "end": b, "score": score}
                    )
                results.append(entities)
        return results[0] if single else results

    @classmethod
    def text(cls, item: str, result: list[dict]) -> str:
        shown = "; ".join(
            f"{e['entity']} {e['text']!r} [{e['start']}:{e['end']}] {e['score']:.3f}"
            for e in result
        )
        return f"{item}\t{shown or '(no entities)'}"


class AnswerPipeline(Pipeline):
    """The best answer span of a context, with its probability (start x end, over the window)
    and character offsets; ``top_k`` answers; with ``allow_no_answer`` (SQuAD 2.0 models) an
    empty answer when [CLS] scores higher than every span."""

    task = "answer"
    model_class = BertForQuestionAnswering
    needs = ("qa_outputs.",)

    def __call__(
        self,
        question: str,
        context: str,
        top_k: int = 1,
        max_answer_length: int = 30,
        max_length: int = 384,
        doc_stride: int = 128,
        max_query_length: int = 64,
        allow_no_answer: bool = False,
    ) -> dict | list[dict]:
        from bertlab.data.squad import SquadData, SquadExample, best_answers, encode_squad

        if not question.strip():
            raise ValueError("the question is empty")
        data = SquadData([SquadExample("q", "", question, context, [], None, None)], "1.1", "")
        features = encode_squad(
            self.tokenizer,
            data,
            max_length=max_length,
            doc_stride=doc_stride,
            max_query_length=max_query_length,
            training=False,
        )
        starts, ends = [], []
        for chunk in _batches(features, self.batch_size):
            out, _ = self._run(chunk)
            for r, f in enumerate(chunk):
                n = len(f["input_ids"])
                starts.append(out.start_logits[r, :n].float().cpu())
                ends.append(out.end_logits[r, :n].float().cpu())
        T = max(len(s) for s in starts)
        S = torch.full((len(starts), T), float("-inf"))
        E = torch.full((len(starts), T), float("-inf"))
        for w, (s, e) in enumerate(zip(starts, ends, strict=True)):
            S[w, : len(s)], E[w, : len(e)] = s, e
        norm = [float(S[w].logsumexp(0) + E[w].logsumexp(0)) for w in range(len(starts))]
        found = best_answers(
            data,
            features,
            S,
            E,
            n_best=max(20, top_k),
            max_answer_length=max_answer_length,
            null_threshold=0.0 if allow_no_answer else None,
        )["q"]
        spans = found["n_best"][:top_k]
        answers = [
            {
                "answer": s["text"],
                "start": s["start"],
                "end": s["end"],
                "score": math.exp(s["score"] - norm[s["window"]]),
            }
            for s in spans
        ]
        if allow_no_answer and found["text"] == "" and found["null_score"] is not None:
            # best_answers' null score is the lowest [CLS] score over the windows: that window's
            w0 = min(range(len(norm)), key=lambda w: float(S[w, 0] + E[w, 0]))
            null = {
                "answer": "",
                "start": 0,
                "end": 0,
                "score": math.exp(found["null_score"] - norm[w0]),
            }
            answers = [null, *answers][:top_k]
        if not answers:
            answers = [{"answer": "", "start": 0, "end": 0, "score": 0.0}]
        return answers[0] if top_k == 1 else answers

    @classmethod
    def parse(cls, line: str, n: int, context: str | None = None, **_: Any) -> dict[str, str]:
        """A JSON object {"question", "context"}, or a question about ``context``."""
        if context is not None:
            return {"question": line, "context": context}
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not {"question", "context"} <= set(obj):
            raise ValueError(
                f"answer input line {n}: a JSON object with question and context "
                "is expected (or pass --context)"
            )
        return obj

    def run(
        self,
        items: list,
        top_k: int | None = None,
        max_answer_length: int = 30,
        allow_no_answer: bool = False,
        **_: Any,
    ) -> list:
        return [
            self(
                x["question"],
                x["context"],
                top_k=top_k or 1,
                max_answer_length=max_answer_length,
                allow_no_answer=allow_no_answer,
            )
            for x in items
        ]

    @classmethod
    def text(cls, item: dict, result: dict | list[dict]) -> str:
        best = result[0] if isinstance(result, list) else result
        return (
            f"{item['question']}\t{best['answer']!r} [{best['start']}:{best['end']}] "
            f"{best['score']:.3f}"
        )


class FillMaskPipeline(Pipeline):
    """The ``top_k`` tokens for each [MASK], with their probabilities and the filled text, in
    transformers' shape: ``{score, token (the id), token_str, sequence}`` per candidate, a list
    per [MASK] when a text has several. ``targets`` ranks only the given tokens (a word outside
    the vocabulary stands for its first word piece). ``bertlab predict`` prints
    ``{token, id, score, sequence}`` (``run``)."""

    task = "fill-mask"
    model_class = BertForMaskedLM
    needs = ("cls.predictions.",)

    def _options(self, top_k: int = 5, targets: str | list[str] | None = None) -> dict:
        _check_top_k(top_k)
        ids = None
        if targets is not None:
            ids = sorted({self._target_id(t) for t in _texts(targets)[0]})
            if not ids:
                raise ValueError("targets is empty: give at least one token")
            top_k = min(top_k, len(ids))
        return {"top_k": top_k, "targets": ids}

    def _target_id(self, target: str) -> int:
        if target in self.tokenizer.vocab:
            return self.tokenizer.vocab[target]
        pieces = self.tokenizer.tokenize(target)
        if not pieces:
            raise ValueError(f"target {target!r} has no word piece in the vocabulary")
        return self.tokenizer.convert_tokens_to_ids(pieces[0])

    def _fill(self, texts: list[str], top_k: int, targets: list[int] | None) -> list[tuple]:
        """Per text: its ids, the [MASK] positions, and per [MASK] the top (score, id)."""
        mask_id = self.tokenizer.mask_token_id
        enc = self._encode(texts, return_attention_mask=False)
        for text, ids in zip(texts, enc["input_ids"], strict=True):
            if mask_id not in ids:
                raise ValueError(f"text {text!r} has no {self.tokenizer.mask_token} token")
        found = []
        feats = _features(enc)
        for chunk in _batches(feats, self.batch_size):
            out, _ = self._run(chunk)
            for r, f in enumerate(chunk):
                ids = f["input_ids"]
                masks = [p for p, t in enumerate(ids) if t == mask_id]
                probs = out.logits[r, masks].float().softmax(-1).cpu()  # (M, V)
                if targets is not None:
                    probs = probs[:, targets]
                top = probs.topk(top_k)
                best = [
                    [
                        (float(v), targets[i] if targets else i)
                        for v, i in zip(vs, js.tolist(), strict=True)
                    ]
                    for vs, js in zip(top.values.tolist(), top.indices, strict=True)
                ]
                found.append((ids, masks, best))
        return found

    def __call__(self, inputs: str | list[str], **options: Any) -> list:
        """One text: a list of candidates (a list of such lists when it has several [MASK]s);
        a list of texts: a list of those (a list of one text answers as that text alone)."""
        settings = self._settings(options)
        texts, single = _texts(inputs)
        results = []
        for ids, masks, best in self._fill(texts, **settings):
            one = len(masks) == 1  # several: the sequences keep [CLS], [SEP] and the other masks
            rows = [
                [
                    {
                        "score": score,
                        "token": t,
                        "token_str": self.tokenizer.decode([t]),
                        "sequence": self.tokenizer.decode(
                            ids[:p] + [t] + ids[p + 1 :], skip_special_tokens=one
                        ),
                    }
                    for score, t in candidates
                ]
                for p, candidates in zip(masks, best, strict=True)
            ]
            results.append(rows[0] if one else rows)
        return results[0] if single or len(results) == 1 else results

    def run(self, items: list, top_k: int | None = None, **_: Any) -> list:
        results = []
        for ids, masks, best in self._fill(items, top_k or 5, None):
            rows = [
                [
                    {
                        "token": self.tokenizer.convert_ids_to_tokens(t),
                        "id": t,
                        "score": score,
                        "sequence": self.tokenizer.decode(
                            ids[:p] + [t] + ids[p + 1 :], skip_special_tokens=True
                        ),
                    }
                    for score, t in candidates
                ]
                for p, candidates in zip(masks, best, strict=True)
            ]
            results.append(rows[0] if len(rows) == 1 else rows)
        return results

    @classmethod
    def text(cls, item: str, result: list) -> str:
        masks = result if result and isinstance(result[0], list) else [result]
        shown = " | ".join(", ".join(f"{c['token']} {c['score']:.3f}" for c in m) for m in masks)
        return f"{item}\t{shown}"


PIPELINES = {
    "embed": EmbedPipeline,
    "classify": ClassifyPipeline,
    "tag": TagPipeline,
    "answer": AnswerPipeline,
    "fill-mask": FillMaskPipeline,
}  # bertlab's own names, as `bertlab predict` knows them


def pipeline(
    task: str,
    model: str | os.PathLike | torch.nn.Module | None = "default",
    device: Device = None,
    batch_size: int = 32,
    *,
    tokenizer: str | os.PathLike | BertTokenizer | None = None,
    **options: Any,
) -> Pipeline:
    """A pipeline by task name: bertlab's own (embed, classify, tag, answer, fill-mask) or
    transformers' (feature-extraction, text-classification alias sentiment-analysis,
    token-classification alias ner, question-answering, zero-shot-classification), which answer
    in transformers' shapes. ``model``: a folder, "default" (the bundled model; also None) or a
    bertlab model object (then ``tokenizer=``: a BertTokenizer or a folder). ``device``: -1 or
    "cpu", a GPU index or "cuda:0", a torch.device. ``options``: defaults for every call
    (e.g. ``aggregation_strategy="simple"``)."""
    from bertlab.pipeline_tasks import ALIASES, TASKS  # it builds on this module's classes

    cls = PIPELINES.get(task) or TASKS.get(ALIASES.get(task, task))
    if cls is None:
        names = sorted({*PIPELINES, *TASKS, *ALIASES})
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(names)}")
    return cls("default" if model is None else model, device, batch_size, tokenizer, **options)

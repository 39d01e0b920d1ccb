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
"""

from __future__ import annotations

import json
import math
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


def _batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Pipeline:
    task = "base"
    model_class: type = BertModel
    needs: tuple[str, ...] = ()  # weight names that must come from the folder

    def __init__(self, model: str = "default", device: str = "cpu", batch_size: int = 32):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.directory = resolve_model_dir(model)
        self.tokenizer = BertTokenizer.from_pretrained(self.directory)
        self.model, info = self.model_class.from_pretrained(
            self.directory, output_loading_info=True
        )
        missing = [k for k in info.missing_keys if k.startswith(self.needs)] if self.needs else []
        if missing:
            raise ValueError(
                f"the model in {self.directory} has no trained weights for "
                f"{', '.join(sorted({k.rsplit('.', 1)[0] for k in missing}))}: a {self.task} "
                f"pipeline needs a model trained for it"
            )
        self.model.to(device).eval()
        self.device, self.batch_size = device, batch_size

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
    """The ``top_k`` tokens for each [MASK], with their probabilities and the filled text."""

    task = "fill-mask"
    model_class = BertForMaskedLM
    needs = ("cls.predictions.",)

    def __call__(self, texts: str | list[str], top_k: int = 5) -> list:
        items, single = _texts(texts)
        mask_id = self.tokenizer.mask_token_id
        results = []
        for chunk in _batches(items, self.batch_size):
            enc = self._encode(chunk, return_attention_mask=False)
            for i, ids in enumerate(enc["input_ids"]):
                if mask_id not in ids:
                    mask = self.tokenizer.mask_token
                    raise ValueError(f"text {chunk[i]!r} has no {mask} token")
            feats = _features(enc)
            out, _ = self._run(feats)
            probs = out.logits.float().softmax(-1).cpu()
            for r, ids in enumerate(enc["input_ids"]):
                per_mask = []
                for p in (p for p, t in enumerate(ids) if t == mask_id):
                    top = probs[r, p].topk(top_k)
                    per_mask.append(
                        [
                            {
                                "token": self.tokenizer.convert_ids_to_tokens([int(t)])[0],
                                "id": int(t),
                                "score": float(s),
                                "sequence": self.tokenizer.decode(
                                    [int(t) if q == p else x for q, x in enumerate(ids)],
                                    skip_special_tokens=True,
                                ),
                            }
                            for s, t in zip(top.values, top.indices, strict=True)
                        ]
                    )
                results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return results[0] if single else results

    def run(self, items: list, top_k: int | None = None, **_: Any) -> list:
        return self(items, top_k=top_k or 5)

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
}


def pipeline(
    task: str, model: str = "default", device: str = "cpu", batch_size: int = 32
) -> Pipeline:
    if task not in PIPELINES:
        raise ValueError(f"unknown pipeline {task!r}; choose one of {', '.join(PIPELINES)}")
    return PIPELINES[task](model, device, batch_size)

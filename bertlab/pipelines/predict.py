"""bertlab's own pipelines, as ``bertlab predict`` knows them: embed, classify, tag, answer,
fill-mask. Each reads its own input lines (``parse``), takes the command's options (``run``)
and formats its results as text (``text``) or JSON lines (``json_line``). Their rows run
through the one front half (front.py, by way of base.py); what is here is each task's reading
of the outputs, which the server's routes call too (``labels``, ``ranked``, ``words``,
``entities``, ``answers``, ``top``, ``candidates``). Imports base.py, front.py, text.py, the
network's heads, bertlab.metrics and the SQuAD reader (data/squad.py).
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from bertlab.data.squad import SquadData, SquadExample, best_answers, encode_squad
from bertlab.metrics import conll_entities, to_iob2
from bertlab.nn.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.nn.model import BertPreTrainedModel
from bertlab.nn.packing import mean_pool  # noqa: F401  (tests import it from here)
from bertlab.pipelines.base import Pipeline, _check_top_k, _fields, _texts
from bertlab.pipelines.front import Row, rows_of
from bertlab.pipelines.text import check_text


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
        if not items:
            return torch.empty(0, self.model.config.hidden_size)
        encoded = self._encode(items, pooling, fields=_fields("texts", len(items), single))
        vectors = torch.stack(self._outputs(rows_of(encoded)))  # (N, H) float32
        if normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
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
        pair_items = None if pairs is None else _texts(pairs, "pairs")[0]
        if pair_items is not None and len(pair_items) != len(items):
            raise ValueError(f"{len(items)} texts but {len(pair_items)} pairs")
        encoded = self._encode(
            items,
            "logits",
            pairs=pair_items,
            fields=_fields("texts", len(items), single),
            pair_fields=None if pair_items is None else _fields("pairs", len(items), single),
        )
        results = [self.labels(logits, top_k) for logits in self._outputs(rows_of(encoded))]
        return results[0] if single else results

    @property
    def regression(self) -> bool:
        """Whether the model gives one value per text rather than label probabilities."""
        config = self.model.config
        return config.problem_type == "regression" or config.num_labels == 1

    def labels(self, logits: torch.Tensor, top_k: int | None = 1) -> list[dict] | dict:
        """One text's (C,) logits -> its ``top_k`` labels by probability (softmax), best first
        (None: every label), or {"value"} for a regression model."""
        if self.regression:
            return {"value": float(logits[0])}
        return self.ranked(logits.float().softmax(-1), top_k)

    def ranked(self, scores: torch.Tensor, top_k: int | None = None) -> list[dict]:
        """(C,) scores (probabilities or logits) -> {label, score} best first, ``top_k`` of
        them (None: every label)."""
        names = self.model.config.labels
        order = scores.argsort(descending=True).tolist()[: top_k or len(names)]
        return [{"label": names[i], "score": float(scores[i])} for i in order]

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
        fields = _fields("texts", len(items), single)
        encoded = self._encode(items, "tokens", fields=fields, offsets=True)
        results = [
            self.entities(text, e.word_ids, e.offsets, probs)
            for text, e, probs in zip(items, encoded, self._outputs(rows_of(encoded)), strict=True)
        ]
        return results[0] if single else results

    def words(
        self, word_ids: list[int | None], offsets: list[tuple[int, int]], probs: torch.Tensor
    ) -> list[dict]:
        """One text's words in order from its pieces' word ids, character offsets and (T, C)
        label probabilities: each {label, score} of its first piece, and its {start, end}."""
        names = self.model.config.labels
        words: dict[int, dict] = {}
        for p, w in enumerate(word_ids):
            if w is None:
                continue
            if w not in words:
                best = int(probs[p].argmax())
                words[w] = {
                    "label": names[best],
                    "score": float(probs[p, best]),
                    "start": offsets[p][0],
                    "end": offsets[p][1],
                }
            words[w]["end"] = offsets[p][1]  # the word's later pieces extend it
        return [words[w] for w in sorted(words)]

    def entities(
        self,
        text: str,
        word_ids: list[int | None],
        offsets: list[tuple[int, int]],
        probs: torch.Tensor,
    ) -> list[dict]:
        """One text's entities (``words`` grouped by the conlleval rules), each with its text,
        character span and mean word score."""
        words = self.words(word_ids, offsets, probs)
        tags = to_iob2([w["label"] for w in words])
        entities = []
        for kind, first, last in sorted(conll_entities(tags), key=lambda c: c[1]):
            span = words[first : last + 1]
            a, b = span[0]["start"], span[-1]["end"]
            score = sum(s["score"] for s in span) / len(span)
            entities.append(
                {"entity": kind, "text": text[a:b], "start": a, "end": b, "score": score}
            )
        return entities

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
        data, features = self.windows(question, context, max_length, doc_stride, max_query_length)
        outs = self._outputs([Row(f["input_ids"], f["token_type_ids"], "span") for f in features])
        answers = self.answers(
            data,
            features,
            [s for s, _ in outs],
            [e for _, e in outs],
            top_k,
            max_answer_length,
            allow_no_answer,
        )
        return answers[0] if top_k == 1 else answers

    def windows(
        self,
        question: str,
        context: str,
        max_length: int = 384,
        doc_stride: int = 128,
        max_query_length: int = 64,
    ) -> tuple[Any, list[dict]]:
        """The question over windows of the context (``doc_stride`` tokens apart, each at most
        ``max_length`` tokens and the model's length): the example (a ``SquadData`` of one) and
        the windows' features, each with its context offsets."""
        check_text(question, "question", blank="the {field} is empty")
        check_text(context, "context")
        data = SquadData([SquadExample("q", "", question, context, [], None, None)], "1.1", "")
        features = encode_squad(
            self.tokenizer,
            data,
            max_length=min(max_length, self.limit),
            doc_stride=doc_stride,
            max_query_length=max_query_length,
            training=False,
        )
        return data, features

    def answers(
        self,
        data: Any,
        features: list[dict],
        starts: list[torch.Tensor],
        ends: list[torch.Tensor],
        top_k: int = 1,
        max_answer_length: int = 30,
        allow_no_answer: bool = False,
    ) -> list[dict]:
        """The ``top_k`` best spans over the windows, from each window's (n,) start and end
        logits, with their probability (start x end, softmax over the window) and character
        offsets; with ``allow_no_answer`` the empty answer where [CLS] scores higher."""
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
        return answers

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
    ``{token, id, score, sequence}`` (``run``). A folder loads as a BertForMaskedLM (a
    pre-training checkpoint's masked-LM head included); a model object may be any with a
    masked-LM head (BertForMaskedLM, BertForPreTraining)."""

    task = "fill-mask"
    model_class = BertForMaskedLM
    needs = ("cls.predictions.",)

    def _model(self, model: Any) -> torch.nn.Module:
        if isinstance(model, BertPreTrainedModel) and model.mlm_head() is not None:
            return model
        return super()._model(model)

    def _options(self, top_k: int = 5, targets: str | list[str] | None = None) -> dict:
        _check_top_k(top_k)
        ids = None
        if targets is not None:
            ids = sorted({self._target_id(t) for t in _texts(targets, "targets")[0]})
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
        encoded = self._encode(texts, "masks", fields=_fields("inputs", len(texts), False))
        for text, e in zip(texts, encoded, strict=True):
            if mask_id not in e.rows[0].input_ids:
                raise ValueError(f"text {text!r} has no {self.tokenizer.mask_token} token")
        found = []
        for e, logits in zip(encoded, self._outputs(rows_of(encoded)), strict=True):
            ids = e.rows[0].input_ids
            masks = [p for p, t in enumerate(ids) if t == mask_id]
            found.append((ids, masks, self.top(logits, top_k, targets)))
        return found

    @staticmethod
    def top(logits: torch.Tensor, top_k: int, targets: list[int] | None) -> list[list[tuple]]:
        """(M, V) logits at a text's [MASK]s -> per [MASK] its ``top_k`` (probability, id),
        ranked among ``targets`` only when given."""
        probs = logits.float().softmax(-1).cpu()
        if targets is not None:
            probs = probs[:, targets]
        top = probs.topk(top_k)
        return [
            [(float(v), targets[i] if targets else i) for v, i in zip(vs, js.tolist(), strict=True)]
            for vs, js in zip(top.values.tolist(), top.indices, strict=True)
        ]

    def candidates(self, ids: list[int], masks: list[int], best: list[list[tuple]]) -> list:
        """One text's candidates in transformers' shape: a list per [MASK] (just the list when
        there is one [MASK]) of {score, token, token_str, sequence}."""
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
        return rows[0] if one else rows

    def __call__(self, inputs: str | list[str], **options: Any) -> list:
        """One text: a list of candidates (a list of such lists when it has several [MASK]s);
        a list of texts: a list of those (a list of one text answers as that text alone)."""
        settings = self._settings(options)
        texts, single = _texts(inputs, "inputs")
        results = [self.candidates(*found) for found in self._fill(texts, **settings)]
        return results[0] if single or len(results) == 1 else results

    def run(self, items: list, top_k: int | None = None, **_: Any) -> list:
        results = []
        for ids, masks, best in self._fill(_texts(items, "inputs")[0], top_k or 5, None):
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

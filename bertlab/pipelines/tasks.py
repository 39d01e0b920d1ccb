"""Pipelines under transformers' task names, answering in transformers' result shapes (keys,
Python types, nesting for one input or a list): feature-extraction, fill-mask (shared with
bertlab's own, in predict.py), text-classification (alias sentiment-analysis),
token-classification (alias ner), question-answering, zero-shot-classification.

Built by ``bertlab.pipeline(task, model=..., tokenizer=..., device=..., **options)``. Options are
keywords of the call, or of ``pipeline()`` to set them for every call; an unknown option or a
bad value is refused by name before any text is read. Their rows run through the one front half
(front.py, by way of base.py), and question-answering reads its spans with the one span decoder
(data/squad.decode_spans, in transformers' scoring); what is here is transformers' reading and
result shapes. Held to transformers on the same weights by
tests/test_pipeline_transformers_tasks.py. Imports base.py, front.py, text.py, predict.py
(fill-mask), data/squad.py and nn/.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from bertlab.data.squad import decode_spans
from bertlab.nn.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.nn.model import BertModel
from bertlab.pipelines.base import (
    Pipeline,
    _check_flags,
    _check_top_k,
    _fields,
    _texts,
)
from bertlab.pipelines.front import Encoded, Row, rows_of
from bertlab.pipelines.predict import FillMaskPipeline
from bertlab.pipelines.text import check_text


class FeatureExtractionPipeline(Pipeline):
    """Each token's last hidden state, [CLS] and [SEP] included: per text a nested list
    (1, T, H), or with ``return_tensors=True`` a (1, T, H) tensor. A head model given as an
    object answers with its encoder's states. Texts longer than the model are truncated."""

    task = "feature-extraction"

    def _model(self, model: str | os.PathLike | torch.nn.Module) -> torch.nn.Module:
        if isinstance(getattr(model, "bert", None), BertModel):
            return model.bert
        return super()._model(model)

    def _options(self, return_tensors: bool = False, truncation: bool = True) -> dict:
        _check_flags(return_tensors=return_tensors, truncation=truncation)
        return {"return_tensors": return_tensors, "truncation": truncation}

    def __call__(self, inputs: str | list[str], **options: Any) -> list | torch.Tensor:
        settings = self._settings(options)
        texts, single = _texts(inputs, "inputs")
        encoded = self._encode(
            texts,
            "hidden",
            fields=_fields("inputs", len(texts), single),
            long="truncate" if settings["truncation"] else "error",
        )
        results = []
        for h in self._outputs(rows_of(encoded)):
            x = h[None]  # (1, T, H)
            results.append(x if settings["return_tensors"] else x.tolist())
        return results[0] if single else results


_UNSET: Any = object()  # text-classification's top_k when it is not given


class TextClassificationPipeline(Pipeline):
    """``{label, score}``: the best label, or with ``top_k`` (None: every label) a list, best
    first. Scores are a softmax over the labels, a sigmoid for one label or multi-label
    models, the raw value for regression (``function_to_apply`` chooses). A text pair is
    ``{"text": ..., "text_pair": ...}``. As in transformers, one text without ``top_k`` in
    the call answers as a list of one."""

    task = "text-classification"
    model_class = BertForSequenceClassification
    needs = ("classifier.",)
    FUNCTIONS = ("softmax", "sigmoid", "none")

    def _options(self, top_k: int | None = _UNSET, function_to_apply: str | None = None) -> dict:
        if top_k is not _UNSET:
            _check_top_k(top_k, none_ok=True)
        if function_to_apply is not None:
            name = str(getattr(function_to_apply, "value", function_to_apply)).lower()
            if name not in self.FUNCTIONS:
                raise ValueError(
                    f"function_to_apply {function_to_apply!r} is not one of "
                    f"{', '.join(self.FUNCTIONS)} (or None: the model's own)"
                )
            function_to_apply = name
        return {"top_k": top_k, "function_to_apply": function_to_apply}

    def _function(self) -> str:
        config = self.model.config
        if config.problem_type == "regression":
            return "none"
        if config.problem_type == "multi_label_classification" or config.num_labels == 1:
            return "sigmoid"
        return "softmax"

    def __call__(self, inputs: Any, **options: Any) -> list | dict:
        settings = self._settings(options)
        items, single = _text_pairs(inputs)
        encoded: list[Encoded | None] = [None] * len(items)
        for paired in (False, True):  # single texts, then pairs: one call each
            idx = [i for i, (_, p) in enumerate(items) if (p is not None) == paired]
            if idx:
                name = lambda i: "inputs" if single else f"inputs[{i}]"  # noqa: E731
                done = self._encode(
                    [items[i][0] for i in idx],
                    "logits",
                    pairs=[items[i][1] for i in idx] if paired else None,
                    fields=[name(i) for i in idx],
                    pair_fields=[f"{name(i)}.text_pair" for i in idx] if paired else None,
                )
                for i, e in zip(idx, done, strict=True):
                    encoded[i] = e
        outputs = self._outputs(rows_of(encoded))  # type: ignore[arg-type]
        function = settings["function_to_apply"] or self._function()
        names, top_k = self.model.config.labels, settings["top_k"]
        results: list = []
        for logits in outputs:  # (K,) each
            scores = {"softmax": logits.softmax(-1), "sigmoid": logits.sigmoid(), "none": logits}
            row = scores[function]
            if top_k is _UNSET:
                best = int(row.argmax())
                results.append({"label": names[best], "score": float(row[best])})
                continue
            ranked = [{"label": names[i], "score": float(x)} for i, x in enumerate(row)]
            ranked.sort(key=lambda c: c["score"], reverse=True)
            results.append(ranked[:top_k] if top_k is not None else ranked)
        if not single:
            return results
        return [results[0]] if isinstance(inputs, str) and "top_k" not in options else results[0]


class TokenClassificationPipeline(Pipeline):
    """Entities in raw text. ``aggregation_strategy="none"``: each word piece's best label
    ``{entity, score, index, word, start, end}`` (``index`` counts [CLS]); the others group
    pieces into ``{entity_group, score, word, start, end}``: "simple" joins neighbouring pieces
    of one entity type (B- starts a new one), "first", "average" and "max" first give each
    word the label of its first piece, of its averaged probabilities or of its most certain
    piece. A piece is a word's continuation when its text differs in length from the piece
    (``##``), as transformers decides. Labels in ``ignore_labels`` (default "O") are left
    out. Texts longer than the model are truncated."""

    task = "token-classification"
    model_class = BertForTokenClassification
    needs = ("classifier.",)
    STRATEGIES = ("none", "simple", "first", "average", "max")

    def _options(
        self, aggregation_strategy: str = "none", ignore_labels: list[str] | None = None
    ) -> dict:
        strategy = str(getattr(aggregation_strategy, "value", aggregation_strategy)).lower()
        if strategy not in self.STRATEGIES:
            raise ValueError(
                f"aggregation_strategy {aggregation_strategy!r} is not one of "
                f"{', '.join(self.STRATEGIES)}"
            )
        ignore = ["O"] if ignore_labels is None else _texts(list(ignore_labels))[0]
        return {"aggregation_strategy": strategy, "ignore_labels": ignore}

    def __call__(self, inputs: str | list[str], **options: Any) -> list:
        settings = self._settings(options)
        texts, single = _texts(inputs, "inputs")
        encoded = self._encode(
            texts, "tokens", fields=_fields("inputs", len(texts), single), offsets=True
        )
        results = [
            self._entities(self._pieces(text, e, probs), **settings)
            for text, e, probs in zip(texts, encoded, self._outputs(rows_of(encoded)), strict=True)
        ]
        return results[0] if single else results

    def _pieces(self, text: str, e: Encoded, probs: torch.Tensor) -> list[dict]:
        """The word pieces of a text (not [CLS], [SEP]) with their probabilities (T, K)."""
        pieces = []
        ids = e.rows[0].input_ids
        for p, (a, b) in enumerate(e.offsets):
            if e.special[p]:
                continue
            word = self.tokenizer.convert_ids_to_tokens(ids[p])
            continues = len(word) != b - a
            if ids[p] == self.tokenizer.unk_token_id:
                word, continues = text[a:b], False
            pieces.append(
                {
                    "word": word,
                    "probs": probs[p],
                    "index": p,
                    "start": a,
                    "end": b,
                    "sub": continues,
                }
            )
        return pieces

    def _entities(
        self, pieces: list[dict], aggregation_strategy: str, ignore_labels: list[str]
    ) -> list[dict]:
        names = self.model.config.labels
        if aggregation_strategy in ("none", "simple"):
            tagged = []
            for piece in pieces:
                best = int(piece["probs"].argmax())
                tagged.append(
                    {
                        "entity": names[best],
                        "score": float(piece["probs"][best]),
                        "index": piece["index"],
                        "word": piece["word"],
                        "start": piece["start"],
                        "end": piece["end"],
                    }
                )
        else:
            words: list[list[dict]] = []
            for piece in pieces:
                if words and piece["sub"]:
                    words[-1].append(piece)
                else:
                    words.append([piece])
            tagged = [self._word(w, aggregation_strategy) for w in words]
        if aggregation_strategy != "none":
            tagged = self._groups(tagged)
        return [
            e
            for e in tagged
            if e.get("entity") not in ignore_labels and e.get("entity_group") not in ignore_labels
        ]

    def _word(self, pieces: list[dict], strategy: str) -> dict:
        """One word's label and score from its pieces."""
        if strategy == "average":
            probs = torch.stack([p["probs"] for p in pieces]).mean(0)
        elif strategy == "max":
            probs = max(pieces, key=lambda p: float(p["probs"].max()))["probs"]
        else:  # first
            probs = pieces[0]["probs"]
        best = int(probs.argmax())
        return {
            "entity": self.model.config.labels[best],
            "score": float(probs[best]),
            "word": self.tokenizer.convert_tokens_to_string([p["word"] for p in pieces]),
            "start": pieces[0]["start"],
            "end": pieces[-1]["end"],
        }

    def _groups(self, tagged: list[dict]) -> list[dict]:
        """Neighbours of one entity type joined; a B- label starts a new group."""

        def split(label: str) -> tuple[str, str]:
            if label.startswith(("B-", "I-")):
                return label[0], label[2:]
            return "I", label

        runs: list[list[dict]] = []
        for e in tagged:
            kind, name = split(e["entity"])
            if runs and kind != "B" and name == split(runs[-1][-1]["entity"])[1]:
                runs[-1].append(e)
            else:
                runs.append([e])
        return [
            {
                "entity_group": run[0]["entity"].split("-", 1)[-1],
                "score": sum(e["score"] for e in run) / len(run),
                "word": self.tokenizer.convert_tokens_to_string([e["word"] for e in run]),
                "start": run[0]["start"],
                "end": run[-1]["end"],
            }
            for run in runs
        ]


class QuestionAnsweringPipeline(Pipeline):
    """``{score, start, end, answer}``: the best span of the context (``top_k``: a list of the
    best, unless only one was found). A span's score is P(start) x P(end), each a softmax over
    the context's tokens and [CLS] within a window of ``max_seq_len`` tokens (at most the
    model's length, ``front.max_tokens``); windows overlap by ``min(doc_stride, max_seq_len //
    2)`` tokens. Spans run at most ``max_answer_len``
    tokens; with ``align_to_words`` their ends are widened to whole words.
    ``handle_impossible_answer`` adds the empty answer, scored by [CLS]. Questions come as
    ``(question, context)``, ``question=``/``context=`` (lists too), a dict or a list of
    dicts. transformers 5 has no question-answering pipeline; this follows the shape and
    scoring of its last one (4.x). ``max_question_len`` is accepted, and (as there, with a
    fast tokenizer) the question is not cut."""

    task = "question-answering"
    model_class = BertForQuestionAnswering
    needs = ("qa_outputs.",)

    def _options(
        self,
        top_k: int = 1,
        doc_stride: int = 128,
        max_answer_len: int = 15,
        max_seq_len: int = 384,
        max_question_len: int = 64,
        handle_impossible_answer: bool = False,
        align_to_words: bool = True,
    ) -> dict:
        _check_top_k(top_k)
        for name, value, least in (
            ("doc_stride", doc_stride, 0),
            ("max_answer_len", max_answer_len, 1),
            ("max_seq_len", max_seq_len, 4),
            ("max_question_len", max_question_len, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} {value!r} is not an int >= {least}")
        _check_flags(
            handle_impossible_answer=handle_impossible_answer, align_to_words=align_to_words
        )
        return {
            "top_k": top_k,
            "doc_stride": doc_stride,
            "max_answer_len": max_answer_len,
            "max_seq_len": max_seq_len,
            "null": handle_impossible_answer,
            "align": align_to_words,
        }

    def __call__(self, *args: Any, **options: Any) -> dict | list:
        question, context = options.pop("question", None), options.pop("context", None)
        settings = self._settings(options)
        examples = _questions(args, question, context)
        results = [self._answer(q, c, **settings) for q, c in examples]
        return results[0] if len(results) == 1 else results

    def _answer(
        self,
        question: str,
        context: str,
        top_k: int,
        doc_stride: int,
        max_answer_len: int,
        max_seq_len: int,
        null: bool,
        align: bool,
    ) -> dict | list[dict]:
        max_seq_len = min(max_seq_len, self.limit)  # windows the model can read
        enc = self.tokenizer(
            question,
            context,
            truncation="only_second",
            max_length=max_seq_len,
            stride=min(doc_stride, max_seq_len // 2),
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_attention_mask=False,
        )
        windows = enc.encodings
        rows = [Row(w.ids, w.type_ids, "span") for w in windows]
        outs = self._outputs(rows)
        # the context's tokens may answer; [CLS] is the empty answer
        allowed = [torch.tensor([s == 1 for s in w.sequence_ids]) for w in windows]
        spans, null_score = decode_spans(
            [s for s, _ in outs],
            [e for _, e in outs],
            allowed,
            top_k=top_k,
            max_answer_length=max_answer_len,
            scoring="probabilities",
        )
        answers = []
        for span in spans:
            a, z = _span_chars(windows[span.window], span.start, span.end, align)
            answers.append({"score": span.score, "start": a, "end": z, "answer": context[a:z]})
        if null:
            answers.append({"score": null_score, "start": 0, "end": 0, "answer": ""})
        answers = sorted(answers, key=lambda x: x["score"], reverse=True)[:top_k]
        return answers[0] if len(answers) == 1 else answers


def _span_chars(window: Any, s: int, e: int, align: bool) -> tuple[int, int]:
    """Character offsets in the context of tokens s..e of a window (a tokenizers Encoding),
    widened to whole words with ``align``."""
    if align:
        first, last = window.token_to_word(s), window.token_to_word(e)
        if first is not None and last is not None:
            return (
                window.word_to_chars(first, sequence_index=1)[0],
                window.word_to_chars(last, sequence_index=1)[1],
            )
    return window.offsets[s][0], window.offsets[e][1]


def _questions(args: tuple, question: Any, context: Any) -> list[tuple[str, str]]:
    """question-answering's inputs as (question, context) pairs."""
    if args and (question is not None or context is not None):
        raise TypeError("give the questions as arguments or as question=/context=, not both")
    if len(args) == 2 and all(isinstance(a, str) for a in args):
        question, context = args
    elif len(args) == 1 and isinstance(args[0], (dict, list, tuple)):
        items = [args[0]] if isinstance(args[0], dict) else list(args[0])
        if not items or not all(isinstance(x, dict) for x in items):
            raise TypeError("questions as one argument: a dict or a list of dicts")
        for x in items:
            if not {"question", "context"} <= set(x):
                raise ValueError(f"{x!r} lacks a 'question' or a 'context'")
        return [_question(x["question"], x["context"]) for x in items]
    elif args:
        raise TypeError(
            "questions: (question, context), question=/context=, a dict {question, context} "
            "or a list of such dicts"
        )
    if question is None or context is None:
        raise ValueError("question-answering needs both a question and a context")
    if isinstance(question, str) and isinstance(context, str):
        return [_question(question, context)]
    questions = [question] if isinstance(question, str) else list(question)
    contexts = [context] if isinstance(context, str) else list(context)
    if len(questions) == 1:
        questions = questions * len(contexts)
    if len(contexts) == 1:
        contexts = contexts * len(questions)
    if len(questions) != len(contexts):
        raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts")
    return [_question(q, c) for q, c in zip(questions, contexts, strict=True)]


def _question(question: Any, context: Any) -> tuple[str, str]:
    for name, value in (("question", question), ("context", context)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        check_text(value, name, blank="the {field} is empty")
    return question, context


class ZeroShotClassificationPipeline(Pipeline):
    """Labels chosen when called, by an NLI model: each ``candidate_labels`` entry becomes the
    hypothesis ``hypothesis_template.format(label)`` after the text, and the entailment logit
    scores it: a softmax over the labels, or with ``multi_label`` (or one label) a softmax of
    entailment against contradiction per label. ``{sequence, labels, scores}``, best first.
    The entailment label is the first whose name starts with "entail"; a model without one
    is refused, naming its labels."""

    task = "zero-shot-classification"
    model_class = BertForSequenceClassification
    needs = ("classifier.",)

    def _model(self, model: str | os.PathLike | torch.nn.Module) -> torch.nn.Module:
        loaded = super()._model(model)
        labels = loaded.config.labels
        found = [i for i, name in enumerate(labels) if name.lower().startswith("entail")]
        if not found:
            raise ValueError(
                f"zero-shot-classification needs an NLI model with an entailment label (a name "
                f"starting with 'entail'); this model's labels are {labels}"
            )
        self.entailment = found[0]
        self.contradiction = -1 if self.entailment == 0 else 0  # as transformers picks it
        return loaded

    def _options(
        self,
        candidate_labels: str | list[str] | None = None,
        hypothesis_template: str = "This example is {}.",
        multi_label: bool = False,
    ) -> dict:
        if isinstance(candidate_labels, str):
            candidate_labels = [x.strip() for x in candidate_labels.split(",") if x.strip()]
        if candidate_labels is not None:
            candidate_labels = _texts(list(candidate_labels), "candidate_labels")[0]
            if not candidate_labels:
                raise ValueError("candidate_labels is empty: give at least one label")
        if not isinstance(hypothesis_template, str) or (
            hypothesis_template.format("x") == hypothesis_template
        ):
            raise ValueError(
                f"hypothesis_template {hypothesis_template!r} has no {{}} for the label"
            )
        check_text(hypothesis_template, "hypothesis_template")
        _check_flags(multi_label=multi_label)
        return {
            "labels": candidate_labels,
            "template": hypothesis_template,
            "multi_label": multi_label,
        }

    def __call__(self, sequences: str | list[str], *args: Any, **options: Any) -> dict | list:
        if len(args) == 1 and "candidate_labels" not in options:
            options["candidate_labels"] = args[0]
        elif args:
            raise TypeError("zero-shot-classification takes the texts and the candidate labels")
        settings = self._settings(options)
        labels = settings["labels"]
        if labels is None:
            raise ValueError("zero-shot-classification needs candidate_labels")
        texts, single = _texts(sequences, "sequences")
        hypotheses = [settings["template"].format(x) for x in labels]
        L = len(labels)
        encoded = []
        for field, text in zip(_fields("sequences", len(texts), single), texts, strict=True):
            encoded += self._encode(
                [text] * L,
                "logits",
                pairs=hypotheses,
                fields=[field] * L,
                pair_fields=[f"candidate_labels[{j}]" for j in range(L)],
                pair_truncation="only_first",
            )
        logits = torch.stack(self._outputs(rows_of(encoded)))
        per_text = logits.view(len(texts), L, -1)  # (N, L, K)
        results = []
        for text, x in zip(texts, per_text, strict=True):
            if settings["multi_label"] or L == 1:
                scores = x[:, [self.contradiction, self.entailment]].softmax(-1)[:, 1]
            else:
                scores = x[:, self.entailment].softmax(0)
            order = scores.argsort(stable=True).flip(0).tolist()
            results.append(
                {
                    "sequence": text,
                    "labels": [labels[i] for i in order],
                    "scores": [float(scores[i]) for i in order],
                }
            )
        return results[0] if single else results


def _text_pairs(inputs: Any) -> tuple[list[tuple[str, str | None]], bool]:
    """text-classification's inputs: a text, a pair {"text", "text_pair"}, or a list of these."""

    def one(x: Any, field: str) -> tuple[str, str | None]:
        if isinstance(x, str):
            return check_text(x, field), None
        if isinstance(x, dict) and "text" in x and set(x) <= {"text", "text_pair"}:
            if not isinstance(x["text"], str) or not isinstance(x.get("text_pair", ""), str):
                raise TypeError(f"text and text_pair must be str, got {x!r}")
            pair = x.get("text_pair")
            if pair is not None:
                check_text(pair, f"{field}.text_pair")
            return check_text(x["text"], f"{field}.text"), pair
        raise TypeError(
            f"{x!r} is not a text or a pair: send a str, or a dict "
            '{"text": "...", "text_pair": "..."}'
        )

    if isinstance(inputs, (str, dict)):
        return [one(inputs, "inputs")], True
    if isinstance(inputs, (list, tuple)) and inputs:
        return [one(x, f"inputs[{i}]") for i, x in enumerate(inputs)], False
    raise TypeError("inputs must be a str, a dict {text, text_pair}, or a non-empty list of these")


TASKS = {
    "feature-extraction": FeatureExtractionPipeline,
    "fill-mask": FillMaskPipeline,
    "text-classification": TextClassificationPipeline,
    "token-classification": TokenClassificationPipeline,
    "question-answering": QuestionAnsweringPipeline,
    "zero-shot-classification": ZeroShotClassificationPipeline,
}  # transformers' names
ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification"}

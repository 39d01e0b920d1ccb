"""The task heads on top of BertModel: pre-training (masked LM + next sentence prediction),
masked LM, next sentence prediction, sequence classification, token classification, question
answering, multiple choice. Each returns a small typed output with transformers' field names;
labels of -100 are ignored. Names and shapes as in model.py.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertlab.nn import products
from bertlab.nn.activations import ACTIVATIONS
from bertlab.nn.checks import check_labels as _check_labels
from bertlab.nn.config import BertConfig
from bertlab.nn.losses import IGNORE_INDEX, pretraining_loss
from bertlab.nn.model import BertModel, BertPreTrainedModel, Encoded
from bertlab.nn.module import Module
from bertlab.nn.outputs import (
    BertForPreTrainingOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)


# ============================================================================ heads
class BertPredictionHeadTransform(Module):
    """LN(act(W h + b)): the MLM head's transform before the vocabulary projection."""

    def __init__(self, hidden_size: int, hidden_act: str, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.transform_act_fn = ACTIVATIONS[hidden_act].module()
        self.hidden_act = hidden_act
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H)
        return products.linear(self.dense, x, act=self.transform_act_fn, norm=self.LayerNorm)


class BertLMPredictionHead(Module):
    """Masked-LM output: transform, then scores against the (tied) word embeddings plus an
    output-only bias per token (reference 004, "MLM-Sim": T extra parameters)."""

    def __init__(self, hidden_size: int, vocab_size: int, hidden_act: str, layer_norm_eps: float):
        super().__init__()
        self.transform = BertPredictionHeadTransform(hidden_size, hidden_act, layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size, bias=False)  # weight tied to embeddings
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        return F.linear(self.transform(x), self.decoder.weight, self.bias)


class BertPreTrainingHeads(Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.predictions = BertLMPredictionHead(
            c.hidden_size, c.vocab_size, c.hidden_act, c.layer_norm_eps
        )
        self.seq_relationship = nn.Linear(c.hidden_size, 2)


class BertOnlyMLMHead(Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.predictions = BertLMPredictionHead(
            c.hidden_size, c.vocab_size, c.hidden_act, c.layer_norm_eps
        )


class BertOnlyNSPHead(Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor, name: str) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100. logits (N, K), labels (N,)."""
    _check_labels(labels, logits.shape[-1], name)
    return F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


class BertForPreTraining(BertPreTrainedModel):
    """Masked LM + next sentence prediction, the pre-training objective (loss = MLM + NSP)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids, -100 where not predicted
        next_sentence_label: torch.Tensor | None = None,  # (B,) 0 = B follows A, 1 = random
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool = True,  # False (with labels): score only the labelled positions
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BertForPreTrainingOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        if (labels is None) != (next_sentence_label is None):
            raise ValueError("BertForPreTraining needs both labels and next_sentence_label")
        scores, targets, mlm_logits = _masked_lm(self.cls.predictions, enc, labels, return_logits)
        nsp_logits = self.cls.seq_relationship(enc.pooled)  # (B, 2)
        loss = None
        if labels is not None:
            nsp_labels = next_sentence_label.reshape(-1)
            _check_labels(nsp_labels, 2, "next_sentence_label")
            loss, _ = pretraining_loss(scores, targets, nsp_logits, nsp_labels, accuracy=False)
        out = BertForPreTrainingOutput(
            loss, mlm_logits, nsp_logits, enc.hidden_states, enc.attentions
        )
        return self.returned(out, return_dict)


class BertForMaskedLM(BertPreTrainedModel):
    """Masked LM only (no pooler, no NSP)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T), -100 where not predicted
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_logits: bool = True,  # False (with labels): score only the labelled positions
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        scores, targets, logits = _masked_lm(self.cls.predictions, enc, labels, return_logits)
        loss = None if targets is None else pretraining_loss(scores, targets, accuracy=False)[0]
        out = MaskedLMOutput(loss, logits, enc.hidden_states, enc.attentions)
        return self.returned(out, return_dict)


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertOnlyNSPHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) 0 = B follows A, 1 = random
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> NextSentencePredictorOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        logits = self.cls.seq_relationship(enc.pooled)  # (B, 2)
        loss = None if labels is None else _cross_entropy(logits, labels.reshape(-1), "label")
        out = NextSentencePredictorOutput(loss, logits, enc.hidden_states, enc.attentions)
        return self.returned(out, return_dict)


def _masked_lm(
    head: BertLMPredictionHead, enc: Encoded, labels: torch.Tensor | None, return_logits: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(scores (N, V), their labels (N,), logits (B, T, V)) for ``pretraining_loss``; without
    labels, the first two are None. With ``return_logits=False`` and labels, only the positions
    that have a label are scored, as the original pre-training code does (it gathers the masked
    positions): about 15% of the vocabulary projection, and the logits are None."""
    flat = None if labels is None else enc.per_token(labels).reshape(-1)
    if flat is not None:
        _check_labels(flat, head.bias.shape[0], "MLM label")
    if return_logits or flat is None:
        logits = head(enc.hidden)  # (B, T, V), or (N, V) packed
        scores = None if flat is None else logits.view(-1, logits.shape[-1])
        return scores, flat, enc.padded(logits)
    keep = (flat != IGNORE_INDEX).nonzero().squeeze(1)
    hidden = enc.hidden.reshape(-1, enc.hidden.shape[-1]).index_select(0, keep)
    return head(hidden), flat[keep], None


def _dropout_p(config: BertConfig) -> float:
    c = config
    return c.hidden_dropout_prob if c.classifier_dropout is None else c.classifier_dropout


class BertForSequenceClassification(BertPreTrainedModel):
    """Classifier on the pooled [CLS] vector: single-label (cross-entropy), multi-label
    (binary cross-entropy per label) or regression (num_labels = 1, mean squared error)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(_dropout_p(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) class ids, (B, K) 0/1 floats, or (B,) values
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        logits = self.classifier(self.dropout(enc.pooled))  # (B, K)
        loss = None if labels is None else self._loss(logits, labels)
        out = SequenceClassifierOutput(loss, logits, enc.hidden_states, enc.attentions)
        return self.returned(out, return_dict)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        kind = self.config.problem_type
        if kind is None:  # inferred as transformers does
            if self.num_labels == 1:
                kind = "regression"
            elif not labels.is_floating_point():
                kind = "single_label_classification"
            else:
                kind = "multi_label_classification"
        if kind == "regression":
            if self.num_labels == 1:
                return F.mse_loss(logits.squeeze().float(), labels.squeeze().float())
            return F.mse_loss(logits.float(), labels.float())
        if kind == "single_label_classification":
            return _cross_entropy(logits, labels.reshape(-1), "label")
        if tuple(labels.shape) != tuple(logits.shape):
            raise ValueError(
                f"multi-label targets must have shape {tuple(logits.shape)}, "
                f"got {tuple(labels.shape)}"
            )
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class BertForTokenClassification(BertPreTrainedModel):
    """A label per token (entity tagging); -100 marks positions without a label."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(_dropout_p(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T), -100 ignored
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> TokenClassifierOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        logits = self.classifier(self.dropout(enc.hidden))  # (B, T, K), or (N, K) packed
        loss = None
        if labels is not None:
            flat = enc.per_token(labels).reshape(-1)
            loss = _cross_entropy(logits.view(-1, self.num_labels), flat, "label")
        out = TokenClassifierOutput(loss, enc.padded(logits), enc.hidden_states, enc.attentions)
        return self.returned(out, return_dict)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA (reference 000): a start and an end score for every token of the passage.

    Padding positions (attention_mask 0) score the dtype's lowest value with every kernel, so
    they are never an answer and add nothing to the loss; an answer position on padding is
    ignored like one past the end. The results therefore never depend on the padding, and
    packed, sdpa and eager agree everywhere. (transformers leaves padding positions their
    computed scores, inside its softmax: its scores and loss differ there; the real positions'
    scores are the same.)"""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # (B,) token index of the answer start
        end_positions: torch.Tensor | None = None,  # (B,) token index of the answer end
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringModelOutput:
        enc = self.bert.encode(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        # Padding positions get the dtype's lowest score, whatever the kernel: they are never
        # an answer, and an answer position that falls on padding is ignored by the loss.
        logits = enc.padded(self.qa_outputs(enc.hidden))  # (B, T, 2)
        real = None if attention_mask is None else attention_mask.bool()  # (B, T)
        if real is not None:
            logits = logits.masked_fill(~real[..., None], torch.finfo(logits.dtype).min)
        start_logits, end_logits = logits.unbind(-1)  # (B, T)
        loss = None
        if start_positions is not None and end_positions is not None:
            # As in the reference: positions outside the sequence (an answer cut off by a
            # window) are clamped to T and ignored by the loss.
            T = start_logits.shape[1]

            def target(positions: torch.Tensor) -> torch.Tensor:  # (B,) -> (B,), T = ignored
                p = positions.reshape(-1).clamp(0, T)
                if real is None:
                    return p
                on_padding = ~real.gather(1, p.clamp(max=T - 1)[:, None]).squeeze(1)
                return p.masked_fill(on_padding, T)

            start, end = target(start_positions), target(end_positions)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=T)
                + F.cross_entropy(end_logits.float(), end, ignore_index=T)
            ) / 2
        out = QuestionAnsweringModelOutput(
            loss,
            start_logits.contiguous(),
            end_logits.contiguous(),
            enc.hidden_states,
            enc.attentions,
        )
        return self.returned(out, return_dict)


class BertForMultipleChoice(BertPreTrainedModel):
    """Scores C candidate continuations: each (context, choice) pair -> pooled -> one score."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(_dropout_p(config))
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # (B, C, T)
        attention_mask: torch.Tensor | None = None,  # (B, C, T)
        token_type_ids: torch.Tensor | None = None,  # (B, C, T)
        position_ids: torch.Tensor | None = None,  # (B, C, T)
        inputs_embeds: torch.Tensor | None = None,  # (B, C, T, H)
        labels: torch.Tensor | None = None,  # (B,) index of the right choice
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> MultipleChoiceModelOutput:
        ref = input_ids if input_ids is not None else inputs_embeds
        if ref is None or ref.dim() != (3 if input_ids is not None else 4):
            shape = None if ref is None else tuple(ref.shape)
            raise ValueError(
                f"multiple choice inputs must have shape (batch, choices, seq_len), got {shape}"
            )
        B, C = ref.shape[:2]

        def flat(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.reshape(B * C, *t.shape[2:])

        enc = self.bert.encode(
            flat(input_ids),
            flat(attention_mask),
            flat(token_type_ids),
            flat(position_ids),
            flat(inputs_embeds),
            output_hidden_states,
            output_attentions,
            **kwargs,
        )
        logits = self.classifier(self.dropout(enc.pooled)).view(B, C)
        loss = None if labels is None else _cross_entropy(logits, labels.reshape(-1), "label")
        out = MultipleChoiceModelOutput(loss, logits, enc.hidden_states, enc.attentions)
        return self.returned(out, return_dict)


# Every model class by the name transformers gives it (the "architectures" of config.json).
MODEL_CLASSES: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertForQuestionAnswering,
        BertForMultipleChoice,
    )
}


# The heads by the names the command line uses (bertlab summary --head, bertlab export --head).
HEADS: dict[str, type[BertPreTrainedModel]] = {
    "base": BertModel,
    "pretraining": BertForPreTraining,
    "masked-lm": BertForMaskedLM,
    "nsp": BertForNextSentencePrediction,
    "sequence-classification": BertForSequenceClassification,
    "token-classification": BertForTokenClassification,
    "question-answering": BertForQuestionAnswering,
    "multiple-choice": BertForMultipleChoice,
}


def head_of(architectures: list[str] | tuple[str, ...] | None) -> str:
    """The head (a key of HEADS) that a config's ``architectures`` names first, or "base"."""
    by_class = {cls.__name__: name for name, cls in HEADS.items()}
    return next((by_class[a] for a in architectures or () if a in by_class), "base")

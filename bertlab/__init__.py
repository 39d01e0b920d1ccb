"""bertlab: a complete BERT in PyTorch, exact to the reference, readable, fast."""

from .checkpoint import LoadingInfo, bundled_model_dir, read_state_dict
from .config import BertConfig
from .heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel, BertPreTrainedModel
from .tokenizer import BertTokenizer, train_vocab

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertModel",
    "BertPreTrainedModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
    "BertTokenizer",
    "LoadingInfo",
    "bundled_model_dir",
    "read_state_dict",
    "train_vocab",
]

"""bertlab: a complete BERT in PyTorch, exact to the reference, readable, fast."""

from bertlab.files import bundled_model_dir
from bertlab.io.checkpoint import LoadingInfo, read_state_dict
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertlab.nn.model import BertModel, BertPreTrainedModel
from bertlab.pipelines import pipeline
from bertlab.tokenizer import BertTokenizer, train_vocab

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
    "pipeline",
    "read_state_dict",
    "train_vocab",
]

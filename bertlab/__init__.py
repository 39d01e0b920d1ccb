"""bertlab: a complete BERT in PyTorch, exact to the reference, readable, fast."""

# First, before anything imports torch: how its OpenMP threads wait (bertlab/openmp.py).
from bertlab import openmp  # noqa: F401

# isort: split
import random

from bertlab import explore
from bertlab.auto import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)
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
from bertlab.nn.outputs import ModelOutput
from bertlab.pipelines import pipeline
from bertlab.tokenizer import BatchEncoding, BertTokenizer, train_vocab

# transformers' name of its tokenizers-backed class; bertlab has one tokenizer, on tokenizers.
BertTokenizerFast = BertTokenizer
PreTrainedModel = BertPreTrainedModel


def set_seed(seed: int) -> None:
    """Seed Python's, NumPy's (when installed) and torch's random generators."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ImportError:  # numpy is optional
        return
    np.random.seed(seed)


__version__ = "0.1.0"

__all__ = [
    "AutoConfig",
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForNextSentencePrediction",
    "AutoModelForPreTraining",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoTokenizer",
    "BatchEncoding",
    "BertTokenizerFast",
    "ModelOutput",
    "PreTrainedModel",
    "explore",
    "pipeline",
    "set_seed",
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

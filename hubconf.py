"""torch.hub entry points: ``torch.hub.load(REPO_OR_PATH, "model", "default")``.

The entry names are those torch.hub users know for BERT (``model``, ``modelForMaskedLM``,
``tokenizer``, ``config`` ...); the argument is what ``from_pretrained`` takes: a model folder,
``"default"`` for the bundled checkpoint, or a name in the local Hugging Face cache. Nothing is
downloaded. With ``source="local"`` torch.hub imports this file from a clone of the repository.
"""

import bertlab

dependencies = ["torch", "tokenizers", "safetensors"]


def config(name: str = "default", **kwargs):
    """The model's BertConfig."""
    return bertlab.BertConfig.from_pretrained(name, **kwargs)


def tokenizer(name: str = "default", **kwargs):
    """The model's WordPiece tokenizer."""
    return bertlab.BertTokenizer.from_pretrained(name, **kwargs)


def model(name: str = "default", **kwargs):
    """The encoder (BertModel)."""
    return bertlab.BertModel.from_pretrained(name, **kwargs)


def modelForPreTraining(name: str = "default", **kwargs):
    return bertlab.BertForPreTraining.from_pretrained(name, **kwargs)


def modelForMaskedLM(name: str = "default", **kwargs):
    return bertlab.BertForMaskedLM.from_pretrained(name, **kwargs)


def modelForNextSentencePrediction(name: str = "default", **kwargs):
    return bertlab.BertForNextSentencePrediction.from_pretrained(name, **kwargs)


def modelForSequenceClassification(name: str = "default", **kwargs):
    return bertlab.BertForSequenceClassification.from_pretrained(name, **kwargs)


def modelForTokenClassification(name: str = "default", **kwargs):
    return bertlab.BertForTokenClassification.from_pretrained(name, **kwargs)


def modelForQuestionAnswering(name: str = "default", **kwargs):
    return bertlab.BertForQuestionAnswering.from_pretrained(name, **kwargs)


def modelForMultipleChoice(name: str = "default", **kwargs):
    return bertlab.BertForMultipleChoice.from_pretrained(name, **kwargs)

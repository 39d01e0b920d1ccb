"""bertlab's modules read their registered submodules through their class (nn/module.py): a
forward makes no failed attribute lookup on them, and what a read returns is always what is
registered at that moment, however it was put there or taken away."""

import copy
import pickle

import pytest
import torch
from helpers import small_encoder
from peft import LoraConfig, get_peft_model
from torch import nn

from bertlab import BertForSequenceClassification
from bertlab.nn import heads as heads_module
from bertlab.nn import model as model_module
from bertlab.nn.model import BertSelfOutput
from bertlab.nn.module import Module, Registered


def model_and_batch(kernel="packed", head=None):
    """small_encoder's 3-layer model (width 64) in float32, and its padded batch."""
    model, ids, mask = small_encoder(torch.float32, kernel, head)
    return model, {"input_ids": ids, "attention_mask": mask}


def failed_lookups(model: nn.Module, inputs: dict) -> list[tuple[str, str]]:
    """(class, name) of every read on a bertlab module that reached nn.Module's __getattr__
    after the ordinary lookup failed, during one forward."""
    misses: list[tuple[str, str]] = []
    original = nn.Module.__getattr__
    through_class = Registered.__get__

    def counted(self, name):
        if isinstance(self, Module) and not getattr(reading, "on", False):
            misses.append((type(self).__name__, name))
        return original(self, name)

    class Reading:
        on = False

    reading = Reading()

    def read(self, module, owner=None):
        reading.on = True
        try:
            return through_class(self, module, owner)
        finally:
            reading.on = False

    nn.Module.__getattr__ = counted
    Registered.__get__ = read
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        nn.Module.__getattr__ = original
        Registered.__get__ = through_class
    return misses


@pytest.mark.parametrize("kernel", ["packed", "sdpa", "eager"])
def test_a_forward_makes_no_failed_lookup_on_bertlab_modules(kernel):
    model, inputs = model_and_batch(kernel, BertForSequenceClassification)
    assert failed_lookups(model, inputs) == []


def test_the_counter_sees_failed_lookups_where_a_class_reads_them_the_ordinary_way():
    # the same forward with the class attributes taken away: each read fails first
    model, inputs = model_and_batch()
    taken = []
    for cls in {type(m) for m in model.modules() if isinstance(m, Module)}:
        for name, value in list(vars(cls).items()):
            if isinstance(value, Registered):
                delattr(cls, name)
                taken.append((cls, name, value))
    try:
        misses = failed_lookups(model, inputs)
    finally:
        for cls, name, value in taken:
            setattr(cls, name, value)
    assert ("BertSelfOutput", "dense") in misses and ("BertSelfOutput", "LayerNorm") in misses
    assert len(misses) >= 20 * len(model.encoder.layer)  # (every layer reads a score of them)


def test_every_class_of_the_network_derives_from_module():
    for namespace in (model_module, heads_module):
        for name, value in vars(namespace).items():
            if (
                isinstance(value, type)
                and issubclass(value, nn.Module)
                and value.__module__
                in (
                    model_module.__name__,
                    heads_module.__name__,
                )
            ):
                assert issubclass(value, Module), name


def test_a_read_returns_what_is_registered_now_however_it_got_there():
    model, _ = model_and_batch()
    out = model.encoder.layer[0].attention.output
    assert isinstance(BertSelfOutput.dense, Registered)
    assert out.dense is out._modules["dense"]
    replaced = nn.Linear(64, 64)
    out.dense = replaced  # setattr
    assert out.dense is replaced
    other = nn.Linear(64, 64)
    out._modules["dense"] = other  # written directly, as adapters do
    assert out.dense is other
    out.add_module("dense", replaced)
    assert out.dense is replaced
    out.dense = None
    assert out.dense is None
    del out.dense
    with pytest.raises(AttributeError, match="dense"):
        _ = out.dense
    assert not hasattr(out, "dense")
    out.dense = 5  # no longer registered: an ordinary attribute of the instance, which wins
    assert out.dense == 5 and out.__dict__["dense"] == 5
    # another instance of the class still reads its own registered module
    second = model.encoder.layer[1].attention.output
    assert isinstance(second.dense, nn.Linear)


def test_adapters_copies_and_pickles_read_the_modules_they_hold():
    model, inputs = model_and_batch(head=BertForSequenceClassification)
    with torch.no_grad():
        expected = model(**inputs).logits
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.no_grad():
            assert torch.equal(other(**inputs).logits, expected)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["query", "value"]))
    attention = peft.base_model.model.bert.encoder.layer[0].attention.self
    assert type(attention.query).__module__.startswith("peft")  # the adapter is what is read
    for module in peft.modules():  # adapters start as the identity: B is zero
        if hasattr(module, "lora_B"):
            nn.init.normal_(module.lora_B["default"].weight)
    with torch.no_grad():
        assert not torch.allclose(peft(**inputs).logits, expected)

"""Code written for transformers runs unchanged on bertlab, with the same results.

Each snippet below is everyday transformers user code, written as a user writes it. The test
runs it twice with ``exec``: as written, and with ``from transformers import ...`` turned into
``from bertlab import ...`` for the names bertlab exports (the Trainer, TrainingArguments and
the data collators are transformers' and stay imported from transformers in both runs). Each
snippet leaves its answer in ``result``; the two answers are compared by one recursive
comparison (``differences``). A snippet with a ``difference`` shows a deliberate difference
instead, and its ``check`` asserts that difference explicitly. ``PENDING`` holds the snippets
that do not give the same result yet: they are not run, and each says what differs.

The table of docs/guides/from-transformers.md is generated from ``SNIPPETS`` by
``scripts/compat_table.py``, and ``test_readme_table_is_generated_from_the_snippets`` keeps the
two equal, so the table never claims more than these tests show.

The models the snippets load are saved once per module (``folders``): the bundled
all-MiniLM-L6-v2 backbone with task heads drawn under a fixed seed, so both libraries load
identical weights. Snippets that only read a model share one load per library (``setup``).
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import bertlab

ROOT = Path(__file__).resolve().parents[1]
ATOL = 1e-4


@dataclass(frozen=True)
class Snippet:
    """One piece of transformers user code. ``setup`` names an entry of ``SETUPS`` run before
    the code (its objects shared, read-only, by the snippets that name it); ``difference`` is
    the one-line deliberate difference the snippet shows, asserted by ``check(hf, bl)``
    (``hf`` is the exception when the transformers run raises); ``pending`` says what still
    differs, for the snippets in ``PENDING``. ``what`` is the snippet's cell in the table."""

    id: str
    section: str
    what: str
    code: str
    setup: str | None = None
    difference: str | None = None
    check: Callable[[object, object], None] | None = None
    pending: str | None = None


SECTIONS = (
    "Tokenizer",
    "Config",
    "Model outputs",
    "Model helpers",
    "Loading",
    "Pipelines",
    "Tools",
)

# Shared, read-only starting points: run once per library per module.
SETUPS = {
    "base": """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL)
model.eval()
enc = tok(["The cat sat on the mat.", "Hello there"], padding=True, return_tensors="pt")
with torch.no_grad():
    out = model(**enc)
""",
    "cls": """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(CLS_MODEL)
model = AutoModelForSequenceClassification.from_pretrained(CLS_MODEL)
model.eval()
""",
    "ner": """
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(NER_MODEL)
model = AutoModelForTokenClassification.from_pretrained(NER_MODEL)
""",
    "qa": """
import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer
tok = AutoTokenizer.from_pretrained(QA_MODEL)
model = AutoModelForQuestionAnswering.from_pretrained(QA_MODEL)
""",
    "mlm": """
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MLM_MODEL)
model = AutoModelForMaskedLM.from_pretrained(MLM_MODEL)
""",
}

TEXTS = '["The cat sat on the mat.", "Hello there", "A much longer sentence about nothing at all."]'


def _padding_is_zero_with_packed_and_sdpa_gives_transformers(hf, bl) -> None:
    mask = hf["mask"].bool()
    assert torch.equal(mask, bl["mask"].bool())
    assert (~mask).any(), "the batch must have padding to show the difference"
    for key in ("default", "sdpa"):
        assert not differences(hf[key][mask], bl[key][mask]), key  # real tokens: equal
    assert torch.all(bl["default"][~mask] == 0)  # packed: padding positions are zeros
    assert hf["default"][~mask].abs().sum() > 0  # transformers: values computed from padding
    assert not differences(hf["sdpa"], bl["sdpa"])  # sdpa: every position equal


def _accumulated_update_equals_whole_batch_in_bertlab_only(hf, bl) -> None:
    # bertlab: 2 micro-batches of 2 accumulated = one step on the batch of 4.
    assert not differences(bl["accumulated"], bl["whole"])
    # transformers' BERT receives num_items_in_batch, ignores it, and the Trainer does not
    # divide by the accumulation steps: the summed update is twice as large.
    ratio = hf["accumulated"].norm() / hf["whole"].norm()
    assert abs(ratio - 2.0) < 0.05, ratio
    # The one-batch step is the same in both libraries.
    assert not differences(hf["whole"], bl["whole"])


QA_CONTEXT = "The cat sat on the mat in the hall."


def _question_answering_is_kept(hf, bl) -> None:
    assert isinstance(hf, KeyError) and "question-answering" in str(hf), hf
    assert list(bl) == ["score", "start", "end", "answer"], bl
    assert 0.0 < bl["score"] <= 1.0
    assert bl["answer"] == QA_CONTEXT[bl["start"] : bl["end"]] != ""


def _output_class_has_no_cross_attentions(hf, bl) -> None:
    assert hf["class"] == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert bl["class"] == "BaseModelOutputWithPooling"
    assert not differences(hf["keys"], bl["keys"])


SNIPPETS: list[Snippet] = [
    # ---------------------------------------------------------------- Tokenizer
    Snippet(
        "tok-load",
        "Tokenizer",
        "`AutoTokenizer.from_pretrained(folder)`: class, `is_fast`, `model_input_names`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = [type(tok).__name__, tok.is_fast, tok.model_input_names, tok.model_max_length]
""",
    ),
    Snippet(
        "tok-call",
        "Tokenizer",
        '`tok("text")`',
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok("Hello, world! Tokenizers are fun.")
""",
    ),
    Snippet(
        "tok-pair",
        "Tokenizer",
        '`tok("question", "context")`: a pair with token types',
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok("Where is the cat?", "The cat sat on the mat.")
""",
    ),
    Snippet(
        "tok-batch-pt",
        "Tokenizer",
        '`tok(texts, padding=True, truncation=True, max_length=8, return_tensors="pt")`',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok({TEXTS}, padding=True, truncation=True, max_length=8, return_tensors="pt")
""",
    ),
    Snippet(
        "tok-np",
        "Tokenizer",
        '`return_tensors="np"`',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok({TEXTS}, padding=True, return_tensors="np")
""",
    ),
    Snippet(
        "tok-padding-max-length",
        "Tokenizer",
        '`padding="max_length"` and `pad_to_multiple_of=8`',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
a = tok({TEXTS}, padding="max_length", max_length=16)
b = tok({TEXTS}, padding=True, pad_to_multiple_of=8)
result = [a, b]
""",
    ),
    Snippet(
        "tok-left",
        "Tokenizer",
        '`padding_side="left"` (keyword of `from_pretrained` and attribute)',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL, padding_side="left")
a = tok({TEXTS}, padding=True, return_tensors="pt")
tok = AutoTokenizer.from_pretrained(MODEL)
tok.padding_side = "left"
b = tok({TEXTS}, padding=True, return_tensors="pt")
result = [a, b, tok.padding_side]
""",
    ),
    Snippet(
        "tok-to",
        "Tokenizer",
        '`BatchEncoding.to("cpu")`, `enc["input_ids"]`, `enc.input_ids`, `enc.keys()`',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
enc = tok({TEXTS}, padding=True, return_tensors="pt").to("cpu")
result = [enc, list(enc.keys()), enc.input_ids, enc["attention_mask"]]
""",
    ),
    Snippet(
        "tok-pad",
        "Tokenizer",
        '`tok.pad(features, return_tensors="pt")`',
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
features = [tok(t) for t in {TEXTS}]
result = tok.pad(features, return_tensors="pt")
""",
    ),
    Snippet(
        "collator-padding",
        "Tokenizer",
        "`DataCollatorWithPadding(tok)(features)` with labels",
        f"""
from transformers import AutoTokenizer, DataCollatorWithPadding
tok = AutoTokenizer.from_pretrained(MODEL)
features = [dict(tok(t), label=i % 2) for i, t in enumerate({TEXTS})]
result = DataCollatorWithPadding(tok)(features)
""",
    ),
    Snippet(
        "collator-mlm",
        "Tokenizer",
        "`DataCollatorForLanguageModeling(tok)`: the same masks under the same seed",
        f"""
import torch
from transformers import AutoTokenizer, DataCollatorForLanguageModeling
tok = AutoTokenizer.from_pretrained(MODEL)
collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.3)
torch.manual_seed(0)
result = collator([tok(t) for t in {TEXTS}])
""",
    ),
    Snippet(
        "tok-add-tokens",
        "Tokenizer",
        "`add_tokens([...])`, `len(tok)`, and the new tokens kept whole",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
n = tok.add_tokens(["bertlabword", "covid19"])
result = [n, len(tok), tok.tokenize("a bertlabword and covid19"), tok("covid19")["input_ids"]]
""",
    ),
    Snippet(
        "tok-add-special",
        "Tokenizer",
        '`add_special_tokens({"additional_special_tokens": [...]})`',
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
n = tok.add_special_tokens({"additional_special_tokens": ["[E1]", "[E2]"]})
ids = tok("[E1] Paris [E2] is big")["input_ids"]
result = [n, len(tok), ids, tok.decode(ids, skip_special_tokens=True)]
""",
    ),
    Snippet(
        "tok-save-load",
        "Tokenizer",
        "`save_pretrained` then `from_pretrained` keeps added tokens",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
tok.add_tokens(["bertlabword"])
tok.save_pretrained(OUT)
again = AutoTokenizer.from_pretrained(OUT)
result = [len(again), again("a bertlabword")["input_ids"]]
""",
    ),
    Snippet(
        "tok-vocab",
        "Tokenizer",
        "`get_vocab()`, `vocab_size`, `convert_tokens_to_ids`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
vocab = tok.get_vocab()
result = [len(vocab), tok.vocab_size, vocab["[CLS]"], vocab["hello"],
          tok.convert_tokens_to_ids(["[MASK]", "world", "qzxqzx"])]
""",
    ),
    Snippet(
        "tok-special",
        "Tokenizer",
        "`all_special_tokens`, `all_special_ids`, `cls_token`, `pad_token_id`, ...",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = [sorted(tok.all_special_tokens), sorted(tok.all_special_ids), tok.cls_token,
          tok.sep_token, tok.pad_token, tok.mask_token, tok.unk_token, tok.cls_token_id,
          tok.sep_token_id, tok.pad_token_id, tok.mask_token_id, tok.unk_token_id]
""",
    ),
    Snippet(
        "tok-decode",
        "Tokenizer",
        "`decode`, `decode(skip_special_tokens=True)`, `batch_decode`",
        f"""
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
enc = tok({TEXTS}, padding=True)
result = [tok.decode(enc["input_ids"][0]),
          tok.decode(enc["input_ids"][1], skip_special_tokens=True),
          tok.batch_decode(enc["input_ids"], skip_special_tokens=True)]
""",
    ),
    Snippet(
        "tok-convert",
        "Tokenizer",
        "`tokenize`, `convert_ids_to_tokens`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
tokens = tok.tokenize("Unbelievable tokenization, isn't it?")
ids = tok("Unbelievable tokenization")["input_ids"]
result = [tokens, tok.convert_ids_to_tokens(ids)]
""",
    ),
    Snippet(
        "tok-offsets",
        "Tokenizer",
        "`return_offsets_mapping=True`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok(["Unbelievable tokenization!", "New York"], return_offsets_mapping=True)
""",
    ),
    Snippet(
        "tok-word-ids",
        "Tokenizer",
        "`word_ids()`, `word_ids(i)`, `sequence_ids()`, `tokens()`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
enc = tok(["Unbelievable tokenization", "New York"], ["is fun", "city"])
result = [enc.word_ids(0), enc.word_ids(1), enc.sequence_ids(0), enc.tokens(1)]
""",
    ),
    Snippet(
        "tok-split-words",
        "Tokenizer",
        "`is_split_into_words=True` (pre-split words, as for tagging)",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
enc = tok([["EU", "rejects", "German", "call"]], is_split_into_words=True, truncation=True)
result = [enc, enc.word_ids(0)]
""",
    ),
    Snippet(
        "tok-unknown-kw",
        "Tokenizer",
        "`verbose=False`, `return_attention_mask=False`, `return_token_type_ids=False`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = [tok("hello", verbose=False),
          tok("hello", return_attention_mask=False, return_token_type_ids=False)]
""",
    ),
    Snippet(
        "tok-truncation-long",
        "Tokenizer",
        "`truncation=True` cuts at `model_max_length`; `add_special_tokens=False`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
long = " ".join(["word"] * 1000)
result = [len(tok(long, truncation=True)["input_ids"]),
          tok("hello world", add_special_tokens=False)["input_ids"]]
""",
    ),
    Snippet(
        "tok-encode",
        "Tokenizer",
        "`tok.encode(text)`, `tok.encode(a, b, add_special_tokens=False)`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = [tok.encode("Hello world"), tok.encode("a cat", "a mat", add_special_tokens=False)]
""",
    ),
    Snippet(
        "tok-class",
        "Tokenizer",
        "`BertTokenizerFast.from_pretrained(folder)` and `BertTokenizer.from_pretrained(folder)`",
        """
from transformers import BertTokenizer, BertTokenizerFast
fast = BertTokenizerFast.from_pretrained(MODEL)
slow = BertTokenizer.from_pretrained(MODEL)
result = [fast("Hello, world!"), slow("Hello, world!"), fast.is_fast, len(slow)]
""",
    ),
    # ------------------------------------------------------------------- Config
    Snippet(
        "config-load",
        "Config",
        "`AutoConfig.from_pretrained(folder)`: sizes, `model_type`, `use_return_dict`",
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(MODEL)
result = [type(config).__name__, config.model_type, config.hidden_size,
          config.num_hidden_layers, config.num_attention_heads, config.intermediate_size,
          config.vocab_size, config.max_position_embeddings, config.hidden_act,
          config.layer_norm_eps, config.use_return_dict, config.output_hidden_states]
""",
    ),
    Snippet(
        "config-labels-default",
        "Config",
        "default `id2label` / `label2id` (`LABEL_0`, ...) and `num_labels`",
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(MODEL)
result = [config.num_labels, config.id2label, config.label2id]
""",
    ),
    Snippet(
        "config-num-labels",
        "Config",
        "`config.num_labels = 5` then `id2label` / `label2id`",
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(MODEL)
config.num_labels = 5
result = [config.num_labels, config.id2label, config.label2id]
""",
    ),
    Snippet(
        "config-to-dict",
        "Config",
        "`to_dict()`: the keys that matter",
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(CLS_MODEL)
d = config.to_dict()
keys = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "vocab_size", "hidden_dropout_prob", "pad_token_id",
        "type_vocab_size", "architectures", "hidden_act", "layer_norm_eps"]
result = {k: d[k] for k in keys}
""",
    ),
    Snippet(
        "config-json",
        "Config",
        "`to_json_string()` parsed",
        """
import json
from transformers import AutoConfig
config = AutoConfig.from_pretrained(NLI_MODEL)
d = json.loads(config.to_json_string())
result = [d["model_type"], d["hidden_size"], d["id2label"], d["label2id"]]
""",
    ),
    Snippet(
        "config-update",
        "Config",
        "`update({...})` and attribute assignment",
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(MODEL)
config.update({"hidden_dropout_prob": 0.0, "classifier_dropout": 0.2})
config.attention_probs_dropout_prob = 0.05
result = [config.hidden_dropout_prob, config.classifier_dropout,
          config.to_dict()["attention_probs_dropout_prob"]]
""",
    ),
    Snippet(
        "config-unknown-key",
        "Config",
        "an unknown keyword kept and round-tripped by `save_pretrained` / `from_pretrained`",
        """
import json, os
from transformers import BertConfig, AutoConfig
config = BertConfig(num_hidden_layers=2, my_project_flag=7)
config.save_pretrained(OUT)
again = AutoConfig.from_pretrained(OUT)
saved = json.load(open(os.path.join(OUT, "config.json")))
result = [config.my_project_flag, again.my_project_flag, saved["my_project_flag"],
          again.to_dict()["my_project_flag"]]
""",
    ),
    Snippet(
        "config-new",
        "Config",
        "`BertConfig(...)`: defaults of a new config",
        """
from transformers import BertConfig
config = BertConfig(num_hidden_layers=2)
result = [config.hidden_size, config.num_hidden_layers, config.vocab_size,
          config.max_position_embeddings, config.num_labels, config.model_type]
""",
    ),
    # ------------------------------------------------------------ Model outputs
    Snippet(
        "out-keys",
        "Model outputs",
        '`out.keys()`, `"pooler_output" in out`, `dict(out).keys()`',
        """
result = [list(out.keys()), "pooler_output" in out, "hidden_states" in out,
          list(dict(out).keys())]
""",
        setup="base",
    ),
    Snippet(
        "out-index",
        "Model outputs",
        '`out[0]`, `out["last_hidden_state"]`, `out.last_hidden_state` (at real tokens)',
        """
mask = enc["attention_mask"].bool()
result = [out[0][mask], out["last_hidden_state"][mask], out.last_hidden_state[mask],
          out[1], out.pooler_output]
""",
        setup="base",
    ),
    Snippet(
        "out-tuple",
        "Model outputs",
        "`out.to_tuple()` and `return_dict=False`",
        """
with torch.no_grad():
    t = model(**enc, return_dict=False)
result = [len(out.to_tuple()), type(t).__name__, len(t), t[1]]
""",
        setup="base",
    ),
    Snippet(
        "out-class",
        "Model outputs",
        "the output's class name",
        """
result = {"class": type(out).__name__, "keys": list(out.keys())}
""",
        setup="base",
        difference="`BaseModelOutputWithPooling`, not `...AndCrossAttentions` (no decoder mode)",
        check=_output_class_has_no_cross_attentions,
    ),
    Snippet(
        "out-positional",
        "Model outputs",
        "`model(input_ids, attention_mask)` positionally, and `inputs_embeds=`",
        """
mask = enc["attention_mask"].bool()
with torch.no_grad():
    a = model(enc["input_ids"], enc["attention_mask"])
    b = model(inputs_embeds=model.get_input_embeddings()(enc["input_ids"]),
              attention_mask=enc["attention_mask"])
result = [a.last_hidden_state[mask], b.last_hidden_state[mask], b.pooler_output]
""",
        setup="base",
    ),
    Snippet(
        "out-hidden-states",
        "Model outputs",
        "`output_hidden_states=True`: embeddings + one per layer",
        """
with torch.no_grad():
    o = model(**enc, output_hidden_states=True)
mask = enc["attention_mask"].bool()
result = [len(o.hidden_states), [h[mask] for h in o.hidden_states], list(o.keys())]
""",
        setup="base",
    ),
    Snippet(
        "out-attentions",
        "Model outputs",
        '`output_attentions=True` with `attn_implementation="eager"`',
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL, attn_implementation="eager")
enc = tok(["The cat sat on the mat.", "Hello there"], padding=True, return_tensors="pt")
with torch.no_grad():
    out = model(**enc, output_attentions=True)
keep = enc["attention_mask"].bool()
result = [len(out.attentions), [a[1][:, keep[1]][:, :, keep[1]] for a in out.attentions],
          [a[0] for a in out.attentions]]
""",
    ),
    Snippet(
        "out-loss",
        "Model outputs",
        "`model(**enc, labels=...)`: `out.loss`, `out.logits`",
        """
enc = tok(["a gorgeous, witty film", "a dull mess"], padding=True, return_tensors="pt")
with torch.no_grad():
    out = model(**enc, labels=torch.tensor([1, 0]))
result = [out.loss, out.logits, list(out.keys()), type(out).__name__]
""",
        setup="cls",
    ),
    Snippet(
        "out-padding",
        "Model outputs",
        "per-token outputs of a padded batch at padding positions",
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
enc = tok(["The cat sat on the mat.", "Hello"], padding=True, return_tensors="pt")
result = {"mask": enc["attention_mask"]}
for name, kwargs in (("default", {}), ("sdpa", {"attn_implementation": "sdpa"})):
    model = AutoModel.from_pretrained(MODEL, **kwargs)
    with torch.no_grad():
        result[name] = model(**enc).last_hidden_state
""",
        difference='zeros at padding with the default kernel; `attn_implementation="sdpa"` '
        "gives transformers' values there",
        check=_padding_is_zero_with_packed_and_sdpa_gives_transformers,
    ),
    Snippet(
        "out-token-logits",
        "Model outputs",
        "token classification logits and loss with `-100` labels",
        """
enc = tok(["John lives in Paris", "Hi"], padding=True, return_tensors="pt")
labels = torch.where(enc["attention_mask"].bool(), 0, -100)
labels[0, 1] = 1
with torch.no_grad():
    out = model(**enc, labels=labels)
result = [out.loss, out.logits[enc["attention_mask"].bool()], type(out).__name__]
""",
        setup="ner",
    ),
    Snippet(
        "out-qa",
        "Model outputs",
        "question answering: `start_logits`, `end_logits`, loss with positions",
        """
enc = tok("Where is the cat?", "The cat sat on the mat.", return_tensors="pt")
with torch.no_grad():
    out = model(**enc, start_positions=torch.tensor([10]), end_positions=torch.tensor([11]))
result = [out.loss, out.start_logits, out.end_logits, list(out.keys())]
""",
        setup="qa",
    ),
    Snippet(
        "out-mlm",
        "Model outputs",
        "masked LM: logits at `[MASK]` and loss with `-100` labels",
        """
enc = tok("The capital of France is [MASK].", return_tensors="pt")
labels = torch.full_like(enc["input_ids"], -100)
labels[0, 6] = tok.convert_tokens_to_ids("paris")
with torch.no_grad():
    out = model(**enc, labels=labels)
pos = (enc["input_ids"] == tok.mask_token_id).nonzero()[0, 1]
result = [out.loss, out.logits[0, pos], out.logits.shape]
""",
        setup="mlm",
    ),
    # ------------------------------------------------------------ Model helpers
    Snippet(
        "helper-device-dtype",
        "Model helpers",
        "`model.device`, `model.dtype`, `model.training`, `model.config.hidden_size`",
        """
result = [model.device, model.dtype, model.training, model.config.hidden_size,
          model.config.num_labels, model.config.id2label, model.config.architectures]
""",
        setup="cls",
    ),
    Snippet(
        "helper-num-parameters",
        "Model helpers",
        "`num_parameters()`, `(only_trainable=True)`, `(exclude_embeddings=True)`",
        """
result = [model.num_parameters(), model.num_parameters(only_trainable=True),
          model.num_parameters(exclude_embeddings=True),
          sum(p.numel() for p in model.parameters())]
""",
        setup="cls",
    ),
    Snippet(
        "helper-embeddings",
        "Model helpers",
        "`get_input_embeddings().weight.shape`, `get_output_embeddings()` tied",
        """
emb = model.get_input_embeddings()
result = [emb.weight.shape, emb.weight, model.get_output_embeddings().weight is emb.weight]
""",
        setup="mlm",
    ),
    Snippet(
        "helper-resize",
        "Model helpers",
        "`resize_token_embeddings(len(tok))` after `add_tokens`",
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL)
tok.add_tokens(["bertlabword", "covid19"])
emb = model.resize_token_embeddings(len(tok))
w = model.get_input_embeddings().weight
enc = tok("a bertlabword", return_tensors="pt")
with torch.no_grad():
    shape = model(**enc).last_hidden_state.shape
result = [type(emb).__name__, w.shape, model.config.vocab_size, w[:30522], shape]
""",
    ),
    Snippet(
        "helper-train-eval",
        "Model helpers",
        "`model.eval()` / `model.train()` return the model and set `training`",
        """
from transformers import AutoModel
model = AutoModel.from_pretrained(TINY_CLS_MODEL)
first = model.training
a = model.eval() is model
b = model.training
c = model.train() is model
result = [first, a, b, c, model.training, all(m.training for m in model.modules())]
""",
    ),
    Snippet(
        "helper-grad-ckpt",
        "Model helpers",
        "`gradient_checkpointing_enable()` then a training step: same loss and gradients",
        """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(TINY_CLS_MODEL)
model = AutoModelForSequenceClassification.from_pretrained(
    TINY_CLS_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model.gradient_checkpointing_enable()
model.train()
enc = tok(["a gorgeous, witty film", "a dull mess"], padding=True, return_tensors="pt")
out = model(**enc, labels=torch.tensor([1, 0]))
out.loss.backward()
result = [model.is_gradient_checkpointing, out.loss, model.classifier.weight.grad,
          model.bert.encoder.layer[0].attention.self.query.weight.grad]
""",
    ),
    Snippet(
        "helper-state-dict",
        "Model helpers",
        "`state_dict()` keys and `named_parameters()` names",
        """
keys = [k for k in model.state_dict() if not k.endswith("position_ids")]
result = [sorted(keys), sorted(n for n, _ in model.named_parameters())]
""",
        setup="cls",
    ),
    # ------------------------------------------------------------------ Loading
    Snippet(
        "load-torch-dtype",
        "Loading",
        "`from_pretrained(folder, torch_dtype=torch.bfloat16)`",
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
with torch.no_grad():
    out = model(**tok("hello world", return_tensors="pt"))
result = [model.dtype, out.last_hidden_state.dtype, out.last_hidden_state.shape]
""",
    ),
    Snippet(
        "load-dtype-auto",
        "Loading",
        '`dtype="auto"` and `dtype="bfloat16"`',
        """
from transformers import AutoModel
a = AutoModel.from_pretrained(MODEL, dtype="auto")
b = AutoModel.from_pretrained(MODEL, dtype="bfloat16")
result = [a.dtype, b.dtype]
""",
    ),
    Snippet(
        "load-output-hidden",
        "Loading",
        "`output_hidden_states=True` as a `from_pretrained` keyword",
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL, output_hidden_states=True)
with torch.no_grad():
    out = model(**tok("hello world", return_tensors="pt"))
result = [model.config.output_hidden_states, len(out.hidden_states), out.hidden_states[3]]
""",
    ),
    Snippet(
        "load-no-pooler",
        "Loading",
        "`add_pooling_layer=False`: no pooler output",
        """
import torch
from transformers import AutoModel, AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModel.from_pretrained(MODEL, add_pooling_layer=False)
with torch.no_grad():
    out = model(**tok("hello world", return_tensors="pt"))
result = [model.pooler is None, out.pooler_output is None, "pooler_output" in out,
          list(out.keys()), out.last_hidden_state]
""",
    ),
    Snippet(
        "load-num-labels",
        "Loading",
        "`num_labels=3` on a backbone: a new head, label names `LABEL_i`",
        """
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=3)
result = [model.config.num_labels, model.config.id2label, model.classifier.weight.shape,
          model.bert.embeddings.word_embeddings.weight]
""",
    ),
    Snippet(
        "load-id2label",
        "Loading",
        "`id2label=` / `label2id=` overrides",
        """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(CLS_MODEL)
model = AutoModelForSequenceClassification.from_pretrained(
    CLS_MODEL, id2label={0: "bad", 1: "good"}, label2id={"bad": 0, "good": 1})
with torch.no_grad():
    logits = model(**tok("fine", return_tensors="pt")).logits
result = [model.config.id2label, model.config.label2id,
          model.config.id2label[int(logits.argmax())], logits]
""",
    ),
    Snippet(
        "load-hub-keywords",
        "Loading",
        '`cache_dir=`, `revision="main"`, `local_files_only=True` accepted, never saved',
        """
import json, os
from transformers import AutoModel
model = AutoModel.from_pretrained(TINY_CLS_MODEL, cache_dir=OUT + "/cache", revision="main",
                                  local_files_only=True)
model.save_pretrained(OUT + "/saved")
saved = json.load(open(os.path.join(OUT, "saved", "config.json")))
result = [k in saved for k in ("cache_dir", "revision", "local_files_only")]
""",
    ),
    Snippet(
        "load-round-trip",
        "Loading",
        "`save_pretrained` then `from_pretrained`: same files, same logits",
        """
import os
model.save_pretrained(OUT)
again = AutoModelForSequenceClassification.from_pretrained(OUT)
enc = tok("a gorgeous film", return_tensors="pt")
with torch.no_grad():
    a, b = model(**enc).logits, again(**enc).logits
result = [sorted(os.listdir(OUT)), bool(torch.equal(a, b)), again.config.id2label, b]
""",
        setup="cls",
    ),
    Snippet(
        "load-auto-classes",
        "Loading",
        "`AutoModelFor{SequenceClassification, TokenClassification, QuestionAnswering, "
        "MaskedLM, PreTraining, MultipleChoice, NextSentencePrediction}` give `BertFor...`",
        """
from transformers import (AutoModel, AutoModelForSequenceClassification,
    AutoModelForTokenClassification, AutoModelForQuestionAnswering, AutoModelForMaskedLM,
    AutoModelForPreTraining, AutoModelForMultipleChoice, AutoModelForNextSentencePrediction,
    BertConfig)
config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=64)
classes = [AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification,
           AutoModelForQuestionAnswering, AutoModelForMaskedLM, AutoModelForPreTraining,
           AutoModelForMultipleChoice, AutoModelForNextSentencePrediction]
result = [type(c.from_config(config)).__name__ for c in classes]
""",
    ),
    Snippet(
        "load-auto-saved-head",
        "Loading",
        "`AutoModelForTokenClassification.from_pretrained` on a saved head: same logits",
        """
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(NER_MODEL)
model = AutoModelForTokenClassification.from_pretrained(NER_MODEL)
with torch.no_grad():
    logits = model(**tok("John lives in Paris", return_tensors="pt")).logits
result = [type(model).__name__, model.config.id2label, logits]
""",
    ),
    # ---------------------------------------------------------------- Pipelines
    Snippet(
        "pipe-features",
        "Pipelines",
        '`pipeline("feature-extraction", model=folder)`',
        """
from transformers import pipeline
extract = pipeline("feature-extraction", model=MODEL)
result = [extract("Hello world"), extract(["Hi", "The cat sat"])]
""",
    ),
    Snippet(
        "pipe-fill-mask",
        "Pipelines",
        '`pipeline("fill-mask", model=model, tokenizer=tok)`, `top_k=3`',
        """
from transformers import pipeline
fill = pipeline("fill-mask", model=model, tokenizer=tok)
result = [fill("The capital of France is [MASK]."), fill("Hello [MASK]!", top_k=3)]
""",
        setup="mlm",
    ),
    Snippet(
        "pipe-text-classification",
        "Pipelines",
        '`pipeline("text-classification")`, `top_k=None`',
        """
from transformers import pipeline
clf = pipeline("text-classification", model=CLS_MODEL)
result = [clf("a gorgeous, witty film"), clf(["a dull mess", "fine"]),
          clf("a gorgeous, witty film", top_k=None)]
""",
    ),
    Snippet(
        "pipe-sentiment",
        "Pipelines",
        '`pipeline("sentiment-analysis", model=..., tokenizer=...)` with objects',
        """
from transformers import pipeline
clf = pipeline("sentiment-analysis", model=model, tokenizer=tok)
result = clf(["I love it", "I hate it"])
""",
        setup="cls",
    ),
    Snippet(
        "pipe-ner-none",
        "Pipelines",
        '`pipeline("ner", model=model, tokenizer=tok)`: one entry per token',
        """
from transformers import pipeline
ner = pipeline("ner", model=model, tokenizer=tok)
result = ner("John Smith lives in New York.")
""",
        setup="ner",
    ),
    Snippet(
        "pipe-qa",
        "Pipelines",
        '`pipeline("question-answering")(question=..., context=...)`',
        f"""
from transformers import pipeline
qa = pipeline("question-answering", model=QA_MODEL)
result = qa(question="Where did the cat sit?", context={QA_CONTEXT!r})
""",
        difference="bertlab keeps this task, which transformers 5 removed, with transformers "
        "4's answer (`score`, `start`, `end`, `answer`)",
        check=_question_answering_is_kept,
    ),
    Snippet(
        "pipe-zero-shot",
        "Pipelines",
        '`pipeline("zero-shot-classification")` on an NLI model',
        """
from transformers import pipeline
zs = pipeline("zero-shot-classification", model=NLI_MODEL)
result = [zs("The match went to extra time.", candidate_labels=["sports", "politics", "food"]),
          zs("I cook pasta", candidate_labels=["food", "travel"], multi_label=True)]
""",
    ),
    # -------------------------------------------------------------------- Tools
    Snippet(
        "tool-trainer",
        "Tools",
        "`Trainer` with `DataCollatorWithPadding`: the same losses for two steps",
        """
from transformers import Trainer, TrainingArguments, DataCollatorWithPadding
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(TINY_CLS_MODEL)
model = AutoModelForSequenceClassification.from_pretrained(
    TINY_CLS_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
texts = ["a gorgeous film", "a dull, dull mess", "fine", "I loved every minute of it"]
train = [dict(tok(t), labels=i % 2) for i, t in enumerate(texts)]
args = TrainingArguments(OUT, per_device_train_batch_size=2, max_steps=2, logging_steps=1,
                         learning_rate=1e-3, report_to=[], save_strategy="no",
                         use_cpu=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=train,
                  data_collator=DataCollatorWithPadding(tok))
trainer.train()
result = [[h["loss"] for h in trainer.state.log_history if "loss" in h],
          trainer.state.global_step, model.classifier.weight]
""",
    ),
    Snippet(
        "tool-accumulation",
        "Tools",
        "`Trainer` with `gradient_accumulation_steps=2`",
        """
from transformers import Trainer, TrainingArguments
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(TINY_CLS_MODEL)
texts = ["a good film", "a bad film", "a fine film", "a dull film"]  # 5 tokens each
train = [dict(tok(t), labels=i % 2) for i, t in enumerate(texts)]
result = {}
for name, batch, steps in (("whole", 4, 1), ("accumulated", 2, 2)):
    model = AutoModelForSequenceClassification.from_pretrained(
        TINY_CLS_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    before = model.classifier.weight.detach().clone()
    args = TrainingArguments(OUT, per_device_train_batch_size=batch, max_steps=1,
                             gradient_accumulation_steps=steps, optim="sgd", learning_rate=0.1,
                             max_grad_norm=0.0, lr_scheduler_type="constant", report_to=[],
                             save_strategy="no", use_cpu=True, seed=0)
    Trainer(model=model, args=args, train_dataset=train).train()
    result[name] = model.classifier.weight.detach() - before
""",
        difference="an accumulated step equals one step on the whole batch (the loss is "
        "averaged over micro-batches)",
        check=_accumulated_update_equals_whole_batch_in_bertlab_only,
    ),
    Snippet(
        "tool-peft",
        "Tools",
        '`get_peft_model(model, LoraConfig(task_type="SEQ_CLS", ...))`: trainable parameters',
        """
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForSequenceClassification
model = AutoModelForSequenceClassification.from_pretrained(TINY_CLS_MODEL)
peft_model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16,
                                              target_modules=["query", "value"]))
trainable, total = peft_model.get_nb_trainable_parameters()
result = [trainable, total, sorted(n for n, p in peft_model.named_parameters()
                                   if p.requires_grad)]
""",
    ),
    Snippet(
        "tok-to-string",
        "Tokenizer",
        "`convert_tokens_to_string(tokens)`",
        """
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(MODEL)
result = tok.convert_tokens_to_string(tok.tokenize("Unbelievable tokenization, isn't it?"))
""",
    ),
    Snippet(
        "config-to-dict-labels",
        "Config",
        '`to_dict()["id2label"]` keys',
        """
from transformers import AutoConfig
config = AutoConfig.from_pretrained(CLS_MODEL)
result = [config.to_dict()["id2label"], config.to_dict()["label2id"]]
""",
    ),
    Snippet(
        "config-dtype",
        "Loading",
        '`model.config.dtype` after `from_pretrained(folder, dtype="bfloat16")`',
        """
from transformers import AutoModel
model = AutoModel.from_pretrained(MODEL, dtype="bfloat16")
result = [model.config.dtype, model.config.torch_dtype]
""",
    ),
    Snippet(
        "pipe-ner",
        "Pipelines",
        '`pipeline("token-classification", aggregation_strategy="simple")`',
        """
from transformers import pipeline
ner = pipeline("token-classification", model=NER_MODEL, aggregation_strategy="simple")
result = ner("John Smith lives in New York and works for Acme Corporation.")
""",
    ),
]

# Snippets that do not pass yet: not run; each names what differs. The guide's table lists
# them as "not yet the same".
PENDING: list[Snippet] = []


# ------------------------------------------------------------------ the two runs
# Calls that change a shared model or tokenizer (not allowed in a snippet with a setup).
MUTATES = re.compile(r"\b(model|tok)\.(train|add_\w+|resize_\w+|to|half|float)\(")
IMPORT_LINE = re.compile(r"^(\s*)from transformers import (.+)$")


def to_bertlab(code: str) -> tuple[str, list[str]]:
    """``code`` with the names bertlab exports imported from bertlab instead of transformers;
    the other names (Trainer, TrainingArguments, the data collators) stay transformers'.
    Returns the new code and the swapped names. Imports spanning lines use parentheses."""
    lines = code.splitlines()
    out: list[str] = []
    swapped: list[str] = []
    i = 0
    while i < len(lines):
        m = IMPORT_LINE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, names = m.group(1), m.group(2)
        if names.lstrip().startswith("("):
            while ")" not in names:
                i += 1
                names += " " + lines[i].strip()
        i += 1
        entries = [n.strip() for n in names.strip().strip("()").split(",") if n.strip()]
        ours = [n for n in entries if hasattr(bertlab, n.split(" as ")[0].strip())]
        theirs = [n for n in entries if n not in ours]
        swapped += [n.split(" as ")[-1].strip() for n in ours]
        if ours:
            out.append(f"{indent}from bertlab import {', '.join(ours)}")
        if theirs:
            out.append(f"{indent}from transformers import {', '.join(theirs)}")
    return "\n".join(out), swapped


def imported_names(code: str) -> list[str]:
    return to_bertlab(code)[1]


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(scope="module")
def folders(module_tmp):
    """Model folders on the bundled backbone, heads drawn under a fixed seed and saved, so
    both libraries load identical weights."""
    from bertlab import (
        BertConfig,
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    backbone = bertlab.bundled_model_dir()
    root = module_tmp.mktemp("compat-models")
    base = BertModel.from_pretrained(backbone)  # read once, copied into every head below
    heads = {
        "CLS_MODEL": (BertForSequenceClassification, ["NEGATIVE", "POSITIVE"]),
        "NER_MODEL": (
            BertForTokenClassification,
            ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG"],
        ),
        "QA_MODEL": (BertForQuestionAnswering, None),
        "MLM_MODEL": (BertForMaskedLM, None),
        "NLI_MODEL": (BertForSequenceClassification, ["entailment", "neutral", "contradiction"]),
        "TINY_CLS_MODEL": (BertForSequenceClassification, ["NEGATIVE", "POSITIVE"]),
    }
    # A small classifier on the bundled vocabulary, for the training snippets: the same code
    # paths as the full model at a fraction of the time.
    tiny = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    paths = {"MODEL": str(backbone)}
    for i, (name, (cls, labels)) in enumerate(heads.items()):
        seed_all(i)
        config = tiny.replace() if name.startswith("TINY") else base.config.replace()
        if labels is not None:
            config.id2label = dict(enumerate(labels))
            config.label2id = {label: k for k, label in enumerate(labels)}
        model = cls(config)
        if not name.startswith("TINY"):
            missing, unexpected = model.bert.load_state_dict(base.state_dict(), strict=False)
            assert not missing and all(k.startswith("pooler.") for k in unexpected), name
        with torch.no_grad():  # heads' biases start at zero: draw them too
            for n, p in model.named_parameters():
                if n.endswith("bias") and not n.startswith("bert."):
                    p.normal_(0.0, 0.2)
        folder = root / name.lower()
        model.save_pretrained(folder)
        for file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(backbone / file, folder / file)
        paths[name] = str(folder)
    return paths


class Runner:
    """Runs snippets for one library; each setup runs once and is shared."""

    def __init__(self, folders: dict[str, str], module_tmp):
        self.folders = folders
        self.tmp = module_tmp
        self.setups: dict[tuple[str, str], dict] = {}

    def namespace(self, lib: str) -> dict:
        ns = {"__name__": f"snippet_{lib}", **self.folders}
        ns["OUT"] = str(self.tmp.mktemp(f"out-{lib}"))
        return ns

    @staticmethod
    def source(code: str, lib: str) -> str:
        return code if lib == "transformers" else to_bertlab(code)[0]

    def run(self, snippet: Snippet, lib: str):
        ns = self.namespace(lib)
        if snippet.setup is not None:
            key = (snippet.setup, lib)
            if key not in self.setups:
                shared = self.namespace(lib)
                seed_all()
                exec(compile(self.source(SETUPS[snippet.setup], lib), key[0], "exec"), shared)
                self.setups[key] = shared
            ns.update({k: v for k, v in self.setups[key].items() if k != "OUT"})
        seed_all()
        exec(compile(self.source(snippet.code, lib), f"{snippet.id}[{lib}]", "exec"), ns)
        check_origin(snippet, ns, lib)
        return ns["result"]


def check_origin(snippet: Snippet, ns: dict, lib: str) -> None:
    """The names a snippet swaps really come from the library of the run."""
    code = (SETUPS[snippet.setup] if snippet.setup else "") + snippet.code
    names = imported_names(code)
    assert names, f"{snippet.id} imports nothing that bertlab provides"
    for name in names:
        module = getattr(ns[name], "__module__", "") or ""
        assert module.split(".")[0] == lib, (snippet.id, name, module)


@pytest.fixture(scope="module")
def runner(folders, module_tmp):
    return Runner(folders, module_tmp)


# --------------------------------------------------------------- the comparison
def kind(x) -> str:
    if isinstance(x, bool | np.bool_):
        return "bool"
    if isinstance(x, int | np.integer):
        return "int"
    if isinstance(x, float | np.floating):
        return "float"
    if isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, np.ndarray):
        return "ndarray"
    if x is None or isinstance(x, str):
        return type(x).__name__
    if isinstance(x, torch.dtype | torch.device):
        return type(x).__name__
    if isinstance(x, Mapping):
        # ModelOutput, BatchEncoding: the same kind when the class names match.
        return "dict" if type(x) is dict else type(x).__name__
    if isinstance(x, list | tuple):
        return type(x).__name__
    raise TypeError(f"a snippet's result holds a {type(x).__name__}, which has no comparison")


def differences(a, b, path: str = "result") -> list[str]:
    """Where ``a`` (transformers) and ``b`` (bertlab) differ: kinds, mapping keys in order,
    lengths, strings and ints exactly, floats within 1e-4, tensors and arrays by shape, dtype
    and values within 1e-4."""
    ka, kb = kind(a), kind(b)
    if ka != kb:
        return [f"{path}: {ka} vs {kb}"]
    if ka in ("tensor", "ndarray"):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            return [f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"]
        ta, tb = torch.as_tensor(a), torch.as_tensor(b)
        if ta.dtype.is_floating_point:
            ta, tb = ta.double(), tb.double()
            if not torch.allclose(ta, tb, rtol=0.0, atol=ATOL):
                return [f"{path}: values differ by up to {(ta - tb).abs().max():.3g}"]
        elif not torch.equal(ta, tb):
            return [f"{path}: values differ at {(ta != tb).nonzero()[:5].tolist()}"]
        return []
    if ka == "float":
        return [] if abs(float(a) - float(b)) <= ATOL else [f"{path}: {a!r} vs {b!r}"]
    if ka in ("dtype", "device"):
        return [] if str(a) == str(b) else [f"{path}: {a} vs {b}"]
    if isinstance(a, Mapping):
        if list(a.keys()) != list(b.keys()):
            return [f"{path}: keys {list(a.keys())} vs {list(b.keys())}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    if ka in ("list", "tuple", "Size"):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


# ------------------------------------------------------------------------ tests
def test_snippet_list_is_complete_and_well_formed():
    assert len(SNIPPETS) + len(PENDING) >= 45
    ids = [s.id for s in SNIPPETS + PENDING]
    assert len(ids) == len(set(ids)), "snippet ids are unique"
    for s in SNIPPETS + PENDING:
        assert s.section in SECTIONS, s.id
        code = (SETUPS[s.setup] if s.setup else s.code).lstrip()
        assert code.startswith(("from ", "import ")), s.id
        assert "from transformers import" in (SETUPS.get(s.setup, "") + s.code), s.id
        if s.setup is not None:  # shared objects are read, never changed
            assert not MUTATES.search(s.code), s.id
        assert (s.difference is None) == (s.check is None), s.id
        assert (s.pending is not None) == (s in PENDING), s.id
        assert "|" not in s.what and "\n" not in s.what, s.id  # one table cell


def test_import_swap_moves_only_the_names_bertlab_exports():
    code = (
        "import torch\n"
        "from transformers import Trainer, AutoTokenizer as T, DataCollatorWithPadding\n"
        "    from transformers import (AutoModel,\n        TrainingArguments)\n"
        "x = 'from transformers import nothing'\n"
    )
    new, swapped = to_bertlab(code)
    assert new.splitlines() == [
        "import torch",
        "from bertlab import AutoTokenizer as T",
        "from transformers import Trainer, DataCollatorWithPadding",
        "    from bertlab import AutoModel",
        "    from transformers import TrainingArguments",
        "x = 'from transformers import nothing'",
    ]
    assert swapped == ["T", "AutoModel"]


def test_comparison_catches_each_kind_of_difference():
    t = torch.zeros(2, 3)
    assert not differences({"a": [1, "x", 0.5, t]}, {"a": [1, "x", 0.5 + 1e-5, t + 1e-5]})
    cases = [
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}),  # key order
        ([1, 2], [1, 2, 3]),  # length
        ("x", "y"),
        (1, 2),
        (1, 1.0),  # kind
        (0.5, 0.5002),
        (t, t.double()),  # dtype
        (t, t[:1]),  # shape
        (t, t + 2e-4),  # values
        (np.zeros(3, dtype=np.int64), np.array([0, 1, 0])),
        (torch.float32, torch.bfloat16),
    ]
    for a, b in cases:
        assert differences(a, b), (a, b)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs_unchanged_with_the_same_result(snippet, runner):
    try:
        hf = runner.run(snippet, "transformers")
    except Exception as e:  # a deliberate difference may be a task transformers lacks
        if snippet.check is None:
            raise
        hf = e
    bl = runner.run(snippet, "bertlab")
    if snippet.check is not None:
        snippet.check(hf, bl)
    else:
        found = differences(hf, bl)
        assert not found, "\n".join(found[:20])


def load_table_script():
    spec = importlib.util.spec_from_file_location("compat_table", ROOT / "scripts/compat_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_generated_from_the_snippets():
    script = load_table_script()
    readme = (ROOT / "docs" / "guides" / "from-transformers.md").read_text(encoding="utf-8")
    generated = script.table(SECTIONS, SNIPPETS, PENDING)
    assert script.guide_table(readme) == generated, (
        "the guide's compat table is stale: run python scripts/compat_table.py --write"
    )
    # The paragraph above the table gives the number of snippets run.
    words = " ".join(readme.split())
    assert f"{len(SNIPPETS)} snippets, each run with transformers and with bertlab" in words
    rows = generated.splitlines()[2:]
    assert len(rows) == len(SNIPPETS) + len(PENDING)
    assert sum("same result" in r for r in rows) == sum(s.difference is None for s in SNIPPETS)


def test_config_json_of_saved_heads_is_valid(folders):
    # The fixture's folders carry the label names both libraries read.
    for name in ("CLS_MODEL", "NER_MODEL", "NLI_MODEL"):
        config = json.loads((Path(folders[name]) / "config.json").read_text())
        assert len(config["id2label"]) == len(config["label2id"]) >= 2, name

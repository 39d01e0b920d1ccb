"""bertlab.pipeline() under transformers' task names: the same folder loaded by
transformers.pipeline() and by bertlab.pipeline() gives results of the same shape (keys, Python
types, nesting for one input or a list), the same labels, tokens, words and character spans,
and scores within 1e-4. The heads are random (seeded) on the bundled backbone, so the answers
are arbitrary but fixed: every comparison tests the plumbing exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertlab
from bertlab.distributed import as_device as _device
from bertlab.pipelines import TASKS

transformers = pytest.importorskip("transformers", reason="transformers is the reference here")
BUNDLED = bertlab.bundled_model_dir()
TEXTS = [
    "Ana-María O'Connell works for McAllister-Voss in Zürich.",
    "Hugging Face Inc. is based in New York City, near the Manhattan Bridge.",
    "A naïve café ☃ résumé, unbelievably short.",
]
NER = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-ORG", 4: "I-ORG", 5: "B-LOC", 6: "I-LOC"}


def same(ours, theirs, where="result"):
    """Equal structure and types (numpy scalars count as Python floats), equal ints and
    strings, floats within 1e-4; a tensor against a tensor by value."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), where
        assert ours.shape == theirs.shape, where
        assert (ours.float() - theirs.float()).abs().max() < 1e-4, where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (where, ours, theirs)
        for k in theirs:
            same(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, (float, np.floating)):
        assert type(ours) is float and abs(ours - float(theirs)) < 1e-4, (where, ours, theirs)
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def _save(model, root, name):
    folder = root / name
    model.save_pretrained(folder)
    bertlab.BertTokenizer.from_pretrained(BUNDLED).save_pretrained(folder)
    return folder


def _head(cls, seed, **config):
    """A bundled backbone under a seeded random head, its weights spread wide enough that
    labels differ clearly (not the near-uniform scores of a fresh 0.02 init)."""
    torch.manual_seed(seed)
    model = cls.from_pretrained(BUNDLED, **config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("classifier.", "qa_outputs.")):
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def folders(module_tmp):
    root = module_tmp.mktemp("heads")
    torch.manual_seed(0)
    return {
        "mlm": _save(bertlab.BertForMaskedLM.from_pretrained(BUNDLED), root, "mlm"),
        "clf": _save(
            _head(
                bertlab.BertForSequenceClassification,
                1,
                id2label={0: "negative", 1: "neutral", 2: "positive"},
            ),
            root,
            "clf",
        ),
        "ner": _save(_head(bertlab.BertForTokenClassification, 2, id2label=NER), root, "ner"),
        "qa": _save(_head(bertlab.BertForQuestionAnswering, 3), root, "qa"),
        "nli": _save(
            _head(
                bertlab.BertForSequenceClassification,
                4,
                id2label={0: "contradiction", 1: "entailment", 2: "neutral"},
            ),
            root,
            "nli",
        ),
        "nli0": _save(
            _head(
                bertlab.BertForSequenceClassification,
                5,
                id2label={0: "ENTAILMENT", 1: "NEUTRAL", 2: "CONTRADICTION"},
            ),
            root,
            "nli0",
        ),
    }


def both(task, folder, **options):
    theirs = transformers.pipeline(task, model=str(folder), device=-1, **options)
    return bertlab.pipeline(task, model=str(folder), **options), theirs


def test_feature_extraction_gives_every_tokens_state_as_nested_lists():
    ours, theirs = both("feature-extraction", BUNDLED)
    one = ours(TEXTS[0])
    assert len(one) == 1 and len(one[0][0]) == 384  # (1, T, H), [CLS] and [SEP] included
    same(one, theirs(TEXTS[0]))
    same(ours(TEXTS), theirs(TEXTS))  # a batch padded inside: only real tokens come back
    same(ours(TEXTS[:1]), theirs(TEXTS[:1]))
    tensors = ours(TEXTS, return_tensors=True)
    same(tensors, theirs(TEXTS, return_tensors=True))
    assert tensors[1].shape[:2] == (1, len(theirs.tokenizer(TEXTS[1])["input_ids"]))


def test_fill_mask_candidates_tokens_and_sequences(folders):
    ours, theirs = both("fill-mask", folders["mlm"])
    one = "Paris is the [MASK] of France."
    got = ours(one)
    assert [type(got[0][k]) for k in ("score", "token", "token_str", "sequence")] == [
        float,
        int,
        str,
        str,
    ]
    same(got, theirs(one))
    same(ours(one, top_k=3), theirs(one, top_k=3))
    two = "[MASK] is the [MASK] of France."  # a list per mask, special tokens kept
    same(ours(two, top_k=2), theirs(two, top_k=2))
    texts = [one, "The [MASK] barked all night long."]
    same(ours(texts), theirs(texts))
    same(ours([one]), theirs([one]))  # a list of one answers as that one text
    targets = ["city", "capital", "paris", "unbelievably"]  # the last is not one word piece
    same(ours(one, targets=targets), theirs(one, targets=targets))
    same(ours(one, targets="city", top_k=3), theirs(one, targets="city", top_k=3))


def test_text_classification_shapes_for_every_input_and_top_k(folders):
    ours, theirs = both("text-classification", folders["clf"])
    pair = {"text": "A man plays a guitar.", "text_pair": "Someone makes music."}
    for inputs in (TEXTS[0], TEXTS, TEXTS[:1], pair, [pair, pair | {"text": TEXTS[1]}]):
        same(ours(inputs), theirs(inputs), repr(inputs))
        for options in (
            {"top_k": None},
            {"top_k": 2},
            {"top_k": 1},
            {"function_to_apply": "sigmoid"},
            {"function_to_apply": "none", "top_k": None},
        ):
            same(ours(inputs, **options), theirs(inputs, **options), f"{inputs!r} {options}")
    # options given when the pipeline is built hold for every call
    ours, theirs = both("sentiment-analysis", folders["clf"], top_k=None)
    same(ours(TEXTS[0]), theirs(TEXTS[0]))
    same(ours(TEXTS), theirs(TEXTS))


@pytest.mark.parametrize("strategy", [None, "none", "simple", "first", "average", "max"])
def test_token_classification_entities_and_groups(folders, strategy):
    options = {} if strategy is None else {"aggregation_strategy": strategy}
    ours, theirs = both("ner", folders["ner"], **options)
    got, expected = ours(TEXTS), theirs(TEXTS)
    same(got, expected)
    assert sum(map(len, got)) > 5  # the random head finds entities to compare
    same(ours(TEXTS[2]), theirs(TEXTS[2]))
    every = ours(TEXTS, ignore_labels=[])
    same(every, theirs(TEXTS, ignore_labels=[]))
    if strategy in (None, "none"):  # continued pieces, and the text of an unknown one
        assert {"##voss"[:2], "☃"} <= {e["word"][:2] for r in every for e in r}


def _reference_answers(folder, question, context, top_k, max_len, seq_len, stride, null):
    """The answers recomputed from transformers' own tokenizer and model by brute force over
    every span of every window (transformers 5 has no question-answering pipeline)."""
    tok = transformers.BertTokenizerFast.from_pretrained(folder)
    model = transformers.BertForQuestionAnswering.from_pretrained(folder).eval()
    enc = tok(
        question,
        context,
        truncation="only_second",
        max_length=seq_len,
        stride=min(stride, seq_len // 2),
        return_overflowing_tokens=True,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        out = model(
            input_ids=enc["input_ids"],
            token_type_ids=enc["token_type_ids"],
            attention_mask=enc["attention_mask"],
        )
    answers, null_score = [], 1.0
    for w in range(len(enc["input_ids"])):
        seq = enc.sequence_ids(w)
        ok = [s == 1 or p == 0 for p, s in enumerate(seq)]
        allowed = torch.tensor(ok)
        ps = out.start_logits[w].masked_fill(~allowed, -1e4).softmax(-1)
        pe = out.end_logits[w].masked_fill(~allowed, -1e4).softmax(-1)
        null_score = min(null_score, float(ps[0] * pe[0]))
        words = enc.encodings[w]
        for i in range(1, len(seq)):
            for j in range(i, min(len(seq), i + max_len)):
                if seq[i] == 1 and seq[j] == 1:
                    a = words.word_to_chars(words.token_to_word(i), sequence_index=1)[0]
                    z = words.word_to_chars(words.token_to_word(j), sequence_index=1)[1]
                    answers.append((float(ps[i] * pe[j]), a, z))
    ranked = sorted(answers, reverse=True)
    best = [{"score": s, "start": a, "end": z, "answer": context[a:z]} for s, a, z in ranked]
    if null:
        best = sorted(best + [{"score": null_score, "start": 0, "end": 0, "answer": ""}],
                      key=lambda x: x["score"], reverse=True)  # fmt: skip
    return best[0] if top_k == 1 else best[:top_k]


def test_question_answering_spans_scores_and_inputs(folders):
    qa = bertlab.pipeline("question-answering", model=str(folders["qa"]))
    question = "Where does she work?"
    context = "Ana-María works for a bakery in the old town of Zürich, near the lake shore."
    ref = _reference_answers(folders["qa"], question, context, 1, 15, 384, 128, False)
    same(qa(question, context), ref)
    same(qa(question=question, context=context), ref)
    same(qa({"question": question, "context": context}), ref)
    same(qa([{"question": question, "context": context}]), ref)  # a list of one: that one
    top = _reference_answers(folders["qa"], question, context, 4, 5, 384, 128, False)
    same(qa(question, context, top_k=4, max_answer_len=5), top)
    many = qa(question=[question, "Who?"], context=context)
    same(many[0], ref)
    same(many[1], _reference_answers(folders["qa"], "Who?", context, 1, 15, 384, 128, False))
    with_null = _reference_answers(folders["qa"], question, context, 3, 15, 384, 128, True)
    same(qa(question, context, top_k=3, handle_impossible_answer=True), with_null)
    assert any(a["answer"] == "" for a in qa(question, context, top_k=300,
                                              handle_impossible_answer=True))  # fmt: skip


def test_question_answering_over_overlapping_windows(folders):
    qa = bertlab.pipeline("question-answering", model=str(folders["qa"]), max_seq_len=32)
    question = "Which city?"
    context = " ".join(TEXTS * 3)  # several windows of 32 tokens
    ref = _reference_answers(folders["qa"], question, context, 5, 15, 32, 10, False)
    same(qa(question, context, top_k=5, doc_stride=10), ref)


@pytest.mark.parametrize("name", ["nli", "nli0"])  # entailment last-but-one, then first
def test_zero_shot_classification_on_an_nli_head(folders, name):
    ours, theirs = both("zero-shot-classification", folders[name])
    labels = ["travel", "cooking", "dancing", "sports"]
    for inputs in (TEXTS[0], TEXTS, TEXTS[:1]):
        same(ours(inputs, labels), theirs(inputs, labels))
        same(
            ours(inputs, candidate_labels=labels, multi_label=True),
            theirs(inputs, candidate_labels=labels, multi_label=True),
        )
    same(ours(TEXTS[1], "travel, cooking"), theirs(TEXTS[1], "travel, cooking"))
    same(ours(TEXTS[1], ["travel"]), theirs(TEXTS[1], ["travel"]))  # one label: vs contradiction
    template = "The topic is {}."
    same(
        ours(TEXTS[1], labels, hypothesis_template=template),
        theirs(TEXTS[1], labels, hypothesis_template=template),
    )
    assert abs(sum(ours(TEXTS[0], labels)["scores"]) - 1) < 1e-5


def test_zero_shot_refuses_a_model_without_an_entailment_label(folders):
    labels = r"\['negative', 'neutral', 'positive'\]"
    with pytest.raises(ValueError, match=f"entailment label.*labels are {labels}"):
        bertlab.pipeline("zero-shot-classification", model=str(folders["clf"]))


def test_model_objects_tokenizers_and_devices(folders):
    folder = folders["clf"]
    model = bertlab.BertForSequenceClassification.from_pretrained(folder)
    tok = bertlab.BertTokenizer.from_pretrained(folder)
    by_folder = bertlab.pipeline("text-classification", model=str(folder))(TEXTS, top_k=None)
    for tokenizer in (tok, str(folder)):
        pipe = bertlab.pipeline("text-classification", model=model, tokenizer=tokenizer, device=-1)
        same(pipe(TEXTS, top_k=None), by_folder)
    with pytest.raises(ValueError, match="needs tokenizer="):
        bertlab.pipeline("text-classification", model=model)
    with pytest.raises(TypeError, match="needs a BertForTokenClassification, got a BertForSeq"):
        bertlab.pipeline("ner", model=model, tokenizer=tok)
    base = bertlab.pipeline("feature-extraction", model=model, tokenizer=tok)  # its encoder
    same(base("a text"), bertlab.pipeline("feature-extraction", model=str(folder))("a text"))
    assert bertlab.pipeline("feature-extraction", model=None).directory == BUNDLED
    for cpu in (-1, "cpu", torch.device("cpu"), None):
        assert _device(cpu) == torch.device("cpu")
    gpus = torch.cuda.device_count()
    if gpus:
        assert _device(0) == _device("cuda:0") == torch.device("cuda:0")
    else:
        with pytest.raises(ValueError, match="device 0 asked for, but this machine has 0 CUDA"):
            _device(0)
    with pytest.raises(ValueError, match=f"device 'cuda:{gpus}' asked for"):
        _device(f"cuda:{gpus}")
    with pytest.raises(ValueError, match=r"device -2 is not -1 \(the CPU\) or a GPU index"):
        _device(-2)
    with pytest.raises(ValueError, match="device 'gpu' is not a device name"):
        _device("gpu")


def test_bad_tasks_and_options_are_refused_by_name(folders):
    with pytest.raises(ValueError, match="unknown pipeline 'summarization'") as caught:
        bertlab.pipeline("summarization")
    for name in [*TASKS, "sentiment-analysis", "ner", "embed", "classify", "tag", "answer"]:
        assert name in str(caught.value)
    cases = [
        ("ner", "ner", {"aggregation_strategy": "bogus"}, "aggregation_strategy 'bogus' is not"),
        ("mlm", "fill-mask", {"top_k": 0}, "top_k 0 is not a positive int"),
        ("clf", "text-classification", {"top_k": 0}, r"top_k 0 is not a positive int or None"),
        ("clf", "text-classification", {"function_to_apply": "relu"}, "'relu' is not one of"),
        ("qa", "question-answering", {"max_answer_len": 0}, "max_answer_len 0 is not an int >="),
        ("nli", "zero-shot-classification", {"hypothesis_template": "x"}, "has no {} for"),
        ("nli", "zero-shot-classification", {"candidate_labels": []}, "candidate_labels is empty"),
        ("mlm", "fill-mask", {"targets": [""]}, "has no word piece"),
    ]
    for folder, task, options, message in cases:
        with pytest.raises(ValueError, match=message):
            bertlab.pipeline(task, model=str(folders[folder]), **options)
    with pytest.raises(TypeError, match="no option bogus .*aggregation_strategy, ignore_labels"):
        bertlab.pipeline("ner", model=str(folders["ner"]), bogus=1)
    with pytest.raises(TypeError, match="the embed pipeline has no option top_k"):
        bertlab.pipeline("embed", top_k=3)
    mlm = bertlab.pipeline("fill-mask", model=str(folders["mlm"]))
    with pytest.raises(ValueError, match="top_k -1 is not a positive int"):
        mlm("[MASK].", top_k=-1)
    with pytest.raises(ValueError, match="has no \\[MASK\\] token"):
        mlm(["a [MASK].", "no mask here"])
    clf = bertlab.pipeline("text-classification", model=str(folders["clf"]))
    with pytest.raises(TypeError, match="text_pair"):
        clf([["a", "b"]])
    qa = bertlab.pipeline("question-answering", model=str(folders["qa"]))
    with pytest.raises(ValueError, match="the question is empty"):
        qa(question=" ", context="Ann met Bob.")
    with pytest.raises(ValueError, match="2 questions but 3 contexts"):
        qa(question=["a?", "b?"], context=["x", "y", "z"])
    zs = bertlab.pipeline("zero-shot-classification", model=str(folders["nli"]))
    with pytest.raises(ValueError, match="needs candidate_labels"):
        zs("a text")

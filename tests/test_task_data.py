"""Task datasets and features (bertlab.data.classification, .tagging, .squad): readers, detected
columns and labels, first-piece labels, SQuAD windows and answer spans, and every refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.data.classification import encode_classification, read_classification
from bertlab.data.masking import IGNORE_INDEX
from bertlab.data.squad import best_answers, encode_squad, read_squad
from bertlab.data.tagging import encode_tagging, read_conll, word_predictions
from bertlab.metrics import conll_entities

FIXTURES = Path(__file__).parent / "fixtures"
SST2 = FIXTURES / "sst2_sample.tsv"
CONLL = FIXTURES / "conll_style_bertlab.txt"
SQUAD = FIXTURES / "squad_sample.json"


@pytest.fixture(scope="module")
def tok():
    return bertlab.BertTokenizer.from_pretrained("default")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ============================================================================ classification
def test_sst2_columns_and_labels_are_detected(tok):
    data = read_classification(SST2)
    assert data.columns == ("sentence", None, "label") and data.label_names == ["0", "1"]
    assert len(data) == 200 and set(data.labels) == {0, 1} and data.pairs is None
    assert data.texts[0] == "the expressive power of the camera "
    assert "200 examples" in data.describe() and "2 labels: 0, 1" in data.describe()
    features, truncated = encode_classification(tok, data, max_length=16)
    assert all(len(f["input_ids"]) <= 16 for f in features) and truncated > 0
    full = tok(data.texts[0])["input_ids"]
    assert features[0]["input_ids"] == full[:16] if len(full) <= 16 else True
    assert features[0]["labels"] == data.labels[0]


def test_pairs_csv_jsonl_and_regression(tmp_path, tok):
    csv_file = _write(
        tmp_path / "mnli.csv",
        "premise,hypothesis,gold_label\n"
        '"A man, tall.",He is tall.,entailment\nA cat.,A dog.,contradiction\n'
        "Rain.,Maybe wet.,neutral\n",
    )
    data = read_classification(csv_file)
    assert data.columns == ("premise", "hypothesis", "gold_label")
    assert data.texts[0] == "A man, tall." and data.pairs[1] == "A dog."
    assert data.label_names == ["contradiction", "entailment", "neutral"]
    features, _ = encode_classification(tok, data)
    assert set(features[0]["token_type_ids"]) == {0, 1}  # [CLS] A [SEP] B [SEP]
    sts = _write(
        tmp_path / "sts.jsonl",
        '{"sentence1": "a", "sentence2": "b", "score": 3.8}\n'
        '{"sentence1": "c", "sentence2": "d", "score": 1}\n',
    )
    reg = read_classification(sts)
    assert reg.regression and reg.labels == [3.8, 1.0] and "regression" in reg.describe()
    named = read_classification(
        _write(tmp_path / "x.tsv", "id\tbody\tstars\n1\tgood\t5\n2\tbad\t1\n3\tok\t10\n"),
        text_column="body",
        label_column="stars",
    )
    assert named.label_names == ["1", "5", "10"]  # integers sort as numbers


def test_dev_file_label_never_in_training_is_named(tmp_path):
    train = read_classification(SST2)
    dev = _write(tmp_path / "dev.tsv", "sentence\tlabel\nfine\t1\nodd\t2\n")
    with pytest.raises(
        ValueError,
        match=r"dev.tsv, line 3: label '2' never appears in the "
        r"training data \(labels: 0, 1\)",
    ):
        read_classification(dev, like=train)
    same = read_classification(_write(tmp_path / "ok.tsv", "sentence\tlabel\na\t1\n"), like=train)
    assert same.labels == [1] and same.label_names == ["0", "1"]


def test_classification_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"bad.tsv, line 3: 3 columns, but the header has 2"):
        read_classification(_write(tmp_path / "bad.tsv", "sentence\tlabel\na\t1\nb\t0\textra\n"))
    with pytest.raises(ValueError, match="holds no examples"):
        read_classification(_write(tmp_path / "empty.tsv", "sentence\tlabel\n"))
    with pytest.raises(ValueError, match="cannot tell the text column"):
        read_classification(_write(tmp_path / "cols.tsv", "a\tlabel\nx\t1\n"))
    with pytest.raises(ValueError, match="has no column 'body'"):
        read_classification(SST2, text_column="body")
    with pytest.raises(ValueError, match=r"j.jsonl, line 2: not JSON"):
        read_classification(_write(tmp_path / "j.jsonl", '{"text": "a", "label": 1}\n{oops\n'))
    with pytest.raises(FileNotFoundError):
        read_classification(tmp_path / "missing.tsv")


# ============================================================================ tagging
def test_conll_reads_sentences_and_labels_first_pieces(tok):
    data = read_conll(CONLL)
    assert data.scheme == "IOB2" and data.words[0] == ["ZÜRICH", "2031-04-17"]
    assert data.tags[0] == ["B-LOC", "O"]
    assert data.label_names[0] == "O" and "B-PER" in data.label_names
    features, cut = encode_tagging(tok, data, max_length=128)
    assert cut == 0
    index = {n: i for i, n in enumerate(data.label_names)}
    for f, tags in zip(features, data.tags, strict=True):
        firsts = [
            i
            for i, w in enumerate(f["word_ids"])
            if w is not None and (i == 0 or f["word_ids"][i - 1] != w)
        ]
        assert [f["labels"][i] for i in firsts] == [index[t] for t in tags]
        others = set(range(len(f["labels"]))) - set(firsts)
        assert all(f["labels"][i] == IGNORE_INDEX for i in others)
    # a word of several pieces: only its first carries the label
    assert any(len(tok.tokenize(w)) > 1 for w in data.words[1])


def test_iob1_files_become_iob2_with_the_same_entities(tmp_path):
    text = "EU NNP I-ORG\nrejects VBZ O\nGerman JJ I-MISC\nFrench JJ B-MISC\nlamb NN O\n"
    data = read_conll(_write(tmp_path / "iob1.txt", text))
    assert data.scheme == "IOB1" and "converted to IOB2" in data.describe()
    assert data.tags[0] == ["B-ORG", "O", "B-MISC", "B-MISC", "O"]
    original = ["I-ORG", "O", "I-MISC", "B-MISC", "O"]
    assert conll_entities(data.tags[0]) == conll_entities(original)


def test_truncated_words_are_counted_and_predicted_o(tok):
    data = read_conll(CONLL)
    features, cut = encode_tagging(tok, data, max_length=6)
    assert (
        cut
        == sum(len(w) for w in data.words)
        - sum(len({w for w in f["word_ids"] if w is not None}) for f in features)
        and cut > 0
    )
    f, n = features[1], len(data.words[1])
    tags = word_predictions(f["word_ids"], ["B-PER"] * len(f["word_ids"]), n)
    assert len(tags) == n and tags[-1] == "O"


def test_conll_bad_files(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"x.txt, line 2: 2 columns, but the file's first token "
        r"line has 4",
    ):
        read_conll(_write(tmp_path / "x.txt", "EU NNP I-NP B-ORG\nrejects O\n"))
    with pytest.raises(ValueError, match=r"line 1: tag 'PERSON' is not O, B-TYPE or I-TYPE"):
        read_conll(_write(tmp_path / "y.txt", "Ann PERSON\n"))
    with pytest.raises(ValueError, match="holds no sentences"):
        read_conll(_write(tmp_path / "z.txt", "-DOCSTART- -X- O\n\n"))
    train = read_conll(CONLL)
    with pytest.raises(ValueError, match=r"dev.txt, line 2: tag 'B-DATE' never appears"):
        read_conll(_write(tmp_path / "dev.txt", "On O\nMonday B-DATE\n"), like=train)


# ============================================================================ SQuAD
def test_squad_windows_hold_the_answer_span(tok):
    data = read_squad(SQUAD)
    assert data.version == "1.1" and len(data) == 22 and not data.mismatched
    features = encode_squad(tok, data, max_length=128, doc_stride=32, max_query_length=24)
    assert len(features) > len(data)  # long contexts give several windows
    hit = 0
    for f in features:
        e = data.examples[f["example"]]
        s, t = f["start_positions"], f["end_positions"]
        if s == 0:
            assert t == 0
            continue
        hit += 1
        text = e.context[f["offsets"][s][0] : f["offsets"][t][1]]
        assert text == e.answer_text  # the span through the offsets is the answer, exactly
    assert hit >= len(data)  # every answer lies whole in at least one window
    assert all(len(f["input_ids"]) <= 128 for f in features)


def test_best_answers_reads_spans_back_from_logits(tok):
    data = read_squad(SQUAD)
    features = encode_squad(tok, data, max_length=128, doc_stride=32, max_query_length=24)
    T = max(len(f["input_ids"]) for f in features)
    start = torch.full((len(features), T), -10.0)
    end = torch.full((len(features), T), -10.0)
    for w, f in enumerate(features):  # logits that point at the gold span
        start[w, f["start_positions"]] = 5.0
        end[w, f["end_positions"]] = 5.0
    answers = best_answers(data, features, start, end)
    for e in data.examples:
        assert answers[e.id]["text"] == e.answer_text
        a = answers[e.id]
        assert e.context[a["start"] : a["end"]] == e.answer_text
    short = best_answers(data, features, start, end, max_answer_length=1)
    assert all(short[e.id]["tokens"][0] == short[e.id]["tokens"][1] for e in data.examples)
    assert all(a["tokens"][1] - a["tokens"][0] < 30 for a in answers.values())


def _squad_v2(france_at: int) -> str:
    """Three questions on one sentence: answerable, unanswerable, and one whose answer is
    given at ``france_at``."""
    return json.dumps(
        {
            "version": "v2.0",
            "data": [
                {
                    "title": "T",
                    "paragraphs": [
                        {
                            "context": "Paris is the capital of France.",
                            "qas": [
                                {
                                    "id": "q1",
                                    "question": "What is the capital?",
                                    "is_impossible": False,
                                    "answers": [{"text": "Paris", "answer_start": 0}],
                                },
                                {
                                    "id": "q2",
                                    "question": "Who?",
                                    "is_impossible": True,
                                    "answers": [],
                                },
                                {
                                    "id": "q3",
                                    "question": "Which country?",
                                    "is_impossible": False,
                                    "answers": [{"text": "France", "answer_start": france_at}],
                                },
                            ],
                        }
                    ],
                }
            ],
        }
    )


def test_squad_v2_and_bad_answers(tmp_path, tok):
    path = _write(tmp_path / "v2.json", _squad_v2(france_at=3))  # France is at 24
    data = read_squad(path)
    assert data.version == "2.0" and data.mismatched == ["q3"]
    assert data.examples[1].answers == [] and "1 answers whose text does not match" in (
        data.describe()
    )
    features = encode_squad(tok, data, max_length=64, doc_stride=16, max_query_length=16)
    used = {data.examples[f["example"]].id for f in features}
    assert used == {"q1", "q2"}  # q3's only answer is off its offset: not a training target
    assert [f["start_positions"] for f in features if data.examples[f["example"]].id == "q2"] == [0]
    evaluation = encode_squad(tok, data, max_length=64, doc_stride=16, training=False)
    assert {data.examples[f["example"]].id for f in evaluation} == {"q1", "q2", "q3"}


class _ParisModel(torch.nn.Module):
    """Points every answer at the token "paris", and scores [CLS] (no answer) highest only
    when the question holds "who"."""

    def __init__(self, tok):
        super().__init__()
        self.paris, self.who = tok.convert_tokens_to_ids(["paris", "who"])

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        logits = torch.where(input_ids == self.paris, 5.0, -5.0)
        asks_who = (input_ids == self.who).any(1)
        logits[:, 0] = torch.where(asks_who, 20.0, -20.0)
        from types import SimpleNamespace

        return SimpleNamespace(start_logits=logits, end_logits=logits.clone())


def test_squad_v2_evaluation_abstains_and_searches_the_threshold(tmp_path, tok):
    from bertlab.tasks.finetuning import Split
    from bertlab.tasks.qa import QuestionAnsweringTask

    data = read_squad(_write(tmp_path / "v2.json", _squad_v2(france_at=24)))
    features = encode_squad(tok, data, max_length=64, doc_stride=16, training=False)
    dev = Split(data, features)
    r = QuestionAnsweringTask().evaluate(_ParisModel(tok), dev)
    # q1 right, q2 rightly unanswered (its [CLS] beats the span by 30 > 0), q3 wrong.
    assert r["exact_match"] == pytest.approx(2 / 3)
    assert r["has_answer_exact_match"] == 0.5 and r["no_answer_exact_match"] == 1.0
    assert r["best_exact_match"] == pytest.approx(2 / 3) and r["best_f1"] >= r["f1"]
    # A threshold above the margin never abstains: q2 is then answered, and wrong.
    never = QuestionAnsweringTask(null_threshold=100.0).evaluate(_ParisModel(tok), dev)
    assert never["exact_match"] == pytest.approx(1 / 3)


def test_squad_refusals(tmp_path, tok):
    raw = {
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": " \u200b ",
                        "qas": [
                            {
                                "id": "q",
                                "question": "Why?",
                                "answers": [{"text": "x", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    with pytest.raises(ValueError, match="question q: its context has no tokens"):
        encode_squad(tok, read_squad(_write(tmp_path / "e.json", json.dumps(raw))))
    data = read_squad(SQUAD)
    with pytest.raises(
        ValueError,
        match=r"question .*: \d+ question tokens leave a context "
        r"window of \d+ tokens in max_length 40, not more than doc_stride 20",
    ):
        encode_squad(tok, data, max_length=40, doc_stride=20, max_query_length=64)
    with pytest.raises(ValueError, match="holds no questions"):
        read_squad(SQUAD, titles={"Nowhere"})
    with pytest.raises(ValueError, match="not SQuAD JSON"):
        read_squad(_write(tmp_path / "n.json", "[1, 2]"))

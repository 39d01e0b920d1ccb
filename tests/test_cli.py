"""The command line: demo, summary, inspect embeddings (run in-process through main())."""

import re

import pytest

from bertlab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_demo_runs_the_bundled_checkpoint(capsys):
    code, out, _ = run(capsys, "demo")
    assert code == 0
    assert "Total params: 22,713,216" in out  # all-MiniLM-L6-v2's BertModel, counted by torch
    assert "last_hidden_state: (3, " in out and "384)" in out
    sims = [float(x) for x in re.findall(r"cosine similarity to .*: ([-0-9.]+)", out)]
    assert len(sims) == 2 and sims[0] > sims[1] + 0.3  # a paraphrase beats an unrelated sentence


def test_summary_reproduces_reference_004(capsys):
    code, out, _ = run(capsys, "summary", "base", "--head", "pretraining", "--vocab-size", "30000")
    assert code == 0
    assert "109,705,010" in out and "23,040,000" in out and "2,362,368" in out


def test_summary_of_a_model_folder(capsys):
    code, out, _ = run(
        capsys, "summary", "default", "--head", "sequence-classification", "--num-labels", "3"
    )
    assert code == 0 and "classifier" in out and "H*K + K" in out


def test_summary_bad_source_is_a_clear_error(capsys):
    code, _, err = run(capsys, "summary", "/no/such/folder")
    assert code == 2 and "/no/such/folder" in err


def test_inspect_embeddings_checks_the_identity(capsys):
    code, out, _ = run(capsys, "inspect", "embeddings", "I am Sinan", "--pair", "She is Zoe")
    assert code == 0
    assert "[3] sin  id=8254" in out and "[4] ##an  id=2319" in out
    assert "identical" in out
    assert re.search(r"segment=1", out)


def test_unknown_head_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["summary", "--head", "nope"])


def test_summary_of_bert_base_counts_199_named_parameters(capsys):
    # reference 001: "This BERT model has 199 different named parameters"
    code, out, _ = run(capsys, "summary", "base")
    assert code == 0 and "Named parameter tensors: 199" in out and "109,482,240" in out

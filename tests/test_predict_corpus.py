"""`bertlab predict TASK --file F --out OUT`: a file streamed in chunks into JSON lines, .npy or
Parquet, equal to the in-memory pipelines, resumed without computing a finished chunk again,
refused when the input or the settings changed, bad input named before any work, and torchrun's
processes writing what one process writes. Small inputs and --chunk-lines 4 or 5 stand in for
millions of lines and chunks of 10 000."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import scramble

import bertlab
from bertlab.cli.main import main
from bertlab.pipelines import EmbedPipeline, pipeline
from bertlab.pipelines.corpus import CorpusJob, predict_corpus

DEFAULT = bertlab.bundled_model_dir()
ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    f"{w} number {i} of the corpus, {'and a longer tail of words ' * (i % 3)}".strip()
    for i, w in enumerate("Ann Bob Paris a the film Zürich it one two three naïve".split() * 2)
]  # 24 texts of three lengths


ORIGINAL_CALL = EmbedPipeline.__call__


class Calls:
    """EmbedPipeline's calls counted: the texts it computed; Ctrl-C once ``stop_at`` are."""

    def __init__(self, monkeypatch, stop_at: int | None = None):
        self.texts: list[str] = []

        def counting(pipe, texts, *args, **kwargs):
            if stop_at is not None and len(self.texts) >= stop_at:
                raise KeyboardInterrupt
            self.texts.extend(texts)
            return ORIGINAL_CALL(pipe, texts, *args, **kwargs)

        monkeypatch.setattr(EmbedPipeline, "__call__", counting)


def run(capsys, command: str, *extra: str) -> tuple[int, str, str]:
    """`bertlab predict COMMAND EXTRA...`: (exit status, stdout, stderr). COMMAND is split on
    spaces (no path here has one); EXTRA are kept whole."""
    code = main(["predict", *command.split(), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def write_jsonl(path: Path, rows: list[dict], blank_every: int = 0) -> Path:
    lines = []
    for i, row in enumerate(rows):
        lines.append(json.dumps(row, ensure_ascii=False))
        if blank_every and i % blank_every == 0:
            lines.append("")  # blank lines are skipped, as --file skips them
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_jsonl(
        tmp_path / "texts.jsonl", [{"text": t, "id": i} for i, t in enumerate(TEXTS)]
    )


@pytest.fixture(scope="module")
def heads(module_tmp) -> dict[str, Path]:
    """A classifier and a tagger from the bundled checkpoint, every weight scrambled (as the
    bundled model has no heads): answers that differ from text to text."""
    root = module_tmp.mktemp("heads")
    tags = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    models = {
        "classify": bertlab.BertForSequenceClassification.from_pretrained(
            DEFAULT, id2label={0: "neg", 1: "neu", 2: "pos"}
        ),
        "tag": bertlab.BertForTokenClassification.from_pretrained(DEFAULT, id2label=tags),
    }
    for seed, (task, model) in enumerate(models.items()):
        scramble(model, seed)
        model.save_pretrained(root / task)
        bertlab.BertTokenizer.from_pretrained(DEFAULT).save_pretrained(root / task)
    return {task: root / task for task in models}


def test_embed_json_lines_are_the_pipelines_vectors_in_input_order(capsys, tmp_path):
    """JSON lines in, blank lines among them: 24 texts on 30 lines, 6 chunks of 5 lines."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS], blank_every=4)
    out = tmp_path / "vectors.jsonl"
    code, printed, err = run(capsys, f"embed --file {source} --out {out} --chunk-lines 5")
    assert code == 0 and err == ""  # standard error is not a terminal: no status line
    assert printed == f"wrote 24 results to {out} (jsonl; 6 chunks; 1 process)\n"
    rows = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
    assert [r["input"] for r in rows] == TEXTS
    expected = pipeline("embed")(TEXTS)
    assert (torch.tensor([r["output"] for r in rows]) - expected).abs().max() < 1e-5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "vectors.jsonl"]


def test_npy_holds_float32_rows_in_input_order_from_plain_text_lines(capsys, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n\n", "utf-8")  # as --file reads: a text a line
    out = tmp_path / "vectors.npy"  # the format from the suffix
    command = f"embed --file {source} --out {out} --chunk-lines 4 --pooling cls --no-normalize"
    assert run(capsys, command)[0] == 0
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (24, 384)
    expected = pipeline("embed")(TEXTS, pooling="cls", normalize=False)
    assert np.abs(got - expected.numpy()).max() < 1e-5


def same_results(got: list, want: list) -> bool:
    """Equal labels, entities and spans; scores within 1e-4 (a chunk and the whole file are
    batches of different row counts, which float32 products may compute with different kernels:
    products.FEW_ROWS; the scrambled heads magnify their rounding to about 1e-5)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if {**g, "score": 0} != {**w, "score": 0} or abs(g["score"] - w["score"]) > 1e-4:
            return False
    return True


def test_classify_and_tag_write_what_predict_json_prints(capsys, tmp_path, heads):
    """The {"input", "output"} lines `predict --json` prints, chunk after chunk."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS[:12]) + "\n", "utf-8")
    for task in ("classify", "tag"):
        out = tmp_path / f"{task}.jsonl"
        options = f"--file {source} --model {heads[task]} --top-k 2"
        assert run(capsys, f"{task} {options} --out {out} --chunk-lines 5")[0] == 0
        code, printed, _ = run(capsys, f"{task} {options} --json")
        assert code == 0
        got = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
        want = [json.loads(x) for x in printed.splitlines()]
        assert [g["input"] for g in got] == [w["input"] for w in want] == TEXTS[:12]
        assert all(same_results(g["output"], w["output"]) for g, w in zip(got, want, strict=True))
        assert task == "tag" or all(len(g["output"]) == 2 for g in got)  # --top-k 2
        assert task == "classify" or sum(len(g["output"]) for g in got) > 0  # entities found


def test_a_lines_own_pair_goes_before_the_pair_option(capsys, tmp_path, heads):
    """Lines with and without a "pair" in one chunk: each batch is one kind, in input order."""
    rows = [{"text": t} for t in TEXTS[:12]]
    for row in rows[1::3] + rows[2::3]:
        row["pair"] = "a second text"
    source = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "out.jsonl"
    command = f"classify --file {source} --out {out} --model {heads['classify']} --top-k 3"
    assert run(capsys, command, "--pair", "the default pair")[0] == 0
    got = [json.loads(x)["output"] for x in out.read_text("utf-8").splitlines()]
    clf = pipeline("classify", heads["classify"])
    pairs = [r.get("pair", "the default pair") for r in rows]
    want = clf([r["text"] for r in rows], pairs, top_k=3)
    assert all(same_results(g, w) for g, w in zip(got, want, strict=True))
    alone = clf([r["text"] for r in rows], top_k=3)  # the pairs changed the answers
    assert not any(same_results(g, w) for g, w in zip(got, alone, strict=True))


def test_an_interrupted_run_resumes_without_computing_a_finished_chunk(
    capsys, tmp_path, corpus, monkeypatch
):
    whole, out = tmp_path / "whole.jsonl", tmp_path / "out.jsonl"
    parts = tmp_path / "out.jsonl.parts"
    command = f"embed --file {corpus} --chunk-lines 5 --batch-size 5"  # a call a chunk
    assert run(capsys, command, "--out", str(whole))[0] == 0
    Calls(monkeypatch, stop_at=10)  # Ctrl-C in the third chunk
    code, _, err = run(capsys, command, "--out", str(out))
    assert code == 130 and f"kept in {parts}" in err and "--resume" in err
    assert not out.exists()
    names = ["manifest.json", "part-000000.jsonl", "part-000001.jsonl"]
    assert sorted(p.name for p in parts.iterdir()) == names
    code, _, err = run(capsys, command, "--out", str(out))  # neither --resume nor --overwrite
    assert code == 2 and "--resume continues it, --overwrite starts over" in err
    calls = Calls(monkeypatch)
    code, printed, _ = run(capsys, command, "--out", str(out), "--resume")
    assert code == 0 and "5 chunks, 2 of them found done" in printed
    assert calls.texts == TEXTS[10:]  # the first two chunks' 10 texts: not again
    assert out.read_bytes() == whole.read_bytes() and not parts.exists()
    code, _, err = run(capsys, command, "--out", str(out), "--resume")
    assert code == 2 and f"{out} exists; --overwrite replaces it" in err


def test_resume_is_refused_when_the_input_or_a_setting_changed(
    capsys, tmp_path, corpus, monkeypatch
):
    out, parts = tmp_path / "out.npy", tmp_path / "out.npy.parts"
    command = f"embed --file {corpus} --out {out} --chunk-lines 5"
    Calls(monkeypatch, stop_at=5)
    assert run(capsys, command)[0] == 130
    monkeypatch.undo()
    code, _, err = run(capsys, command, "--pooling", "cls", "--resume")
    assert code == 2 and "pooling 'mean' then, 'cls' now" in err
    code, _, err = run(capsys, command, "--chunk-lines", "6", "--resume")
    assert code == 2 and "chunk_lines 5 then, 6 now" in err
    with corpus.open("a") as f:
        f.write('{"text": "one more line"}\n')
    code, _, err = run(capsys, command, "--resume")
    assert code == 2 and "cannot resume" in err and "size " in err and "--overwrite" in err
    assert not out.exists()
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "part-000000.f32"]
    assert run(capsys, command, "--overwrite")[0] == 0
    assert np.load(out).shape == (25, 384) and not parts.exists()


ONE = '{"text": "a"}\n'


@pytest.mark.parametrize(
    ("command", "content", "message"),
    [
        ("embed", None, "in.jsonl is missing"),
        ("embed", "", "has no input line (it is empty or blank)"),
        ("embed", "\n  \n", "has no input line"),
        ("embed", ONE * 2 + '{"text": "c",\n', "line 3 is not valid JSON"),
        ("tag", ONE + '\n{"body": "b"}\n', 'line 3 has no "text" field (it has keys body)'),
        ("embed", '{"text": ["a"]}\n', 'line 1: "text" is a list, not a string'),
        ("classify --format npy", ONE, "--format npy holds vectors, which embed gives"),
        ("embed --resume --overwrite", ONE, "--resume and --overwrite contradict"),
        ("embed --chunk-lines 0", ONE, "--chunk-lines must be 1 or more, got 0"),
    ],
)
def test_bad_input_is_named_before_any_work(capsys, tmp_path, command, content, message):
    """Exit status 2 and the reason, before a model is loaded; nothing written."""
    source = tmp_path / "in.jsonl"
    if content is not None:
        source.write_text(content, "utf-8")
    code, printed, err = run(capsys, f"{command} --file {source} --out {tmp_path / 'o.jsonl'}")
    assert code == 2 and message in err and printed == ""
    assert [p.name for p in tmp_path.iterdir()] == (["in.jsonl"] if content is not None else [])


def test_formats_and_options_that_do_not_fit_are_refused(capsys, tmp_path, corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    code, _, err = run(capsys, f"embed --file {corpus} --out {tmp_path / 'o.parquet'}")
    assert code == 2 and "--format parquet needs pyarrow: pip install pyarrow" in err
    with pytest.raises(ValueError, match="unknown format 'csv'; choose one of jsonl, npy, parq"):
        predict_corpus(CorpusJob("embed", corpus, tmp_path / "o.csv", format="csv"))
    with pytest.raises(ValueError, match="--out takes the tasks embed, classify, tag, not 'ans"):
        predict_corpus(CorpusJob("answer", corpus, tmp_path / "o.jsonl"))
    code, _, err = run(capsys, f"embed a-text --out {tmp_path / 'o.jsonl'}")
    assert code == 2 and "--out reads --file FILE" in err
    code, _, err = run(capsys, "embed a-text --resume")
    assert code == 2 and "--resume goes with --out FILE only" in err
    with pytest.raises(SystemExit):
        main(["predict", "embed", "--file", str(corpus), "--out", "o", "--format", "csv"])
    assert "invalid choice: 'csv'" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["texts.jsonl"]


def test_parquet_holds_the_texts_and_their_vectors(tmp_path, corpus):
    pq = pytest.importorskip(
        "pyarrow.parquet", reason="pyarrow is not installed here; its refusal is tested above"
    )
    out = tmp_path / "v.parquet"
    predict_corpus(CorpusJob("embed", corpus, out, chunk_lines=5))
    table = pq.read_table(out)
    assert table.column("text").to_pylist() == TEXTS
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert np.abs(vectors - pipeline("embed")(TEXTS).numpy()).max() < 1e-5


def test_a_terminal_gets_a_status_line(tmp_path, corpus):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    predict_corpus(CorpusJob("embed", corpus, tmp_path / "o.jsonl", chunk_lines=5), screen)
    shown = screen.getvalue()
    assert shown.startswith("\rembed: ") and "24 of 24 inputs (100%)" in shown
    assert shown.endswith("\n")


def test_two_torchrun_processes_write_what_one_process_writes(capsys, tmp_path, corpus):
    command = f"embed --file {corpus} --chunk-lines 4 --batch-size 3"
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's processes (OMP_NUM_THREADS=1): the same bits
    try:
        assert run(capsys, command, "--out", str(one))[0] == 0
    finally:
        torch.set_num_threads(threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(ROOT),
    }
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    ]
    done = subprocess.run(
        [*launch, "-m", "bertlab", "predict", *command.split(), "--out", str(two)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote 24 results to {two} (jsonl; 6 chunks; 2 processes)" in done.stdout
    assert two.read_bytes() == one.read_bytes()
    assert not (tmp_path / "two.jsonl.parts").exists()

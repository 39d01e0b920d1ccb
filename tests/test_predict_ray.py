"""Batch inference on Ray Data: ``bertlab.pipelines.Predictor`` over batches in numpy, pandas and
Arrow (the same results, error rows for null, empty and invalid texts, the model loaded on the
first batch and never pickled), every task on a local Ray cluster equal to the single-process
pipelines row for row, an actor that dies retried without a row lost or written twice, and
``bertlab predict TASK INPUT --out OUT --ray local`` with its refusals. One Ray instance (2 CPUs)
serves the module; tiny models keep each actor's start short."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import scramble
from tiny_models import tiny

import bertlab
from bertlab.cli.main import main
from bertlab.pipelines import Predictor, pipeline
from bertlab.pipelines.raydata import RayJob, predict_ray, reservation

pa = pytest.importorskip("pyarrow", reason="Ray Data's batches and Parquet need pyarrow")
pq = pytest.importorskip("pyarrow.parquet", reason="Parquet needs pyarrow")
pd = pytest.importorskip("pandas", reason="the pandas batch format needs pandas")

TEXTS = [
    f"{w} number {i} of the corpus, {'and a longer tail of words ' * (i % 3)}".strip()
    for i, w in enumerate("Ann Bob Paris a the film Zürich it one two three naïve".split() * 3)
]  # 36 texts of three lengths
BAD = {5: None, 11: "", 23: "   "}  # rows whose text is refused, by id


@pytest.fixture(scope="module")
def models(module_tmp) -> dict[str, Path]:
    root = module_tmp.mktemp("models")
    tags = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    return {
        "embed": tiny(bertlab.BertModel, root / "embed", 1),
        "classify": tiny(bertlab.BertForSequenceClassification, root / "classify", 2,
                         id2label={0: "neg", 1: "neu", 2: "pos"}),
        "tag": tiny(bertlab.BertForTokenClassification, root / "tag", 3, id2label=tags),
        "answer": reader(root / "answer"),
        "fill-mask": tiny(bertlab.BertForMaskedLM, root / "fill-mask", 5),
    }  # fmt: skip


def reader(folder: Path) -> Path:
    """A tiny question-answering model with 256 positions: room for a context window of the
    pipeline's doc_stride (128)."""
    cfg = bertlab.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=128)  # fmt: skip
    torch.manual_seed(4)
    scramble(bertlab.BertForQuestionAnswering(cfg), 4).save_pretrained(folder)
    bertlab.BertTokenizer.from_pretrained(bertlab.bundled_model_dir()).save_pretrained(folder)
    return folder


def rows() -> dict[str, list]:
    texts = [BAD.get(i, t) for i, t in enumerate(TEXTS)]
    return {
        "id": list(range(len(TEXTS))),
        "text": texts,
        "question": [f"Who is number {i}?" for i in range(len(TEXTS))],
        "context": TEXTS,
        "masked": [t.replace("number", "[MASK]", 1) for t in TEXTS],
    }


def parquet(path: Path, files: int = 1) -> Path:
    """The rows in ``files`` Parquet files of a folder (several row groups each)."""
    path.mkdir()
    table = pa.table(rows())
    step = -(-table.num_rows // files)
    for k in range(files):
        pq.write_table(table.slice(k * step, step), path / f"part-{k}.parquet", row_group_size=5)
    return path


def expected(task: str, folder: Path) -> list:
    """The single-process pipeline's results for the rows that run."""
    pipe = pipeline(task, folder)
    data = rows()
    good = [i for i, t in enumerate(data["text"]) if i not in BAD]
    if task == "embed":
        return list(pipe([data["text"][i] for i in good]).numpy())
    if task == "classify":
        return [r[0] for r in pipe([data["text"][i] for i in good])]
    if task == "tag":
        return pipe([data["text"][i] for i in good])
    if task == "answer":
        items = [{"question": data["question"][i], "context": data["context"][i]} for i in good]
        return pipe.run(items)
    return pipe.run(data["masked"])


def close(a, b) -> bool:
    """Equal, floats to 1e-5 (a padded row and the same row in another batch differ in the
    last bits)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, np.ndarray)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
        return abs(a - b) < 1e-5
    return a == b


# ============================================================================ without Ray
def test_a_predictor_answers_in_the_format_it_is_given(models):
    data = rows()
    data["text"][7] = "a lone \ud800 surrogate"  # a str can hold one; Arrow cannot
    predictor = Predictor("embed", models["embed"], threads=1)
    want = expected("embed", models["embed"])
    good = [i for i in range(len(TEXTS)) if i not in BAD and i != 7]
    threads = torch.get_num_threads()
    try:
        as_numpy = predictor({k: np.array(v, dtype=object) for k, v in data.items()})
        assert torch.get_num_threads() == 1  # set where the model was loaded
    finally:
        torch.set_num_threads(threads)
    assert as_numpy["embedding"].shape == (len(TEXTS), 64)
    assert as_numpy["embedding"].dtype == np.float32
    assert np.isnan(as_numpy["embedding"][[5, 7, 11, 23]]).all()
    assert list(as_numpy["id"]) == data["id"]  # the batch's own columns go through
    errors = list(as_numpy["error"])
    assert errors[5] == "text is null" and errors[11] == errors[23] == "text is empty"
    assert errors[7].startswith("text holds an unpaired surrogate U+D800 at character 7")
    assert [i for i, e in enumerate(errors) if e is None] == good
    ran = [j for j in range(len(TEXTS)) if j not in BAD]  # the rows of `want`
    want_good = [w for i, w in zip(ran, want, strict=True) if i != 7]
    assert close(list(as_numpy["embedding"][good]), want_good)

    frame = predictor(pd.DataFrame(data, dtype=object))  # (a str column: Arrow strings)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns)[-2:] == ["embedding", "error"]
    assert close([frame["embedding"][i] for i in good], want_good)
    assert frame["error"].tolist() == errors

    del data["text"][7], data["id"][7]  # Arrow: a table of valid UTF-8
    table = predictor(pa.table({k: v for k, v in data.items() if k in ("id", "text")}))
    assert isinstance(table, pa.Table) and table.column_names == [
        "id",
        "text",
        "embedding",
        "error",
    ]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 64)
    got = table.to_pylist()
    assert [r["embedding"] is None for r in got] == [r["error"] is not None for r in got]


def test_a_predictor_is_pickled_without_its_model(models):
    predictor = Predictor("classify", models["classify"], threads=None)
    predictor(pa.table({"text": ["a film"]}))  # loaded
    assert predictor._pipe is not None
    copy = pickle.loads(pickle.dumps(predictor))
    assert copy._pipe is None and len(pickle.dumps(predictor)) < 2000
    assert copy(pa.table({"text": ["a film"]})).column("label").to_pylist() in (
        ["neg"], ["neu"], ["pos"],
    )  # fmt: skip
    columns, errors = copy.rows([3, "a film", float("nan")])  # a number, a text, pandas' null
    assert errors == ["text is not a string (int)", None, "text is null"]
    assert columns["label"][0] is None and columns["label"][1] in ("neg", "neu", "pos")
    with pytest.raises(ValueError, match="unknown task 'translate'"):
        Predictor("translate")
    with pytest.raises(TypeError, match="the embed Predictor has no option top_k"):
        Predictor("embed", top_k=3)
    with pytest.raises(ValueError, match=r"the batch has no column 'text' \(its columns: body\)"):
        predictor(pa.table({"body": ["x"]}))


def test_the_actors_leave_a_cpu_to_ray_datas_reading_tasks():
    # 2 actors of 1 thread on 2 CPUs reserved both, and the file listing waited for ever
    assert reservation(2, 2, 1) == 0.5
    assert reservation(2, 1, 2) == 1.0  # `--ray local` on 2 CPUs: 2 threads, 1 CPU reserved
    assert reservation(64, 8, 4) == 4.0  # a cluster with room: the threads
    assert reservation(64, 8, 8) == 7.87  # 63 CPUs shared, in hundredths
    assert reservation(1, 1, 1) == 0.0


# ============================================================================ on Ray
@pytest.fixture(scope="module")
def ray():
    """One local Ray instance for the module, 2 CPUs as on CI's machines."""
    ray = pytest.importorskip("ray", reason="Ray Data needs ray: pip install 'bertlab[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # The actors unpickle this module's classes by value: they cannot import it.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


class Tasks:
    """Several Predictors over each batch in turn, in one actor (one model each): every task
    on Ray at the cost of one actor's start."""

    def __init__(self, specs: list[dict]):
        self.predictors = [Predictor(**spec) for spec in specs]

    def __call__(self, batch):
        for predictor in self.predictors:
            batch = predictor(batch)
        return batch


def test_every_task_on_ray_equals_the_single_process_pipeline(ray, models, tmp_path):
    """A dataset of two files through one actor that runs the five tasks (their columns
    prefixed), read back row for row against each pipeline in this process."""
    columns = {"embed": "text", "classify": "text", "tag": "text", "answer": "question",
               "fill-mask": "masked"}  # fmt: skip
    specs = [
        dict(task=task, model=str(models[task]), column=column, prefix=f"{task}.", threads=1)
        for task, column in columns.items()
    ]
    ds = ray.data.read_parquet(str(parquet(tmp_path / "in", files=2))).map_batches(
        Tasks, fn_constructor_kwargs={"specs": specs}, batch_format="pyarrow", batch_size=8,
        concurrency=1, num_cpus=1,
    )  # fmt: skip
    got = sorted(ds.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in got] == list(range(len(TEXTS)))
    good = [r for r in got if r["id"] not in BAD]
    for task in ("embed", "classify", "tag", "answer"):
        errors = [r["id"] for r in got if r[f"{task}.error"] is not None]
        assert errors == ([] if task == "answer" else sorted(BAD)), task
    assert close([np.asarray(r["embed.embedding"]) for r in good],
                 expected("embed", models["embed"]))  # fmt: skip
    assert close([{"label": r["classify.label"], "score": r["classify.score"]} for r in good],
                 expected("classify", models["classify"]))  # fmt: skip
    assert close([r["tag.entities"] for r in good], expected("tag", models["tag"]))
    answers = [{k: r[f"answer.{k}"] for k in ("answer", "start", "end", "score")} for r in good]
    assert close(answers, expected("answer", models["answer"]))
    assert close([r["fill-mask.candidates"][0] for r in got],
                 expected("fill-mask", models["fill-mask"]))  # fmt: skip


class Dying(Predictor):
    """Ends its own process in the middle of a batch, once in the whole job: the first actor
    to create the file ``marker`` dies (the class travels by value, with it)."""

    marker = ""

    def __call__(self, batch):
        try:
            Path(self.marker).touch(exist_ok=False)
        except FileExistsError:
            return super().__call__(batch)
        super().__call__(batch)  # the work done, then lost with the process
        os._exit(1)


def test_an_actor_that_dies_is_retried_and_no_row_is_lost_or_doubled(
    ray, models, tmp_path, monkeypatch
):
    marker = tmp_path / "died"
    monkeypatch.setattr(Dying, "marker", str(marker))
    source = parquet(tmp_path / "in", files=3)
    job = RayJob("embed", source, tmp_path / "out.parquet", model=models["embed"], actors=2,
                 threads=1, rows_per_batch=4, max_restarts=2)  # fmt: skip
    result = predict_ray(job, predictor=Dying)
    assert marker.exists()  # an actor did die
    table = pq.read_table(tmp_path / "out.parquet")
    assert result.rows == table.num_rows == len(TEXTS) and result.errors == len(BAD)
    assert table.column("id").to_pylist() == list(range(len(TEXTS)))  # once each, in order
    errors = table.column("error").to_pylist()
    vectors = table.column("embedding").to_pylist()
    vectors = [v for v, e in zip(vectors, errors, strict=True) if e is None]
    assert close([np.asarray(v) for v in vectors], expected("embed", models["embed"]))


def test_predict_ray_on_the_command_line(ray, models, tmp_path, capsys):
    source = parquet(tmp_path / "in")
    out = tmp_path / "labels.jsonl"
    argv = ["predict", "classify", str(source / "part-0.parquet"), "--out", str(out), "--ray",
            "local", "--model", str(models["classify"])]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed == (
        f"wrote 36 results to {out} (jsonl, 3 of them as error rows; 1 Ray actor of 2 threads)\n"
    )  # the default: the cluster's 2 CPUs for the one actor's threads, 1 reserved in Ray
    lines = [json.loads(x) for x in out.read_text("utf-8").splitlines()]
    assert [x["id"] for x in lines] == list(range(len(TEXTS)))
    assert {x["id"]: x["error"] for x in lines if x["error"]} == {
        5: "text is null",
        11: "text is empty",
        23: "text is empty",
    }
    want = expected("classify", models["classify"])
    assert close([{"label": x["label"], "score": x["score"]} for x in lines if not x["error"]],
                 want)  # fmt: skip
    # refused before any work, each in one line: OUT there, a column missing, --resume
    assert main(argv) == 2 and "labels.jsonl exists; --overwrite replaces it" in (
        capsys.readouterr().err
    )
    out.unlink()
    assert main([*argv, "--text-column", "body"]) == 2
    assert (
        "has no column 'body' (its columns: id, text, question, context, masked); name the "
        "texts with --text-column" in capsys.readouterr().err
    )
    assert main([*argv, "--resume"]) == 2
    assert "--resume goes with --file runs; a --ray run is one Ray job" in capsys.readouterr().err
    assert not out.exists()


def test_without_ray_the_command_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a"]}), source)
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["predict", "embed", str(source), "--out", str(tmp_path / "o.parquet"),
                 "--ray", "local"]) == 2  # fmt: skip
    assert capsys.readouterr().err == (
        "bertlab predict: error: ray is not installed, needed for --ray: pip install "
        "'bertlab[ray]'\n"
    )
    assert main(["predict", "embed", "a text", "--actors", "2"]) == 2
    assert "--actors goes with --ray only" in capsys.readouterr().err

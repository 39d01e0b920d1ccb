"""The command line: demo, summary, inspect embeddings (run in-process through main())."""

import re
import statistics

import pytest

from bertlab.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_demo_runs_the_bundled_checkpoint(capsys):
    code, out, _ = run(capsys, "demo", "--no-finetune")
    assert code == 0
    assert "Total params: 22,713,216" in out  # all-MiniLM-L6-v2's BertModel, counted by torch
    assert "last_hidden_state: (3, " in out and "384)" in out
    sims = [float(x) for x in re.findall(r"cosine similarity to .*: ([-0-9.]+)", out)]
    assert len(sims) == 2 and sims[0] > sims[1] + 0.3  # a paraphrase beats an unrelated sentence


def test_demo_journey_fine_tunes_and_classifies(capsys, tmp_path):
    """The README's main job, on a short budget: a fifth of an epoch on the bundled SST-2
    sample (32 steps), dev accuracy reported, then the given sentence classified."""
    code, out, _ = run(
        capsys,
        "demo",
        "--epochs",
        "0.2",
        "--output",
        str(tmp_path / "demo"),
        "--sentence",
        "a dull , lifeless and boring mess",
        "--seconds",  # all 32 steps however busy the machine: a budget would scale them down
        "3600",
    )
    assert code == 0
    accuracy = float(re.search(r"Dev accuracy: ([0-9.]+) on 1,000 held-out", out).group(1))
    assert accuracy > 0.6  # from the sentence-embedding checkpoint, 1,024 training sentences
    label = re.search(r"'a dull , lifeless and boring mess' -> (\w+) \(([0-9.]+)\)", out)
    assert label and label.group(1) in ("negative", "positive") and float(label.group(2)) >= 0.5
    assert (tmp_path / "demo" / "model" / "config.json").exists()


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


def test_tokenize_shows_tokens_ids_types_and_offsets(capsys):
    code, out, _ = run(capsys, "tokenize", "I am Sinan", "--pair", "She is Zoe")
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert ["3", "sin", "8254", "0", "2", "5:8", "Sin"] in rows
    assert ["4", "##an", "2319", "0", "2", "8:10", "an"] in rows
    assert ["6", "she", "2016", "1", "0", "0:3", "She"] in rows  # segment B: type 1


def test_train_vocab_command_writes_a_loadable_vocabulary(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The Cat sat on the Mat.\nA cat and a mat!\n" * 50, encoding="utf-8")
    code, out, _ = run(
        capsys,
        "train-vocab",
        str(corpus),
        "-o",
        str(tmp_path / "v"),
        "--vocab-size",
        "60",
        "--cased",
    )
    assert code == 0 and "cased" in out
    from bertlab import BertTokenizer

    tok = BertTokenizer.from_pretrained(tmp_path / "v")
    assert tok.do_lower_case is False and "Cat" in tok.tokenize("Cat")
    code, _, err = run(capsys, "train-vocab", str(tmp_path / "missing.txt"), "-o", str(tmp_path))
    assert code == 2 and "missing.txt" in err


def test_bench_tokenizer_reports_both_sides(capsys, tmp_path):
    out_file = tmp_path / "report.json"
    code, out, _ = run(
        capsys, "bench", "tokenizer", "--repeats", "1", "--out", str(out_file), "--model", "default"
    )
    assert code == 0 and "tokens/s" in out
    import json

    report = json.loads(out_file.read_text())["tokenizer"]
    assert report["tokens"] > 1000 and set(report["tokens_per_s"]) == {"bertlab", "transformers"}
    assert "bundled samples" in report["data"]  # no --data: the samples installed with bertlab


def test_bench_model_workloads_report_and_chart(capsys, tmp_path):
    """Two workloads on the tiny preset, one repeat: the report holds both sides for each,
    useful FLOPs are counted on real tokens only, and the chart is written."""
    out_file, chart = tmp_path / "r.json", tmp_path / "r.png"
    args = [
        "variable",
        "train",
        "--models",
        "tiny",
        "--dtypes",
        "float32",
        "--repeats",
        "1",
        "--draws",
        "2",
    ]
    code, out, _ = run(capsys, "bench", *args, "--out", str(out_file), "--plot", str(chart))
    assert code == 0 and "variable" in out and "train" in out
    import json

    from bertlab.bench.speed import model_flops

    report = json.loads(out_file.read_text())
    variable, train = report["results"]
    assert variable["real_tokens"] < variable["padded_tokens"]  # lengths 16..256, padded
    assert train["real_tokens"] == train["padded_tokens"] == 32 * 128
    from bertlab import BertConfig
    from bertlab.bench.speed import make_batch

    tiny = BertConfig.preset("tiny")
    # Drawn lengths: each run goes through two batches (seeds 0 and 1); a fixed workload, one.
    assert (variable["batches"], train["batches"]) == (2, 1)
    drawn = [make_batch(tiny, "variable", seed)["attention_mask"] for seed in (0, 1)]
    assert variable["real_tokens"] == sum(int(m.sum()) for m in drawn)
    assert variable["padded_tokens"] == sum(m.numel() for m in drawn)
    assert model_flops(tiny, [128] * 32, True) == 3 * model_flops(tiny, [128] * 32, False)
    for r in report["results"]:
        assert r["ratio"] > 0 and set(r["peak_memory_mb"]) == {"bertlab", "transformers"}
        assert 0 < r["useful_share_of_matmul"]["bertlab"]
        # The matrix-product rate is timed among the runs, as often as each side.
        assert set(r["seconds"]) == {"bertlab", "transformers"}
        # One repeat asked for; a run under bench.SHORT_RUN seconds gets ten.
        assert r["repeats"] in (1, 10)
        assert len(r["matmul_seconds"]) == len(r["seconds"]["bertlab"]) == r["repeats"]
        median = statistics.median(r["matmul_seconds"])
        assert r["matmul_tflops"] * 1e12 == pytest.approx(2 * 2048**3 / median)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from bertlab.bench.speed import markdown_table

    table = markdown_table(report).splitlines()
    assert len(table) == 2 + len(report["results"]) and "| tiny | variable | float32 |" in table[2]


def test_alternate_turns_the_order_every_round_and_lets_each_run_start_on_quiet_cores(
    monkeypatch,
):
    from bertlab.bench import speed

    calls = []
    monkeypatch.setattr(speed.time, "sleep", lambda s: calls.append(f"({s})"))
    runs = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = speed.alternate(runs, repeats=4, warmup=1)
    pause = f"({speed.SETTLE})"
    assert speed.SETTLE > 0
    # warm-up, then each round turned by one, every other round backwards, each timed run after
    # a pause: so each run follows a different one from round to round
    rounds = "abc" + "acb" + "cab" + "cba"
    assert "".join(calls) == "abc" + "".join(pause + name for name in rounds)
    assert {k: len(v) for k, v in times.items()} == {"a": 4, "b": 4, "c": 4}


def test_bench_unknown_workload_is_named(capsys):
    code, _, err = run(capsys, "bench", "warp-speed")
    assert code == 2 and "warp-speed" in err


@pytest.mark.parametrize(
    "command, option",
    [
        ("tokenizer", "--repeats"),
        ("speed", "--draws"),
        ("speed", "--threads"),
        ("int8", "--repeats"),
        ("int8", "--threads"),
    ],
)
def test_bench_counts_below_one_are_refused_before_any_run(capsys, tmp_path, command, option):
    out_file = tmp_path / "r.json"
    code, out, err = run(capsys, "bench", command, option, "0", "--out", str(out_file))
    assert code == 2 and f"{option[2:]} must be at least 1; got 0" in err
    assert "tokens/s" not in out and not out_file.exists()


def test_bench_int8_where_the_cpu_has_no_int8_kernel(capsys, tmp_path, monkeypatch):
    """A CPU without an int8 kernel (simulated: an x86 CPU without AVX2; Arm is refused the
    same way): `bench int8` is refused before any work, naming what the CPU lacks, and the
    suite reports int8 as not measured, for that reason, and runs the rest."""
    import dataclasses
    import json

    from bertlab.nn import cpu

    sse = dataclasses.replace(cpu.features(), arch="x86_64", flags=frozenset({"sse4_1"}))
    monkeypatch.setattr(cpu, "_CURRENT", [cpu.policy(sse)])
    out_file = tmp_path / "r.json"
    code, out, err = run(capsys, "bench", "int8", "--out", str(out_file))
    assert code == 2 and "int8 does not run on this CPU: the fbgemm-u8 kernel needs AVX2" in err
    assert not out and not out_file.exists()
    code, out, _ = run(
        capsys, "bench", "speed", "tokenizer", "int8", "--repeats", "1", "--out", str(out_file)
    )
    assert code == 0 and "int8: not measured, it does not run on this CPU: the fbgemm" in out
    report = json.loads(out_file.read_text())
    assert report["tokenizer"]["tokens"] > 1000  # the rest of the suite ran
    assert report["int8"]["unavailable"] == cpu.current().int8_why


def test_prepare_command_writes_a_corpus_the_dataset_reads(capsys, tmp_path):
    from pathlib import Path

    from bertlab.data.corpus import PretrainingCorpus

    sample = Path(__file__).parent / "fixtures" / "wikitext2_sample.tokens"
    code, out, _ = run(capsys, "prepare", str(sample), "-o", str(tmp_path / "c"), "--seed", "1")
    assert code == 0 and "examples" in out
    corpus = PretrainingCorpus(tmp_path / "c")
    assert len(corpus) > 10 and int(corpus[0]["input_ids"][0]) == 101  # [CLS] first
    code, _, err = run(capsys, "prepare", str(sample), "-o", str(tmp_path / "c"))
    assert code == 2 and "overwrite" in err  # an existing corpus is not overwritten silently


def test_bench_memory_reports_what_gradient_checkpointing_saves(capsys, tmp_path):
    """The tiny preset, one repeat: both sides, with and without checkpointing; checkpointing
    keeps less for the backward pass and leaves the gradients as they were."""
    import json

    out_file = tmp_path / "memory.json"
    code, out, _ = run(
        capsys,
        "bench",
        "memory",
        "--model",
        "tiny",
        "--batch-size",
        "4",
        "--seq-len",
        "64",
        "--repeats",
        "1",
        "--out",
        str(out_file),
    )
    assert code == 0 and "activations MB" in out
    rows = json.loads(out_file.read_text())["results"]
    assert [(r["side"], r["checkpointing"]) for r in rows] == [
        ("bertlab", False),
        ("bertlab", True),
        ("transformers", False),
        ("transformers", True),
    ]
    for off, on in (rows[0:2], rows[2:4]):
        assert on["activation_mb"] < off["activation_mb"]
        assert on["max_grad_difference"] < 1e-6 and on["peak_mb"] > 0
    code, _, err = run(capsys, "bench", "memory", "--model", "tiny", "--seq-len", "600")
    assert code == 2 and "seq_len 600 is longer than the model's max_position_embeddings" in err
    code, _, err = run(capsys, "bench", "memory", "--batch-size", "0")
    assert code == 2 and "batch_size must be at least 1; got 0" in err

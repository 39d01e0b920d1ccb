"""`bertlab bench precision`: a fine-tuned model scored in each precision by the task's own
evaluation. Its float32 row is the fine-tuning run's own dev report, the other rows are the
same scoring of the converted model, and the refusals come before any work."""

from __future__ import annotations

import json
import shutil

import pytest

from bertlab.bench.precision import bench_precision, format_precision
from bertlab.cli.main import main
from bertlab.nn import cpu
from bertlab.nn.precision import bf16_supported, int8_supported
from bertlab.train.finetune import FinetuneConfig, finetune


@pytest.fixture(scope="module")
def tuned(sst2, module_tmp):
    """The bundled model fine-tuned for 4 steps on the SST-2 sample: (config, its results)."""
    out = module_tmp.mktemp("tuned")
    config = FinetuneConfig(
        task="classify",
        train=str(sst2 / "train.tsv"),
        dev=str(sst2 / "dev.tsv"),
        epochs=1,
        batch_size=16,
        max_length=48,
        max_train_examples=64,
        lr=1e-4,
    )
    results = finetune(config, out, progress=False)
    scored = FinetuneConfig(
        task="classify", train=config.train, dev=config.dev, model=str(out / "model"), max_length=48
    )
    return scored, results


def test_float32_is_the_fine_tuning_runs_own_dev_report(tuned):
    config, results = tuned
    r = bench_precision(config, ("float32",))
    got = r["precisions"]["float32"]
    for metric, value in results["dev"].items():
        assert got[metric] == pytest.approx(value, abs=1e-12), metric
    assert r["dev_examples"] == 40 and "differences" in r and r["differences"] == {}


@pytest.fixture(scope="module")
def scored(tuned):
    """Every precision at the default tolerance (int8's calibration and trials take about 9 s
    on a 2-core CPU: two tests read the one run)."""
    return bench_precision(tuned[0])


def test_each_precision_is_scored_or_refused_by_name(scored):
    r = scored
    rows = r["precisions"]
    assert list(rows) == ["float32", "bfloat16", "int8"]
    for name, why in (("bfloat16", bf16_supported()), ("int8", int8_supported())):
        if why is None:
            assert 0 <= rows[name]["accuracy"] <= 1 and rows[name]["seconds"] > 0
            # The differences are each row against float32's, metric by metric.
            for metric, d in r["differences"][name].items():
                assert d == pytest.approx(rows[name][metric] - rows["float32"][metric])
        else:
            assert rows[name] == {"unavailable": why}
    if int8_supported() is None:
        report = r["int8_report"]
        # 6 layers of 6 linears each and the classifier: every one int8 or kept, by name.
        assert report["int8_layers"] + len(report["kept_float32"]) == 6 * 6 + 2
        assert r["calibration_features"] == 128  # of the 160 training rows
    text = format_precision(r)
    assert "float32" in text and "accuracy" in text


def test_a_tighter_tolerance_keeps_more_layers_in_float32(tuned, scored):
    if int8_supported() is not None:
        pytest.skip(f"int8 is not available here: {int8_supported()}")
    config, _ = tuned
    default = scored["int8_report"]
    tight = bench_precision(config, ("int8",), tolerance=1e-6)["int8_report"]
    assert default["int8_layers"] > 0 and tight["int8_layers"] == 0
    assert set(tight["kept_float32"]) > set(default["kept_float32"])


def test_a_model_whose_labels_are_not_the_training_files_is_refused(tuned, tmp_path):
    config, _ = tuned
    folder = tmp_path / "model"
    shutil.copytree(config.model, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["id2label"] = {"0": cfg["id2label"]["1"], "1": cfg["id2label"]["0"]}
    cfg["label2id"] = {v: int(k) for k, v in cfg["id2label"].items()}
    (folder / "config.json").write_text(json.dumps(cfg))
    bad = FinetuneConfig(task="classify", train=config.train, dev=config.dev, model=str(folder))
    with pytest.raises(ValueError, match="labels .* are not the training file's"):
        bench_precision(bad)


def test_bad_requests_are_refused_before_any_work(tuned, capsys):
    config, _ = tuned
    with pytest.raises(ValueError, match="precisions must be among"):
        bench_precision(config, ("float16",))
    with pytest.raises(ValueError, match="needs a dev file"):
        bench_precision(FinetuneConfig(task="classify", train=config.train, model=config.model))
    assert main(["bench", "precision", "classify", "--train", config.train]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["bench", "precision", "sort", "--model", config.model]) == 2
    assert "one of classify, tag, qa" in capsys.readouterr().err
    no_model = ["bench", "precision", "classify", "--model", "/nonexistent"]
    assert main([*no_model, "--train", config.train, "--dev", config.dev]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_the_command_writes_its_report(tuned, tmp_path, capsys):
    config, _ = tuned
    out = tmp_path / "r.json"
    args = ["bench", "precision", "classify", "--model", config.model, "--train", config.train]
    more = ["--dev", config.dev, "--max-length", "48", "--precisions", "float32"]
    code = main([*args, *more, "--out", str(out)])  # (every precision: the tests above)
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["precision"]["precisions"]) == ["float32"]
    assert report["machine"]["cpu"]
    assert report["cpu"]["class"] == cpu.current().cpu_class  # and the kernels chosen on it
    assert report["cpu"]["int8_kernel"] == cpu.current().int8_kernel
    f32 = report["precision"]["precisions"]["float32"]["accuracy"]
    assert f"{100 * f32:.2f}" in capsys.readouterr().out

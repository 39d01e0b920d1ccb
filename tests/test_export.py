"""Export and compilation: torch.export, ONNX (run in onnxruntime) and torch.compile, for every
head, with the default kernel ("packed") and "sdpa"; the ``bertlab export onnx`` command and the
inputs it refuses.

Under tracing a packed model runs the padded "sdpa" computation (packing.py's docstring): one
graph with dynamic batch and sequence length, the same numbers at real tokens. So each check
traces on one padded batch and runs another of a different shape, comparing with eager at the
real tokens (padding positions hold what a layout leaves there: zeros packed, values padded,
except QA's lowest score, the same everywhere). Tiny random models keep this fast on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree

import bertlab
from bertlab.cli.export import EXPORT_HEADS, add_parsers
from bertlab.explore.summary import HEADS
from bertlab.io import export as ex
from bertlab.nn.outputs import MaskedLMOutput, QuestionAnsweringModelOutput

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (bertlab[export])")
pytest.importorskip("onnxscript", reason="onnxscript is not installed (bertlab[export])")

ATOL = 1e-4
SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=40,
    num_labels=3,
)
KERNELS = ["packed", "sdpa"]


def tiny(head: str, kernel: str = "packed", seed: int = 0) -> bertlab.BertPreTrainedModel:
    torch.manual_seed(seed)
    config = bertlab.BertConfig(**SIZES, attn_implementation=kernel)
    model = HEADS[head](config).eval()
    with torch.no_grad():  # LayerNorms and biases off their 1/0 init, so a mix-up shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batches(model) -> tuple[dict, dict]:
    """One padded batch to trace, one of another shape (more rows, longer) to run."""
    mc = ex.is_multiple_choice(model)
    traced = ex.example_inputs(model.config, 2, 8, 2 if mc else None, seed=0)
    other = ex.example_inputs(model.config, 3, 13, 3 if mc else None, seed=1)
    assert (other["attention_mask"] == 0).any() and (traced["attention_mask"] == 0).any()
    return traced, other


def eager(model, inputs: dict) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    with torch.no_grad():
        out = model(**inputs)
    names = ex.output_names(out)
    return names, tuple(getattr(out, n) for n in names)


# ================================================================================ pytrees
def test_outputs_are_pytrees_and_still_index_like_transformers():
    out = QuestionAnsweringModelOutput(None, torch.ones(2, 3), torch.zeros(2, 3))
    leaves, spec = pytree.tree_flatten(out)
    assert [t is None for t in leaves] == [True, False, False, True, True]  # every field, in order
    back = pytree.tree_unflatten(leaves, spec)
    assert type(back) is QuestionAnsweringModelOutput and back.loss is None
    assert torch.equal(back.start_logits, out.start_logits)
    assert torch.equal(out[0], out.start_logits) and torch.equal(out["end_logits"], out[1])
    doubled = pytree.tree_map(
        lambda t: None if t is None else t * 2, MaskedLMOutput(logits=torch.ones(1))
    )
    assert type(doubled) is MaskedLMOutput and doubled.logits.item() == 2.0


# ================================================================================ torch.export
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("head", list(HEADS))
def test_torch_export_runs_another_shape_like_eager(head, kernel):
    model = tiny(head, kernel)
    traced, other = batches(model)
    shapes = ex.dynamic_shapes(ex.is_multiple_choice(model), model.config.max_position_embeddings)
    program = torch.export.export(model, (), traced, dynamic_shapes=shapes)
    got = program.module()(**other)
    assert type(got) is type(model(**traced))  # the output class survives (a pytree)
    names, want = eager(model, other)
    got_t = tuple(getattr(got, n) for n in names)
    diff = ex.compare(got_t, want, names, other["attention_mask"])
    assert diff <= ATOL, f"{head}/{kernel}: {diff:.3g}"


def test_exported_packed_and_sdpa_graphs_are_the_same_computation():
    """A packed model under export runs the padded sdpa path: the two programs agree exactly."""
    traced, other = batches(tiny("base"))
    progs = []
    for kernel in KERNELS:
        model = tiny("base", kernel)
        shapes = ex.dynamic_shapes(False, model.config.max_position_embeddings)
        progs.append(torch.export.export(model, (), traced, dynamic_shapes=shapes).module())
    a, b = (p(**other).last_hidden_state for p in progs)
    assert torch.equal(a, b)


# ================================================================================ ONNX
# Every head with the default kernel; "sdpa" for the backbone only, to save CI time (each
# export costs 5-7 s on a 2-core CPU): under export the two kernels are one computation
# (test_exported_packed_and_sdpa_graphs_...), and the heads are the same layers on either.
ONNX_CASES = [(head, "packed") for head in HEADS] + [("base", "sdpa")]


@pytest.mark.parametrize("head, kernel", ONNX_CASES)
def test_onnx_runs_in_onnxruntime_on_another_shape_like_eager(head, kernel, tmp_path):
    model = tiny(head, kernel)
    traced, other = batches(model)
    path = tmp_path / "model.onnx"
    names = ex.write_onnx(model, path, traced)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(ex.INPUTS)
    assert tuple(o.name for o in session.get_outputs()) == names
    got = session.run(None, {k: v.numpy() for k, v in other.items()})
    want_names, want = eager(model, other)
    assert want_names == names
    diff = ex.compare(tuple(got), want, names, other["attention_mask"])
    assert diff <= ATOL, f"{head}/{kernel}: {diff:.3g}"
    assert ex.check_onnx(path, model, other) == diff  # the export's own check agrees


# ================================================================================ torch.compile
@pytest.mark.parametrize("kernel", KERNELS)
def test_compile_fullgraph_does_not_recompile_per_batch(kernel):
    """50 batches of different sizes and lengths through torch.compile(fullgraph=True). Dynamo
    compiles the first shape, then one graph with dynamic batch and length, and (its 0/1
    specialisation) one for a batch of a single row: after the first three batches, whatever
    their shapes, it never compiles again. Results equal eager at real tokens."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    model = tiny("question-answering", kernel)
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    g = torch.Generator().manual_seed(3)
    shapes = [(3, 9), (2, 17), (1, 5)]  # a first shape, another, a single row
    shapes += [
        (int(torch.randint(1, 6, (), generator=g)), int(torch.randint(2, 40, (), generator=g)))
        for _ in range(47)
    ]
    counts = []
    for i, (b, t) in enumerate(shapes):
        inputs = ex.example_inputs(model.config, b, t, seed=i)
        with torch.no_grad():
            got = compiled(**inputs)
        counts.append(counter.frame_count)
        if i % 10 == 0 or b == 1:
            names, want = eager(model, inputs)
            got_t = tuple(getattr(got, n) for n in names)
            assert ex.compare(got_t, want, names, inputs["attention_mask"]) <= ATOL
    assert len({t for _, t in shapes}) > 20  # the lengths really vary
    assert counts[2] <= 3 and counts[-1] == counts[2], f"compilations after each batch: {counts}"
    torch._dynamo.reset()


def test_bad_inputs_still_raise_in_eager_after_tracing():
    """Tracing skips the value checks; eager calls still refuse bad values, with the message."""
    model = tiny("base")
    traced, _ = batches(model)
    shapes = ex.dynamic_shapes(False, model.config.max_position_embeddings)
    torch.export.export(model, (), traced, dynamic_shapes=shapes)
    bad = dict(traced, input_ids=traced["input_ids"].clone())
    bad["input_ids"][1, 2] = 99
    with pytest.raises(ValueError, match=r"token id 99 at position \(1, 2\) is outside"):
        model(**bad)
    empty = dict(traced, attention_mask=traced["attention_mask"].clone())
    empty["attention_mask"][1] = 0
    with pytest.raises(ValueError, match="row 1 of attention_mask has no tokens"):
        model(**empty)


# ================================================================================ the command
def cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bertlab")
    sub = p.add_subparsers(dest="command", required=True)
    add_parsers(sub)
    args = p.parse_args(argv)
    return args.func(args)


def tiny_folder(tmp_path: Path, head: str = "sequence-classification") -> Path:
    folder = tmp_path / "tiny"
    tiny(head).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(f"tok{i}" for i in range(99)) + "\n")
    return folder


def test_the_command_heads_are_the_summary_heads():
    assert list(EXPORT_HEADS) == list(HEADS)


def test_cli_exports_the_bundled_checkpoint_and_reports_its_check(tmp_path, capsys):
    out = tmp_path / "onnx"
    assert cli(["export", "onnx", "default", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exported with input_ids (2, 8), run on (3, 13) with padding" in printed
    assert "largest difference from eager at real tokens" in printed
    names = {p.name for p in out.iterdir()}
    assert {"model.onnx", "config.json", "vocab.txt", "tokenizer.json"} <= names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary left"
    # The file stands alone: the real model's outputs on a batch of its own.
    source = bertlab.bundled_model_dir()
    model = bertlab.BertModel.from_pretrained(source)
    inputs = ex.example_inputs(model.config, 4, 21, seed=9)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    names_, want = eager(model, inputs)
    assert ex.compare(tuple(got), want, names_, inputs["attention_mask"]) <= ATOL
    assert json.loads((out / "config.json").read_text())["model_type"] == "bert"


def test_cli_head_opset_and_overwrite(tmp_path, capsys):
    folder = tiny_folder(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    argv = ["export", "onnx", str(folder), "-o", str(out), "--head", "question-answering"]
    with pytest.raises(FileExistsError, match="already holds files; pass --overwrite"):
        cli(argv)
    assert [p.name for p in out.iterdir()] == ["old.txt"]  # untouched
    assert cli([*argv, "--overwrite", "--opset", "17"]) == 0
    assert "head question-answering, opset 17, outputs start_logits, end_logits" in (
        capsys.readouterr().out
    )
    assert {p.name for p in out.iterdir()} == {"model.onnx", "config.json", "vocab.txt"}
    import onnx

    assert onnx.load(str(out / "model.onnx")).opset_import[0].version == 17


def test_export_refuses_a_folder_without_weights_or_of_another_model(tmp_path):
    folder = tiny_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights: expected one of"):
        ex.export_onnx(folder, tmp_path / "a")
    other = tmp_path / "roberta"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "roberta"}))
    (other / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="holds a 'roberta' model .* exports BERT models only"):
        ex.export_onnx(other, tmp_path / "b")
    with pytest.raises(ValueError, match="unknown head 'pooler'"):
        ex.export_onnx(tiny_folder(tmp_path / "c"), tmp_path / "c_out", head="pooler")
    with pytest.raises(FileNotFoundError, match="no model folder"):
        ex.export_onnx(tmp_path / "nowhere", tmp_path / "d")
    model_dir = tiny_folder(tmp_path / "e")
    for into in (model_dir, model_dir.parent):
        with pytest.raises(ValueError, match="holds the model folder"):
            ex.export_onnx(model_dir, into, overwrite=True)
    assert (model_dir / "model.safetensors").is_file()
    assert not any((tmp_path / n).exists() for n in ("a", "b", "c_out", "d"))


def test_a_graph_that_differs_is_a_failure_and_leaves_nothing(tmp_path, monkeypatch):
    folder = tiny_folder(tmp_path)
    real_run = ort.InferenceSession.run

    def off_by_a_little(self, names, feed):
        return [o + 0.01 for o in real_run(self, names, feed)]

    monkeypatch.setattr(ort.InferenceSession, "run", off_by_a_little)
    out = tmp_path / "out"
    with pytest.raises(ex.ExportCheckError, match=r"differ from eager by 0\.01 .* tolerance"):
        ex.export_onnx(folder, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no output, no temporary


def test_a_graph_onnxruntime_cannot_run_is_a_failure_and_leaves_nothing(tmp_path, monkeypatch):
    folder = tiny_folder(tmp_path)

    def broken(model, path, inputs, opset=ex.DEFAULT_OPSET):
        path.write_bytes(b"not an onnx graph")
        return ("logits",)

    monkeypatch.setattr(ex, "write_onnx", broken)
    with pytest.raises(ex.ExportCheckError, match="onnxruntime could not run model.onnx"):
        ex.export_onnx(folder, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_missing_onnx_packages_are_named_with_the_install_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now raises ImportError
    with pytest.raises(ModuleNotFoundError, match=r"needs onnxruntime: pip install 'bertlab\["):
        ex._require_onnx()
    folder = tiny_folder(tmp_path)
    assert cli(["export", "onnx", str(folder), "-o", str(tmp_path / "out")]) == 2
    assert "bertlab export: error: ONNX export needs onnxruntime" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_library_never_imports_onnx_at_import_time():
    code = (
        "import sys, bertlab, bertlab.io.export, bertlab.cli.export, bertlab.nn.products\n"
        "bad = [m for m in ('onnx', 'onnxruntime', 'onnxscript', 'transformers') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_and_running_on_the_cpu_never_loads_torch_dynamo():
    """torch._dynamo (about half of a bare ``import bertlab``'s time when it was imported with
    it) loads only for what needs it: export, compile, and the CUDA variable-length kernel."""
    code = (
        "import sys, torch, bertlab, bertlab.cli, bertlab.serve\n"
        "from bertlab import BertConfig, BertModel, pipeline\n"
        "for attn in ('packed', 'sdpa', 'eager'):\n"
        "    cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1,\n"
        "                     num_attention_heads=4, intermediate_size=64,\n"
        "                     attn_implementation=attn)\n"
        "    with torch.no_grad():\n"
        "        BertModel(cfg).eval()(torch.tensor([[1, 2, 3], [4, 5, 0]]),\n"
        "                              torch.tensor([[1, 1, 1], [1, 1, 0]]))\n"
        "pipeline('embed')(['a first text', 'and a second, longer one'])\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""`bertlab serve --dtype int8 [--calibration FILE] [--compile]`: the served int8 model is
``quantize_int8`` calibrated on the given texts (its vectors equal the int8 pipeline's and stay
close to float32), a compiled server answers what the uncompiled one answers while running
mixed batches as groups of similar length, and every wrong setting is refused by name before
a model loads."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("starlette", reason="the serve extra (starlette, uvicorn) runs the server")
pytest.importorskip("httpx", reason="Starlette's test client needs httpx (a test extra)")
from helpers import needs_int8, skylake_x  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import bertlab  # noqa: E402
from bertlab.data import sample_sentences  # noqa: E402
from bertlab.files import resolve_model_dir  # noqa: E402
from bertlab.nn import cpu  # noqa: E402
from bertlab.nn.compiled import PADDING_LIMIT, Compiled  # noqa: E402
from bertlab.nn.precision import quantize_int8, text_batches  # noqa: E402
from bertlab.pipelines import pipeline  # noqa: E402
from bertlab.serve import ServeConfig, Server  # noqa: E402
from bertlab.serve import engine as engine_module  # noqa: E402
from bertlab.serve.engine import Row, ServedModel, calibration_texts  # noqa: E402

DEFAULT = resolve_model_dir("default")
TEXTS = ["Ann lives in Paris.", "A warm, funny film.", "Stocks fell sharply on Monday in Tokyo"]
needs_compiler = pytest.mark.skipif(
    Compiled.available() is not None, reason=f"cannot compile here: {Compiled.available()}"
)


@pytest.fixture
def compiled_on_any_cpu(monkeypatch):
    """Compiled runs its program in float32 and int8 whatever this CPU's class: the compiled
    server's answers are under test here; where Compiled uses a program is tests/test_cpu.py's."""
    here = cpu.current()
    everything = frozenset(("float32", "int8"))
    monkeypatch.setattr(
        cpu, "_CURRENT", [replace(here, compiled=everything, not_compiled={}, compiled_tokens={})]
    )


@pytest.fixture(scope="module")
def calibration_file(module_tmp):
    path = module_tmp.mktemp("calibration") / "texts.txt"
    texts = sample_sentences(40, "sst2_train.tsv")
    path.write_text("\n\n".join(texts) + "\n", encoding="utf-8")  # blank lines are skipped
    return path, texts


@needs_int8
def test_int8_serving_gives_the_int8_pipelines_vectors_calibrated_on_the_file(calibration_file):
    path, texts = calibration_file
    server = Server(ServeConfig(models=[("minilm", DEFAULT)], dtype="int8", calibration=path))
    tokenizer = bertlab.BertTokenizer.from_pretrained(DEFAULT)
    model = bertlab.BertModel.from_pretrained(DEFAULT).eval()
    int8 = quantize_int8(model, calibrate=text_batches(tokenizer, texts))
    ref = pipeline("embed", int8, tokenizer=tokenizer)(TEXTS)
    float32 = pipeline("embed")(TEXTS)
    with TestClient(server.app(), raise_server_exceptions=False) as client:
        got = torch.tensor(client.post("/embed", json={"inputs": TEXTS}).json())
        info = client.get("/info").json()["models"][0]
    assert (got - ref).abs().max() < 1e-5
    # int8, not float32 under another name, and still close to float32
    assert (got - float32).abs().max() > 1e-4
    assert float(torch.nn.functional.cosine_similarity(got, float32).min()) > 0.99
    assert info["dtype"] == "int8" and info["compiled"] is False
    assert info["int8"]["calibration"] == f"40 texts of {path}"
    assert info["int8"]["int8_layers"] == len(int8.int8_report["int8"]) > 0
    assert info["int8"]["kept_float32"] == int8.int8_report["kept_float32"]


@needs_int8
def test_int8_without_a_file_calibrates_on_the_bundled_sample():
    texts, source = calibration_texts(None)
    assert len(texts) == 128 and source == "128 bundled SST-2 sentences"
    model = ServedModel("m", DEFAULT, "int8")
    assert model.int8["calibration"] == source


@needs_int8
@needs_compiler
@pytest.mark.usefixtures("compiled_on_any_cpu")
def test_a_compiled_int8_server_answers_as_the_uncompiled_one_in_length_groups(
    calibration_file, tmp_path
):
    _, texts = calibration_file
    # the bundled model's first two layers: real weights (so int8 meets its quality bar) that
    # compile in a third of the whole model's time
    two = bertlab.BertModel.from_pretrained(DEFAULT).eval()
    two.encoder.layer = two.encoder.layer[:2]
    two.config.num_hidden_layers = 2
    two.save_pretrained(tmp_path)
    bertlab.BertTokenizer.from_pretrained(DEFAULT).save_pretrained(tmp_path)
    calibration = calibration_texts(calibration_file[0])
    plain = ServedModel("m", tmp_path, "int8", calibration)
    config = ServeConfig(models=[("minilm", tmp_path)], dtype="int8", compile=True,
                         calibration=calibration_file[0], max_client_batch_size=64)  # fmt: skip
    server = Server(config)
    compiled = server.models["minilm"]  # compiled at start-up, before the first request
    assert compiled.compile_seconds > 0 and compiled.info()["compiled"] is True
    rows = [Row(ids, [0] * len(ids), "mean") for ids in plain.tokenizer(texts)["input_ids"]]
    parts = compiled.prepare(rows)  # 40 sentences of mixed lengths: groups of similar length
    assert 1 < len(parts) <= len(rows) // engine_module.GROUP_ROWS
    assert sorted(i for index, _ in parts for i in index) == list(range(len(rows)))
    for index, arrays in parts:
        mask = arrays["attention_mask"]
        assert len(index) <= engine_module.COMPILED_ROWS
        assert 1 - mask.mean() <= PADDING_LIMIT["int8"]
    assert plain.prepare(rows)[0][0] == list(range(len(rows)))  # one packed batch
    want = torch.stack(plain.forward(rows))
    # through the server: the batcher hands the runner the groups it prepared
    before = dict(compiled.compiled.calls)
    with TestClient(server.app(), raise_server_exceptions=False) as client:
        served = torch.tensor(client.post("/embed", json={"inputs": texts}).json())
        assert client.get("/info").json()["models"][0]["compiled"] is True
    assert compiled.compiled.calls["compiled"] - before["compiled"] == len(parts)
    assert compiled.compiled.calls["eager"] == before["eager"]
    unit = torch.nn.functional.normalize(want, dim=-1)
    cos = torch.nn.functional.cosine_similarity(served, unit)  # rounding ties may fall otherwise
    assert float(cos.min()) > 0.999, float(cos.min())
    float32 = pipeline("embed", str(tmp_path))(texts)  # the int8 quality bar of bench runtimes
    to_float = torch.nn.functional.cosine_similarity(served, float32)
    assert float(to_float.mean()) >= 0.995 and float(to_float.min()) >= 0.98
    # three mixed rows are too few to group: they run as one packed batch
    assert len(compiled.prepare([rows[0], rows[5], rows[9]])) == 1


@needs_compiler
@pytest.mark.usefixtures("compiled_on_any_cpu")
def test_a_compiled_float32_server_runs_single_texts_compiled_and_mixed_batches_packed(tmp_path):
    # a small model of the bundled vocabulary: it compiles in a third of the bundled one's time
    cfg = bertlab.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=128, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    bertlab.BertModel(cfg).eval().save_pretrained(tmp_path)
    bertlab.BertTokenizer.from_pretrained(DEFAULT).save_pretrained(tmp_path)
    model = ServedModel("m", tmp_path, "float32", compile=True)
    texts = [*TEXTS, "Yes."]  # 9, 8, 9 and 4 tokens: more padding than float32's limit
    ids = model.tokenizer(texts)["input_ids"]
    rows = [Row(i, [0] * len(i), "mean") for i in ids]
    calls = dict(model.compiled.calls)
    one = model.forward(rows[:1])[0]
    assert model.compiled.calls["compiled"] == calls["compiled"] + 1
    parts = model.prepare(rows)  # float32 never cuts a mixed batch into groups
    assert len(parts) == 1 and parts[0][1]["input_ids"].shape[1] == max(map(len, ids)) + 1
    ref = pipeline("embed", str(tmp_path))(texts, normalize=False)
    assert (one - ref[0]).abs().max() < 1e-5
    assert (torch.stack(model.forward(rows, parts)) - ref).abs().max() < 1e-5
    assert model.compiled.calls["eager"] == calls["eager"] + 1  # the mixed batch, packed


# ============================================================================ refused by name
def test_wrong_int8_and_compile_settings_are_refused_before_any_model_loads(tmp_path):
    with pytest.raises(
        ValueError, match="calibration file is read for int8 only; dtype is float32"
    ):
        ServeConfig(models=[("m", DEFAULT)], calibration=tmp_path / "x.txt")
    with pytest.raises(ValueError, match="compile serves float32 and int8; in bfloat16"):
        ServeConfig(models=[("m", DEFAULT)], dtype="bfloat16", compile=True)
    with pytest.raises(TypeError, match="compile must be True or False, got 'yes'"):
        ServeConfig(models=[("m", DEFAULT)], compile="yes")
    with pytest.raises(
        ValueError, match="dtype must be one of float32, bfloat16, int8, got 'int4'"
    ):
        ServeConfig(models=[("m", DEFAULT)], dtype="int4")


@needs_int8  # (elsewhere the precision itself is refused first: the test below)
def test_a_calibration_file_that_cannot_serve_is_refused_before_any_model_loads(tmp_path):
    missing = tmp_path / "missing.txt"
    with pytest.raises(ValueError, match=f"calibration file '{missing}': No such file"):
        Server(ServeConfig(models=[("m", DEFAULT)], dtype="int8", calibration=missing))
    short = tmp_path / "short.txt"
    short.write_text("one\n\ntwo\nthree\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match="has 3 non-empty lines; int8 calibration needs at least 8"
    ):
        Server(ServeConfig(models=[("m", DEFAULT)], dtype="int8", calibration=short))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe" * 40)
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        Server(ServeConfig(models=[("m", DEFAULT)], dtype="int8", calibration=binary))


def test_int8_on_a_cpu_without_an_int8_kernel_is_refused_naming_what_it_lacks(monkeypatch):
    # an x86 CPU without AVX2, as bertlab.nn.cpu sees it (Arm is refused the same way)
    sse = replace(cpu.features(), arch="x86_64", flags=frozenset({"sse4_1"}))
    monkeypatch.setattr(cpu, "_CURRENT", [cpu.policy(sse)])
    loaded = []
    monkeypatch.setattr(engine_module, "ServedModel", lambda *a, **k: loaded.append(a))
    with pytest.raises(ValueError, match="dtype int8 cannot run here: .*needs AVX2"):
        Server(ServeConfig(models=[("m", DEFAULT)], dtype="int8"))
    assert loaded == []


def test_compile_without_a_compiler_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(Compiled, "available", staticmethod(lambda: "no C++ compiler here"))
    loaded = []
    monkeypatch.setattr(engine_module, "ServedModel", lambda *a, **k: loaded.append(a))
    with pytest.raises(RuntimeError, match="--compile: no C\\+\\+ compiler here"):
        Server(ServeConfig(models=[("m", DEFAULT)], compile=True))
    assert loaded == []


def test_the_command_line_refuses_a_calibration_file_without_int8(tmp_path, capsys):
    from bertlab.cli.main import main

    texts = tmp_path / "t.txt"
    texts.write_text("a\n" * 10, encoding="utf-8")
    assert main(["serve", "default", "--port", "0", "--calibration", str(texts)]) == 2
    assert "calibration file is read for int8 only" in capsys.readouterr().err


def test_the_readme_int8_command_is_one_the_server_takes(monkeypatch):
    """The README's int8 line ("Precision and compilation"), parsed as the command line parses
    it, reaches the server with int8, compile and the bundled calibration (the server itself is
    not started here: the tests above run that configuration)."""
    import shlex
    from pathlib import Path

    from bertlab.cli import serve as serve_cli
    from bertlab.cli.main import build_parser

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("**Precision and compilation.**", 1)[1]
    line = section.split("```bash\n", 1)[1].split("```", 1)[0].strip()
    argv = shlex.split(line.split("#", 1)[0])
    assert argv[0] == "bertlab"
    taken = []
    monkeypatch.setattr("bertlab.serve.run", lambda config, **kw: taken.append((config, kw)))
    # the line is checked on any CPU: as one with an int8 kernel, which the server would use
    monkeypatch.setattr(engine_module, "int8_supported", lambda: None)
    monkeypatch.setattr(serve_cli.socket, "socket", _FreePort)
    args = build_parser().parse_args(argv[1:])
    assert args.func(args) == 0
    config, kw = taken[0]
    assert (config.dtype, config.compile, config.calibration) == ("int8", True, None)
    assert kw["port"] == 8080


class _FreePort:
    """socket.socket for the command's port check: every port is free."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def bind(self, address):
        pass


def test_compile_on_a_cpu_where_the_program_is_not_used_serves_packed_and_says_why(
    tmp_path, monkeypatch
):
    """On a CPU whose policy runs the model itself (AVX-512 without VNNI, simulated),
    ``compile=True`` builds nothing and waits for nothing: batches run packed, and /info says
    why."""
    cfg = bertlab.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    bertlab.BertModel(cfg).eval().save_pretrained(tmp_path)
    bertlab.BertTokenizer.from_pretrained(DEFAULT).save_pretrained(tmp_path)
    avx512 = cpu.policy(skylake_x(cpu.current().features), {})
    monkeypatch.setattr(cpu, "_CURRENT", [avx512])
    monkeypatch.setattr(Compiled, "_build", lambda *a: pytest.fail("nothing is compiled here"))
    with pytest.warns(UserWarning, match="Compiled runs the float32 model itself"):
        model = ServedModel("m", tmp_path, "float32", compile=True)
    info = model.info()
    assert model.compiled is None and info["compiled"] is False
    assert (
        "not measured faster than the model on this class of CPU (avx512)" in (info["not_compiled"])
    )
    ids = model.tokenizer(TEXTS)["input_ids"]
    rows = [Row(i, [0] * len(i), "mean") for i in ids]
    ref = pipeline("embed", str(tmp_path))(TEXTS, normalize=False)
    assert (torch.stack(model.forward(rows)) - ref).abs().max() < 1e-5

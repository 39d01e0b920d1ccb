"""The benchmarks' harness (benchmarks/harness/), outside the installed package: the peers that
serve_peers.py runs beside bertlab's server (their command lines in every precision, a peer
that cannot run reported as not run), the plain server's int8 model, and the package holding
none of it. The load itself is tested in tests/test_bench_serve.py."""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "benchmarks" / "harness"


def harness(name: str):
    """A harness script as a module, loaded from its file (the folder is no package; its
    scripts import their shared module, paired.py, from it, as when they run)."""
    if str(HARNESS) not in sys.path:
        sys.path.insert(0, str(HARNESS))
    spec = importlib.util.spec_from_file_location(f"harness_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_peer_that_cannot_run_is_reported_as_not_run(capsys):
    peers = harness("serve_peers")
    code = peers.main(["--systems", "infinity", "--infinity-venv", "/nonexistent"])
    out = capsys.readouterr().out
    assert code == 0
    assert "infinity: not run: --infinity-venv /nonexistent: no /nonexistent/bin/infinity_emb" in (
        out
    )
    assert "overload: not run: bertlab's alone, and bertlab was not asked" in out


def test_the_harness_refuses_an_unknown_system_naming_its_own_choices(capsys):
    peers = harness("serve_peers")
    assert peers.main(["--systems", "bertlab,tei"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "serve_peers.py: error: unknown system 'tei'; choose from bertlab, fastapi-st, infinity\n"
    )
    assert peers.main(["--seconds", "0"]) == 2  # bertlab bench serve's checks, the same
    assert "seconds must be above 0 and at most 3600; got 0" in capsys.readouterr().err


def test_every_peer_can_be_benchmarked_in_bfloat16_and_int8(tmp_path, monkeypatch):
    peers = harness("serve_peers")
    # Only the command lines are read here: the servers' packages need not be installed.
    monkeypatch.setattr(peers, "installed", lambda name: True)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "infinity_emb").write_text("")
    specs = peers.peers(str(venv))
    assert set(specs) == {"fastapi-st", "infinity"}
    for dtype in ("bfloat16", "int8"):
        for name, spec in specs.items():
            command = spec("MODEL", 1234, 2, dtype).command
            assert command[command.index("--dtype") + 1] == dtype, name
    assert "--dtype" not in specs["infinity"]("MODEL", 1234, 2, "float32").command
    plain = specs["fastapi-st"]("MODEL", 1234, 2, "float32").command
    assert plain[1] == str(HARNESS / "st_server.py") and "--dtype" not in plain
    monkeypatch.setattr(peers, "installed", lambda name: name != "fastapi")
    with pytest.raises(peers.Unavailable, match=r"fastapi not installed \(pip install -r bench"):
        specs["fastapi-st"]("MODEL", 1234, 2, "float32")
    with pytest.raises(peers.Unavailable, match="no --infinity-venv given"):
        peers.peers(None)["infinity"]("MODEL", 1234, 2, "float32")


def test_the_plain_server_quantizes_its_model_as_infinity_does_in_int8():
    from bertlab.files import resolve_model_dir
    from bertlab.pipelines import pipeline

    load_model = harness("st_server").load_model
    texts = ["A warm, funny film.", "Stocks fell sharply on Monday in Tokyo"]
    model = load_model(str(resolve_model_dir("default")), "int8")
    linears = {type(m).__module__ for m in model.modules() if type(m).__name__ == "Linear"}
    assert linears == {"torch.ao.nn.quantized.dynamic.modules.linear"}
    got = model.encode(texts, normalize_embeddings=True)
    cos = (got * pipeline("embed")(texts).numpy()).sum(-1)
    assert (0.8 < cos).all() and (cos < 0.99999).all()  # int8, not float32 under another name


def test_the_package_holds_no_peer_and_its_extras_none_of_their_packages():
    """What only produces the project's records against other systems lives in the harness:
    no file of the installed package starts another server or a profiler's script, and the
    package's extras (but the development set, ``test``) install none of the peers' packages."""
    pattern = re.compile(r"st_server|infinity_emb|import fastapi|from fastapi|profile_batch1")
    found = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "bertlab").rglob("*.py"))
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11 or later)")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for name, requirements in extras.items():
        if name != "test":
            assert not [r for r in requirements if r.startswith(("fastapi", "sentence-"))], name
    assert {"st_server.py", "serve_peers.py", "profile_batch1.py", "profile_serve_batch.py"} <= {
        p.name for p in HARNESS.iterdir()
    }
    assert "requirements.txt" in (HARNESS / "README.md").read_text()


def _products_kernels() -> str | None:
    """Why products_small.py's ways cannot run with this PyTorch, or None."""
    import torch

    from bertlab.nn import products

    if products._linear_pointwise is None:
        return "this PyTorch has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)"
    try:
        torch.ops.mkl._mkl_linear, torch.ops.mkl._mkl_reorder_linear_weight  # noqa: B018
    except (AttributeError, RuntimeError):
        return "this PyTorch has no MKL packed product (torch.ops.mkl._mkl_linear)"
    return None


def test_every_way_of_the_small_products_harness_computes_the_same_products():
    if (why := _products_kernels()) is not None:
        pytest.skip(why)
    import numpy as np
    import torch

    small = harness("products_small")
    ways = small.chains(rows=3, pad=5, threads=1)
    reference = ways["pytorch"]()
    assert [tuple(y.shape) for y in reference[:4]] == [(3, 1152), (3, 384), (3, 1536), (3, 384)]
    names = ["onednn", "onednn-exact", "mkl-few-rows", "mkl-packed", "mkl-packed-pad"]
    from bertlab.nn import avx2

    assert ("sgemm-avx2" in ways) == (avx2.load() is None)  # where the kernel runs here
    for name in names + [n for n in ("sgemm-avx2",) if n in ways]:
        got = ways[name]()
        assert len(got) == len(reference) == 24, name
        for y, ref in zip(got, reference, strict=True):
            # the padded way computes 5 rows: its first 3 are the sentence's
            torch.testing.assert_close(y[:3], ref, rtol=1e-4, atol=1e-4, msg=name)
        if name == "mkl-packed-pad":
            assert got[0].shape[0] == 5
    if "onnxruntime" in ways:
        for y, ref in zip(ways["onnxruntime"](), reference, strict=True):
            np.testing.assert_allclose(y, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_the_small_products_harness_refuses_rows_it_cannot_pad(capsys):
    small = harness("products_small")
    with pytest.raises(SystemExit) as e:
        small.main(["--rows", "21", "--pad", "16"])
    assert e.value.code == 2
    assert "--pad at least --rows, got 21, 16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        small.main(["--rounds", "0"])
    assert "--rounds and --calls must be at least 1, got 0, 10" in capsys.readouterr().err


def test_the_compiled_sizes_harness_refuses_sizes_it_cannot_run_before_compiling(
    capsys, monkeypatch
):
    sizes = harness("compiled_sizes")
    assert sizes.parse_sizes("1x8, 32x24") == [(1, 8), (32, 24)]
    for bad, named in (("1x8,8", "'8'"), ("0x8", "'0x8'"), ("2x1", "'2x1'"), ("ax8", "'ax8'")):
        with pytest.raises(SystemExit) as e:
            sizes.main(["--sizes", bad])
        assert e.value.code == 2
        assert f"a size is ROWSxLENGTH, at least 1x2, got {named}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sizes.main(["--rounds", "0"])
    assert "--threads and --rounds must be at least 1, got 2, 0" in capsys.readouterr().err
    monkeypatch.setattr(sizes.Compiled, "available", staticmethod(lambda: None))
    monkeypatch.setattr(sizes.Compiled, "_build", lambda *a: pytest.fail("nothing is compiled"))
    with pytest.raises(SystemExit):
        sizes.main(["--sizes", "1x21,1x600"])
    assert "--sizes 1x600: longer than the model's 512 positions" in capsys.readouterr().err


def test_the_few_rows_harness_refuses_unknown_workloads_and_zero_rounds(capsys):
    few = harness("few_rows")
    with pytest.raises(SystemExit) as e:
        few.main(["--workloads", "batch-1,huge"])
    assert e.value.code == 2
    assert "--workloads must name some of file-order, sorted, batch-1, got ['batch-1', 'huge']" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        few.main(["--rounds", "0"])
    assert "--rounds and --threads must be at least 1, got 0, 2" in capsys.readouterr().err


def test_the_int8_rows_harness_refuses_bad_arguments_and_restores_the_row_limit(capsys):
    from bertlab.nn import precision

    rows = harness("int8_rows")
    with pytest.raises(SystemExit) as e:
        rows.main(["--workloads", "sorted,huge"])
    assert e.value.code == 2
    assert "--workloads must name some of file-order, sorted, batch-1, got ['sorted', 'huge']" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        rows.main(["--threads", "0"])
    assert "--rounds and --threads must be at least 1, got 9, 0" in capsys.readouterr().err
    seen = []
    rows.with_rows(0, lambda: seen.append(precision.S8_FEW_ROWS))()
    assert seen == [0] and precision.S8_FEW_ROWS == 32  # set while it runs, then restored
    with pytest.raises(ZeroDivisionError):
        rows.with_rows(5, lambda: 1 / 0)()
    assert precision.S8_FEW_ROWS == 32


def test_the_int8_kernels_harness_lists_each_kernel_or_why_not_and_restores_the_policy(capsys):
    from bertlab.nn import cpu

    kernels = harness("int8_kernels")
    with pytest.raises(SystemExit) as e:
        kernels.main(["--workloads", "huge"])
    assert e.value.code == 2
    assert "--workloads must name some of" in capsys.readouterr().err
    runnable, refused = kernels.kernels()
    assert set(runnable) | set(refused) == set(cpu.INT8_KERNELS)
    assert not set(runnable) & set(refused)
    assert all(p.int8_kernel == k for k, p in runnable.items())
    assert all(k in why for k, why in refused.items())  # "BERTLAB_INT8_KERNEL=<k>: ..."
    if cpu.current().int8_kernel is not None:  # the policy's own kernel is always runnable
        assert cpu.current().int8_kernel in runnable
    before = cpu.current()
    other = replace(before, int8_kernel="fbgemm-u8" if before.int8_kernel != "fbgemm-u8" else None)
    seen = []
    under = harness("paired").under  # (each paired harness runs a system under its policy)
    under(other, lambda: seen.append(cpu.current().int8_kernel))()
    assert seen == [other.int8_kernel] and cpu.current() is before  # set while it runs, restored
    with pytest.raises(ZeroDivisionError):
        under(other, lambda: 1 / 0)()
    assert cpu.current() is before


def test_the_attention_harness_refuses_bad_arguments_and_compares_the_same_attention(
    capsys, monkeypatch
):
    import dataclasses

    import torch

    from bertlab.nn import attention, avx2, cpu

    small = harness("attention_small")
    with pytest.raises(SystemExit):
        small.main(["--rounds", "0"])
    assert "--rounds 0 must be at least 1" in capsys.readouterr().err
    q, k, v, packing = small.inputs([21, 9, 21])
    assert q.shape == (51, 12, 32) and packing.lengths == (21, 9, 21)
    if avx2.load() is not None:
        pytest.skip(f"bertlab's AVX2 attention cannot run here: {avx2.load()}")
    here = cpu.current()
    outs = []
    for kernel in ("onednn", "sgemm-avx2"):  # the harness's two ways
        monkeypatch.setattr(cpu, "_CURRENT", [dataclasses.replace(here, float32_kernel=kernel)])
        outs.append(attention.packed_attention(q, k, v, packing, 0.0)[0])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_the_lengths_harness_refuses_bad_lengths_and_restores_the_kernels(capsys):
    from bertlab.nn import avx2

    lengths = harness("batch1_lengths")
    with pytest.raises(SystemExit) as e:
        lengths.main(["--lengths", "8,1000"])
    assert e.value.code == 2
    assert "--lengths must each be 2 to 512 tokens, got '8,1000'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lengths.main(["--lengths", "8,x"])
    assert "--lengths must be comma-separated integers, got '8,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lengths.main(["--calls", "0"])
    assert "--threads, --rounds and --calls must be at least 1, got 2, 9, 0" in (
        capsys.readouterr().err
    )
    batch = lengths.sentence(7)
    assert batch["input_ids"].shape == (1, 7) and batch["input_ids"][0, 0] == 101
    assert batch["input_ids"][0, -1] == 102 and batch["attention_mask"].sum() == 7
    if avx2.load() is not None:
        pytest.skip(f"bertlab's AVX2 kernels do not run here: {avx2.load()}")
    lib = avx2._kernels()
    real = {name: getattr(lib, name) for name in lengths.KERNELS}
    seen = []

    def run(b):  # what the harness's "around" run calls: the kernels stand idle meanwhile
        seen.append(all(getattr(lib, name) is not real[name] for name in lengths.KERNELS))
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        lengths.around(run, batch, 3)()
    assert seen == [True]  # replaced while it ran, and put back after it raised
    assert all(getattr(lib, name) is real[name] for name in lengths.KERNELS)

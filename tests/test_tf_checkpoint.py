"""Original TensorFlow BERT checkpoints, read without TensorFlow (bertlab.io.tf_checkpoint).

The fixtures in tests/fixtures/tf/ were written by TensorFlow itself (scripts/
make_tf_checkpoints.py), each with the outputs TensorFlow computed from the original BERT
equations on the same variables (expected.npz): bertlab must give them to 1e-4, and so must
transformers loading the folder that ``bertlab convert`` writes. Every damaged-input case works
on a copy of a fixture damaged here.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import bertlab
from bertlab.cli.main import main as cli
from bertlab.io import tf_bundle
from bertlab.io.checkpoint import match_state_dict, read_state_dict
from bertlab.io.convert import convert_tf_checkpoint
from bertlab.io.tf_bundle import TFEntry, crc32c, read_index
from bertlab.io.tf_checkpoint import (
    hf_name,
    is_optimizer_variable,
    is_tf_checkpoint,
    read_tf_checkpoint,
    read_tf_variables,
)

TF = Path(__file__).parent / "fixtures" / "tf"
PRETRAINING = TF / "pretraining"
SHARDED = TF / "classifier_fp16_sharded"
TOL = 1e-4


def expected(folder: Path) -> dict[str, np.ndarray]:
    with np.load(folder / "expected.npz") as data:
        return dict(data)


def inputs(e: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(e[k]) for k in ("input_ids", "token_type_ids", "attention_mask")}


def real(x: torch.Tensor | np.ndarray, e: dict[str, np.ndarray]) -> np.ndarray:
    """The rows of a (B, T, ...) output at real tokens (padding positions are not compared)."""
    x = x.detach().float().numpy() if isinstance(x, torch.Tensor) else x
    return x[e["attention_mask"].astype(bool)]


def load(cls: type, ckpt, **overrides) -> torch.nn.Module:
    """A bertlab model built from a TFCheckpoint's config and filled with its state dict."""
    model = cls(bertlab.BertConfig.from_dict(ckpt.config, **overrides))
    found, info = match_state_dict(model, ckpt.state_dict)
    assert not info.missing_keys, info.missing_keys
    with torch.no_grad():
        own = model.state_dict()
        for key, tensor in found.items():
            own[key].copy_(tensor)
    return model.eval()


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


# ============================================================================ an index writer
# A minimal writer of the tensor-bundle index (one data block, keys stored whole), to build the
# cases TensorFlow cannot be asked for here: partitioned entries, unsupported dtypes, renames.
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def _entry_bytes(e: TFEntry) -> bytes:
    shape = b"".join(_field(2, _field(1, d)) for d in e.shape)
    out = _field(1, e.dtype) + _field(2, shape) + _field(3, e.shard_id) + _field(4, e.offset)
    out += _field(5, e.size) + _varint(6 << 3 | 5) + struct.pack("<I", e.crc32c)
    return out + b"".join(_field(7, b"") for _ in range(e.num_slices))


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    contents = body + struct.pack("<II", 0, 1)  # one restart point, at 0
    return contents + b"\0" + struct.pack("<I", _mask(crc32c(contents + b"\0")))


def write_index(path: Path, header: dict[str, int], entries: dict[str, TFEntry]) -> None:
    head = _field(1, header["num_shards"]) + _field(2, header["endianness"])
    items = [(b"", head)] + [(k.encode(), _entry_bytes(entries[k])) for k in sorted(entries)]
    data = _block(items)
    last = items[-1][0]
    index = _block([(last, _varint(0) + _varint(len(data) - 5))])
    meta = _block([])
    handles = _varint(len(data) + len(index)) + _varint(len(meta) - 5)
    handles += _varint(len(data)) + _varint(len(index) - 5)
    footer = handles.ljust(40, b"\0") + struct.pack("<Q", tf_bundle.TABLE_MAGIC)
    path.write_bytes(data + index + meta + footer)


def rewrite(folder: Path, change, **header_changes: int) -> None:
    """Rewrite ``folder``'s index after ``change(entries)`` edits the parsed entries."""
    index = folder / "bert_model.ckpt.index"
    header, entries = read_index(index)
    change(entries)
    write_index(index, {**header, **header_changes}, entries)


# ============================================================================ CRC32C
def test_crc32c_gives_the_standard_check_value_and_agrees_with_a_bytewise_crc():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of the CRC-32C definition
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)

    def bytewise(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF

    rng = np.random.default_rng(0)
    # Lengths on both sides of the scalar / side-by-side switch, and with odd tails.
    for n in (0, 1, 7, 4095, 4096, 4097, 65543, 300_001):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c(data) == bytewise(data), n


# ============================================================================ against TensorFlow
@pytest.mark.parametrize("kernel", ["packed", "sdpa", "eager"])
def test_pretraining_checkpoint_gives_tensorflows_outputs(kernel):
    ckpt = read_tf_checkpoint(PRETRAINING)
    e = expected(PRETRAINING)
    model = load(bertlab.BertForPreTraining, ckpt, attn_implementation=kernel)
    with torch.no_grad():
        out = model(**inputs(e), output_hidden_states=True)
    assert np.abs(real(out.hidden_states[-1], e) - real(e["sequence_output"], e)).max() < TOL
    assert np.abs(real(out.prediction_logits, e) - real(e["mlm_logits"], e)).max() < TOL
    assert np.abs(out.seq_relationship_logits.numpy() - e["nsp_logits"]).max() < TOL
    # The logits are not all alike: a wrong transpose would be far off.
    assert np.abs(e["mlm_logits"]).max() > 1.0


def test_masked_lm_and_base_model_load_the_same_checkpoint():
    ckpt = read_tf_checkpoint(PRETRAINING)
    e = expected(PRETRAINING)
    with torch.no_grad():
        mlm = load(bertlab.BertForMaskedLM, ckpt)(**inputs(e)).logits
        base = load(bertlab.BertModel, ckpt)(**inputs(e))
    assert np.abs(real(mlm, e) - real(e["mlm_logits"], e)).max() < TOL
    assert np.abs(real(base.last_hidden_state, e) - real(e["sequence_output"], e)).max() < TOL
    assert np.abs(base.pooler_output.numpy() - e["pooled_output"]).max() < TOL


def test_float16_checkpoint_in_three_shards_gives_tensorflows_outputs():
    ckpt = read_tf_checkpoint(SHARDED, strict=False)
    assert {t.dtype for t in ckpt.state_dict.values()} == {torch.float16}
    assert len(list(SHARDED.glob("bert_model.ckpt.data-*-of-00003"))) == 3
    e = expected(SHARDED)
    model = load(bertlab.BertModel, ckpt)  # float32 model, float16 values
    with torch.no_grad():
        out = model(**inputs(e))
    assert np.abs(real(out.last_hidden_state, e) - real(e["sequence_output"], e)).max() < TOL
    assert np.abs(out.pooler_output.numpy() - e["pooled_output"]).max() < TOL
    assert ckpt.config["architectures"] == ["BertModel"]  # no pre-training heads in it


def test_transformers_loads_the_converted_folder_and_agrees(tmp_path, capsys):
    dest = tmp_path / "hf"
    assert cli(["convert", str(PRETRAINING), str(dest)]) == 0
    printed = capsys.readouterr().out
    assert "BertForPreTraining" in printed and "skipped 93 optimizer variables" in printed
    e = expected(PRETRAINING)
    theirs = transformers.BertForPreTraining.from_pretrained(dest).eval()
    ours = bertlab.BertForPreTraining.from_pretrained(dest)
    with torch.no_grad():
        t = theirs(**inputs(e), output_hidden_states=True)
        o = ours(**inputs(e), output_hidden_states=True)
    assert np.abs(real(t.prediction_logits, e) - real(e["mlm_logits"], e)).max() < TOL
    assert np.abs(real(t.hidden_states[-1], e) - real(e["sequence_output"], e)).max() < TOL
    assert np.abs(t.seq_relationship_logits.numpy() - e["nsp_logits"]).max() < TOL
    assert np.abs(real(t.prediction_logits, e) - real(o.prediction_logits, e)).max() < 1e-5
    # The tokenizer files: transformers reads them and tokenizes as bertlab does.
    text = "The world of a child"
    tok = transformers.AutoTokenizer.from_pretrained(dest)
    assert tok(text)["input_ids"] == bertlab.BertTokenizer.from_pretrained(dest)(text)["input_ids"]
    assert (dest / "vocab.txt").read_text() == (PRETRAINING / "vocab.txt").read_text()


def test_transformers_reads_the_converted_float16_checkpoint(tmp_path, capsys):
    dest = tmp_path / "hf"
    assert cli(["convert", str(SHARDED), str(dest), "--skip-unmapped", "--cased"]) == 0
    printed = capsys.readouterr().out
    assert "left out 2 unmapped: output_bias, output_weights" in printed
    assert "tokenizer: cased, as asked" in printed
    assert json.loads((dest / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert {t.dtype for t in read_state_dict(dest).values()} == {torch.float16}
    e = expected(SHARDED)
    theirs = transformers.BertModel.from_pretrained(dest, dtype=torch.float32).eval()
    with torch.no_grad():
        t = theirs(**inputs(e))
    assert np.abs(real(t.last_hidden_state, e) - real(e["sequence_output"], e)).max() < TOL


def test_every_supported_dtype_reads_back_its_values(tmp_path):
    gen = torch.Generator().manual_seed(0)
    values = {
        "a/float32": torch.randn(3, 4, generator=gen),
        "a/float64": torch.randn(5, generator=gen, dtype=torch.float64),
        "b/float16": torch.randn(2, 3, generator=gen).half(),
        "b/bfloat16": torch.randn(2, 3, generator=gen).bfloat16(),
        "c/int32": torch.arange(-3, 3, dtype=torch.int32),
        "c/int64": torch.tensor([2**40, -1]),
    }
    codes = {torch.float32: 1, torch.float64: 2, torch.int32: 3, torch.int64: 9}
    codes.update({torch.bfloat16: 14, torch.float16: 19})  # TensorFlow's DataType numbers
    blob, entries = b"", {}
    for name, t in values.items():
        raw = t.view(torch.uint8).numpy().tobytes()
        crc = _mask(crc32c(raw))
        entries[name] = TFEntry(codes[t.dtype], tuple(t.shape), 0, len(blob), len(raw), crc)
        blob += raw
    (tmp_path / "x.data-00000-of-00001").write_bytes(blob)
    write_index(tmp_path / "x.index", {"num_shards": 1, "endianness": 0}, entries)
    got = read_tf_variables(tmp_path / "x")
    for name, t in values.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


# ============================================================================ names and counts
def test_optimizer_state_is_skipped_and_counted():
    ckpt = read_tf_checkpoint(PRETRAINING)
    _, entries = read_index(PRETRAINING / "bert_model.ckpt.index")
    slots = [n for n in entries if n.endswith(("/adam_m", "/adam_v"))]
    assert sorted(ckpt.skipped) == sorted([*slots, "global_step"])
    assert len(slots) == 2 * len(ckpt.state_dict)  # two slots per weight, as released
    assert set(entries) == set(ckpt.skipped) | {n for n in entries if hf_name(n)}
    for name in (
        "beta1_power",
        "beta2_power",
        "bert/x/kernel/Adam_1",
        "a/AdamWeightDecayOptimizer",
    ):
        assert is_optimizer_variable(name), name
    assert not is_optimizer_variable("bert/pooler/dense/kernel")


def test_names_and_transposes_follow_the_original_code():
    ckpt = read_tf_checkpoint(PRETRAINING)
    raw = read_tf_variables(PRETRAINING)
    sd = ckpt.state_dict
    kernel = raw["bert/encoder/layer_1/attention/self/query/kernel"]
    assert torch.equal(sd["bert.encoder.layer.1.attention.self.query.weight"], kernel.t())
    inner = raw["bert/encoder/layer_0/intermediate/dense/kernel"]  # (H, I) -> Linear's (I, H)
    assert torch.equal(sd["bert.encoder.layer.0.intermediate.dense.weight"], inner.t())
    nsp = raw["cls/seq_relationship/output_weights"]  # already (2, H): as it is
    assert torch.equal(sd["cls.seq_relationship.weight"], nsp)
    assert torch.equal(sd["cls.predictions.bias"], raw["cls/predictions/output_bias"])
    gamma = raw["cls/predictions/transform/LayerNorm/gamma"]
    assert torch.equal(sd["cls.predictions.transform.LayerNorm.weight"], gamma)
    assert raw["global_step"].dtype == torch.int64
    assert int(raw["global_step"]) == int(expected(PRETRAINING)["global_step"])


def test_an_unmapped_variable_is_refused_by_name_unless_not_strict():
    with pytest.raises(ValueError, match="does not map: output_bias, output_weights"):
        read_tf_checkpoint(SHARDED)
    ckpt = read_tf_checkpoint(SHARDED, strict=False)
    assert ckpt.unmapped == ["output_bias", "output_weights"]
    assert ckpt.skipped == ["global_step"]
    assert not any("output_" in k for k in ckpt.state_dict)


def test_config_is_transformers_bert_config(tmp_path):
    ckpt = read_tf_checkpoint(PRETRAINING)
    original = json.loads((PRETRAINING / "bert_config.json").read_text())
    assert {k: ckpt.config[k] for k in original} == original
    theirs = transformers.BertConfig.from_dict(ckpt.config)
    for key in ("layer_norm_eps", "pad_token_id", "hidden_act", "tie_word_embeddings"):
        assert getattr(theirs, key) == ckpt.config[key]
    keys = set(transformers.BertConfig().to_diff_dict()) - {"transformers_version"}
    assert set(ckpt.config) == keys | {"architectures"}
    assert ckpt.vocab_file == PRETRAINING / "vocab.txt"


def test_checkpoint_is_found_by_folder_prefix_or_index_file(tmp_path):
    prefix = PRETRAINING / "bert_model.ckpt"
    for path in (PRETRAINING, prefix, Path(f"{prefix}.index")):
        assert is_tf_checkpoint(path)
        assert read_tf_checkpoint(path).prefix == prefix
    assert not is_tf_checkpoint(bertlab.bundled_model_dir())
    assert not is_tf_checkpoint(tmp_path)
    two = copy(PRETRAINING, tmp_path)
    for name in ("index", "data-00000-of-00001"):
        shutil.copy(two / f"bert_model.ckpt.{name}", two / f"model.ckpt-5.{name}")
    with pytest.raises(ValueError, match="holds 2 checkpoints .* pass the one to read"):
        read_tf_checkpoint(two)
    assert read_tf_checkpoint(two / "model.ckpt-5").prefix == two / "model.ckpt-5"


def test_the_index_writer_of_these_tests_writes_what_the_reader_reads(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    rewrite(folder, lambda entries: None)
    a, b = read_tf_checkpoint(PRETRAINING), read_tf_checkpoint(folder)
    assert a.state_dict.keys() == b.state_dict.keys()
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


# ============================================================================ bad input
def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_index_is_refused_naming_the_file(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    index = folder / "bert_model.ckpt.index"
    good = index.read_bytes()
    _flip(index, len(good) - 1)
    with pytest.raises(ValueError, match=r"bert_model.ckpt.index is not .* magic number"):
        read_tf_checkpoint(folder)
    index.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"bert_model.ckpt.index is not .* or is truncated"):
        read_tf_checkpoint(folder)
    index.write_bytes(good[:20])
    with pytest.raises(ValueError, match=r"bert_model.ckpt.index is truncated: 20 bytes"):
        read_tf_checkpoint(folder)
    index.write_bytes(good)
    _flip(index, 40)  # inside the first data block
    with pytest.raises(ValueError, match=r"bert_model.ckpt.index is damaged: the checksum"):
        read_tf_checkpoint(folder)


def test_a_damaged_or_truncated_shard_is_refused_naming_the_variable(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    shard = folder / "bert_model.ckpt.data-00000-of-00001"
    _, entries = read_index(folder / "bert_model.ckpt.index")
    name = "bert/encoder/layer_1/output/dense/kernel"
    _flip(shard, entries[name].offset + 5)
    with pytest.raises(ValueError, match=f"data-00000-of-00001 is damaged: .* variable {name} "):
        read_tf_checkpoint(folder)
    shard.write_bytes((PRETRAINING / shard.name).read_bytes()[: entries[name].offset + 3])
    with pytest.raises(ValueError, match=f"is truncated: variable {name} needs bytes"):
        read_tf_checkpoint(folder)


def test_a_missing_shard_is_named(tmp_path):
    folder = copy(SHARDED, tmp_path)
    (folder / "bert_model.ckpt.data-00001-of-00003").unlink()
    with pytest.raises(FileNotFoundError, match="3 data shard.*missing: .*data-00001-of-00003"):
        read_tf_checkpoint(folder, strict=False)


@pytest.mark.parametrize("how", ["slices", "part_0"])
def test_a_partitioned_variable_is_refused_by_name(tmp_path, how):
    folder = copy(PRETRAINING, tmp_path)
    name = "bert/pooler/dense/kernel"

    def partition(entries):
        entry = entries.pop(name)
        if how == "slices":
            entries[name] = dataclasses.replace(entry, num_slices=2)
        else:
            entries[f"{name}/part_0"] = entry

    rewrite(folder, partition)
    with pytest.raises(ValueError, match=f"variable {name}.* is partitioned"):
        read_tf_checkpoint(folder)


def test_an_unsupported_dtype_is_refused_by_name(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    name = "bert/pooler/dense/bias"

    def to_int8(entries):
        entries[name] = dataclasses.replace(entries[name], dtype=6)

    rewrite(folder, to_int8)
    with pytest.raises(ValueError, match=f"variable {name} .* has dtype int8"):
        read_tf_checkpoint(folder)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("vocab_size", 100, r"word_embeddings .* \[99, 32\], .*\(vocab_size 100, .*\[100, 32\]"),
        ("hidden_size", 64, r"has shape \[(\d+, )?32\], .* \(.*hidden_size 64\) implies"),
        ("intermediate_size", 32, r"intermediate/dense/bias .*\(intermediate_size 32\) implies"),
        ("num_hidden_layers", 1, r"layer_1/.* belongs to layer 1, .* num_hidden_layers 1"),
        ("num_hidden_layers", 3, r"lacks 16 weight\(s\) that bert_config.json requires"),
    ],
)
def test_a_shape_that_disagrees_with_bert_config_is_refused(tmp_path, key, value, message):
    folder = copy(PRETRAINING, tmp_path)
    path = folder / "bert_config.json"
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        read_tf_checkpoint(folder)


def test_a_big_endian_checkpoint_is_refused(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    rewrite(folder, lambda entries: None, endianness=1)
    with pytest.raises(ValueError, match="big-endian machine; bertlab reads little-endian"):
        read_tf_checkpoint(folder)


def test_a_checkpoint_with_the_masked_lm_head_only_converts_to_bert_for_masked_lm(tmp_path):
    folder = copy(PRETRAINING, tmp_path)

    def drop_nsp(entries):
        for name in [n for n in entries if n.startswith("cls/seq_relationship/")]:
            del entries[name]

    rewrite(folder, drop_nsp)
    report = convert_tf_checkpoint(folder, tmp_path / "out")
    assert report.architecture == "BertForMaskedLM"
    assert report.unused == ["pooler.dense.bias", "pooler.dense.weight"]  # it has no pooler
    assert "BertForMaskedLM has no place for them" in str(report)
    e = expected(PRETRAINING)
    model = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        logits = model(**inputs(e)).logits
    assert np.abs(real(logits, e) - real(e["mlm_logits"], e)).max() < TOL


def test_a_missing_or_broken_bert_config_is_refused(tmp_path):
    folder = copy(PRETRAINING, tmp_path)
    (folder / "bert_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no bert_config.json beside the checkpoint"):
        read_tf_checkpoint(folder)
    (folder / "bert_config.json").write_text('{"vocab_size": 99}')
    with pytest.raises(ValueError, match="bert_config.json lacks hidden_size, num_hidden_layers"):
        read_tf_checkpoint(folder)
    with pytest.raises(FileNotFoundError, match="no TensorFlow checkpoint"):
        read_tf_checkpoint(tmp_path / "nowhere")


def test_convert_is_atomic_and_refuses_to_overwrite(tmp_path, capsys):
    broken = copy(PRETRAINING, tmp_path)
    _flip(broken / "bert_model.ckpt.data-00000-of-00001", 100)
    dest = tmp_path / "out"
    assert cli(["convert", str(broken), str(dest)]) == 2
    assert "bertlab convert: error:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pretraining"]  # nothing half-written
    dest.mkdir()
    (dest / "old.txt").write_text("keep me")
    assert cli(["convert", str(PRETRAINING), str(dest)]) == 2
    assert "already holds files; pass --overwrite" in capsys.readouterr().err
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    assert cli(["convert", str(PRETRAINING), str(dest), "--overwrite"]) == 0
    assert (dest / "model.safetensors").is_file() and not (dest / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "pretraining"]
    with pytest.raises(ValueError, match="holds the checkpoint"):
        convert_tf_checkpoint(broken, broken, overwrite=True)


def test_bertlab_never_imports_tensorflow():
    read_tf_checkpoint(PRETRAINING)
    assert "tensorflow" not in sys.modules


def test_from_pretrained_reads_a_tensorflow_folder_or_prefix_directly(caplog):
    e = expected(PRETRAINING)
    for source in (PRETRAINING, PRETRAINING / "bert_model.ckpt"):
        model = bertlab.AutoModelForPreTraining.from_pretrained(source)
        with torch.no_grad():
            out = model(**inputs(e))
        assert np.abs(real(out.prediction_logits, e) - real(e["mlm_logits"], e)).max() < TOL
    assert bertlab.AutoConfig.from_pretrained(PRETRAINING).hidden_size == 32
    assert bertlab.AutoTokenizer.from_pretrained(PRETRAINING).vocab_size == len(
        (PRETRAINING / "vocab.txt").read_text().splitlines()
    )
    # Variables bertlab does not map are reported by name (strict: refused), never dropped
    # silently; a float16 checkpoint loads as float16 with dtype "auto", as transformers would.
    with caplog.at_level("WARNING", logger="bertlab"):
        model, info = bertlab.BertModel.from_pretrained(SHARDED, output_loading_info=True)
    assert "output_weights" in info.unexpected_keys and "output_weights" in caplog.text
    assert model.dtype == torch.float16
    with pytest.raises(ValueError, match="output_weights"):
        bertlab.BertModel.from_pretrained(SHARDED, strict=True)
    e = expected(SHARDED)
    model = bertlab.BertModel.from_pretrained(SHARDED, dtype=torch.float32)
    with torch.no_grad():
        out = model(**inputs(e))
    assert np.abs(real(out.last_hidden_state, e) - real(e["sequence_output"], e)).max() < TOL

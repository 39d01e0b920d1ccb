"""Loading and saving edge cases of bertlab.io.checkpoint: formats, shards, legacy key spellings,
base <-> task models, shape mismatches, corrupted files, and what save_pretrained writes."""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bertlab
from bertlab import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
    LoadingInfo,
)

CONFIG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    num_labels=3,
)


# ================================================================================ helpers
def make(cls=BertModel, seed: int = 0, **changes):
    """A small model with random weights everywhere (LayerNorms and biases included)."""
    torch.manual_seed(seed)
    model = cls(CONFIG.replace(**changes) if changes else CONFIG)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (2, 7), generator=gen)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    types = torch.zeros(2, 7, dtype=torch.long)
    types[:, 3:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def run(model) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return tuple(t for t in model(**inputs()).to_tuple() if isinstance(t, torch.Tensor))


def assert_same_outputs(a, b) -> None:
    ta, tb = run(a), run(b)
    assert len(ta) == len(tb) > 0
    for x, y in zip(ta, tb, strict=True):
        assert torch.equal(x, y)


def assert_same_weights(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def no_losses(info: LoadingInfo) -> bool:
    return not (info.missing_keys or info.unexpected_keys or info.mismatched_keys)


def saved(model, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


def write_bin_folder(state: dict[str, torch.Tensor], src: Path, dst: Path) -> Path:
    """A folder with src's config.json and the state dict as pytorch_model.bin."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    torch.save(state, dst / "pytorch_model.bin")
    return dst


def write_shards(state: dict[str, torch.Tensor], src: Path, dst: Path, fmt: str) -> list[str]:
    """Two shards and their index (transformers' layout). Returns the shard file names."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    keys = sorted(state)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    if fmt == "safetensors":
        names = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
        index = "model.safetensors.index.json"
    else:
        names = [f"pytorch_model-0000{i}-of-00002.bin" for i in (1, 2)]
        index = "pytorch_model.bin.index.json"
    weight_map = {}
    for name, half in zip(names, halves, strict=True):
        part = {k: state[k].contiguous() for k in half}
        if fmt == "safetensors":
            save_file(part, str(dst / name), metadata={"format": "pt"})
        else:
            torch.save(part, dst / name)
        weight_map.update({k: name for k in half})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (dst / index).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return names


# ================================================================================ formats
def test_pytorch_model_bin_loads_like_safetensors(tmp_path):
    model = make(BertForSequenceClassification)
    st_dir = saved(model, tmp_path / "st")
    state = load_file(str(st_dir / "model.safetensors"))
    bin_dir = write_bin_folder(state, st_dir, tmp_path / "bin")
    assert not (bin_dir / "model.safetensors").exists()

    a, info_a = BertForSequenceClassification.from_pretrained(st_dir, output_loading_info=True)
    b, info_b = BertForSequenceClassification.from_pretrained(bin_dir, output_loading_info=True)
    assert no_losses(info_a) and no_losses(info_b)
    assert_same_weights(a, b)
    assert_same_weights(a, model)
    assert_same_outputs(a, b)
    assert_same_outputs(b, model)


class _Payload:
    """Unpickling this calls open(marker, "w"): a harmless but visible side effect."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_bin_with_arbitrary_object_is_refused(tmp_path):
    src = saved(make(), tmp_path / "src")
    state = dict(load_file(str(src / "model.safetensors")))
    marker = tmp_path / "pwned"
    state["embeddings.evil"] = _Payload(marker)
    bad = write_bin_folder(state, src, tmp_path / "bad")

    with pytest.raises(ValueError) as exc:
        BertModel.from_pretrained(bad)
    assert "pytorch_model.bin" in str(exc.value)
    with pytest.raises(ValueError):
        bertlab.read_state_dict(bad)
    assert not marker.exists(), "the pickle payload ran"

    # The payload is real: an unrestricted unpickler does run it.
    torch.load(bad / "pytorch_model.bin", weights_only=False)
    assert marker.exists()


def test_bin_holding_something_else_than_a_flat_dict_is_refused(tmp_path):
    src = saved(make(), tmp_path / "src")
    state = load_file(str(src / "model.safetensors"))
    bad = write_bin_folder({"state_dict": state}, src, tmp_path / "nested")
    with pytest.raises(ValueError):
        BertModel.from_pretrained(bad)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_sharded_checkpoint(fmt, tmp_path):
    model = make(BertForSequenceClassification)
    src = saved(model, tmp_path / "src")
    state = load_file(str(src / "model.safetensors"))
    sharded = tmp_path / "sharded"
    names = write_shards(state, src, sharded, fmt)
    assert not (sharded / "model.safetensors").exists()

    loaded, info = BertForSequenceClassification.from_pretrained(sharded, output_loading_info=True)
    assert no_losses(info)
    assert_same_weights(loaded, model)
    assert_same_outputs(loaded, model)
    assert bertlab.read_state_dict(sharded).keys() == state.keys()

    # A shard gone: FileNotFoundError naming it.
    (sharded / names[1]).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(names[1])):
        BertForSequenceClassification.from_pretrained(sharded)


def test_shard_index_listing_a_tensor_no_shard_holds(tmp_path):
    src = saved(make(), tmp_path / "src")
    state = load_file(str(src / "model.safetensors"))
    sharded = tmp_path / "sharded"
    names = write_shards(state, src, sharded, "safetensors")
    index = sharded / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["encoder.layer.9.output.dense.weight"] = names[0]
    index.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="encoder.layer.9.output.dense.weight"):
        BertModel.from_pretrained(sharded)


# ================================================================================ key spellings
def _legacy(key: str) -> str:
    if ".LayerNorm." in key:
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        )
    return key


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification])
@pytest.mark.parametrize("prefix", ["with_bert_prefix", "without_bert_prefix"])
def test_gamma_beta_keys_with_and_without_prefix(cls, prefix, tmp_path):
    model = make(cls)
    src = saved(model, tmp_path / "src")
    state = load_file(str(src / "model.safetensors"))
    legacy = {}
    for key, tensor in state.items():
        key = key.removeprefix("bert.")
        if prefix == "with_bert_prefix" and key.startswith(("embeddings.", "encoder.", "pooler.")):
            key = "bert." + key
        legacy[_legacy(key)] = tensor
    assert any(k.endswith("LayerNorm.gamma") for k in legacy)
    assert any(k.endswith("LayerNorm.beta") for k in legacy)
    assert not any(k.endswith("LayerNorm.weight") for k in legacy)
    assert any(k.startswith("bert.") for k in legacy) == (prefix == "with_bert_prefix")

    dst = tmp_path / "legacy"
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    save_file(legacy, str(dst / "model.safetensors"))
    loaded, info = cls.from_pretrained(dst, output_loading_info=True)
    assert no_losses(info), info
    assert_same_weights(loaded, model)
    assert_same_outputs(loaded, model)


# ================================================================================ base <-> task
def test_base_weights_into_task_model(tmp_path, caplog):
    base = make(BertModel, seed=1)
    src = saved(base, tmp_path / "base")
    with caplog.at_level(logging.WARNING, logger="bertlab"):
        task, info = BertForSequenceClassification.from_pretrained(src, output_loading_info=True)
    assert sorted(info.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert info.unexpected_keys == [] and info.mismatched_keys == []
    records = [r for r in caplog.records if r.name == "bertlab" and r.levelno == logging.WARNING]
    assert records, "no warning logged on the 'bertlab' logger"
    text = "\n".join(r.getMessage() for r in records)
    assert "classifier.weight" in text and "classifier.bias" in text
    # The backbone is the base model's.
    assert_same_weights(task.bert, base)
    assert_same_outputs(task.bert, base)
    assert task.classifier.weight.shape == (3, 32)


def test_task_weights_into_base_model(tmp_path, caplog):
    task = make(BertForSequenceClassification, seed=2)
    src = saved(task, tmp_path / "task")
    with caplog.at_level(logging.WARNING, logger="bertlab"):
        base, info = BertModel.from_pretrained(src, output_loading_info=True)
    assert sorted(info.unexpected_keys) == ["classifier.bias", "classifier.weight"]
    assert info.missing_keys == [] and info.mismatched_keys == []
    assert any("classifier.weight" in r.getMessage() for r in caplog.records)
    assert_same_weights(base, task.bert)
    with torch.no_grad():
        a, b = base(**inputs()), task.bert(**inputs())
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert torch.equal(a.pooler_output, b.pooler_output)


def test_strict_load_with_missing_keys_raises(tmp_path):
    src = saved(make(BertModel), tmp_path / "base")
    with pytest.raises(ValueError, match="classifier"):
        BertForSequenceClassification.from_pretrained(src, strict=True)
    # And with unexpected keys.
    task_dir = saved(make(BertForSequenceClassification), tmp_path / "task")
    with pytest.raises(ValueError, match="classifier"):
        BertModel.from_pretrained(task_dir, strict=True)
    # A complete checkpoint is fine with strict=True.
    BertForSequenceClassification.from_pretrained(task_dir, strict=True)


# ================================================================================ shapes
def _assert_names_shapes(message: str) -> None:
    assert "classifier.weight" in message
    assert re.search(r"3,\s*32", message), message
    assert re.search(r"5,\s*32", message), message


def _five_labels(src: Path, via: str) -> dict:
    """Ask for a 5-label model over a 3-label checkpoint: by a config override (as in
    transformers, ``from_pretrained(dir, num_labels=5)``) or by passing a whole config."""
    if via == "num_labels":
        return dict(num_labels=5)
    config = BertConfig.from_pretrained(src).replace(num_labels=5)
    assert config.num_labels == 5
    return dict(config=config)


@pytest.mark.parametrize("via", ["num_labels", "config"])
def test_mismatched_shape_raises_naming_key_and_shapes(via, tmp_path):
    src = saved(make(BertForSequenceClassification, num_labels=3), tmp_path / "three")
    with pytest.raises(ValueError) as exc:
        BertForSequenceClassification.from_pretrained(src, **_five_labels(src, via))
    _assert_names_shapes(str(exc.value))


@pytest.mark.parametrize("via", ["num_labels", "config"])
def test_ignore_mismatched_sizes_loads_and_reports(via, tmp_path, caplog):
    three = make(BertForSequenceClassification, num_labels=3)
    src = saved(three, tmp_path / "three")
    with caplog.at_level(logging.WARNING, logger="bertlab"):
        model, info = BertForSequenceClassification.from_pretrained(
            src, ignore_mismatched_sizes=True, output_loading_info=True, **_five_labels(src, via)
        )
    assert model.config.num_labels == 5
    assert model.classifier.weight.shape == (5, 32)
    assert ("classifier.weight", (3, 32), (5, 32)) in info.mismatched_keys
    assert ("classifier.bias", (3,), (5,)) in info.mismatched_keys
    assert info.unexpected_keys == []
    assert any("classifier.weight" in r.getMessage() for r in caplog.records)
    assert_same_weights(model.bert, three.bert)
    with torch.no_grad():
        assert model(**inputs()).logits.shape == (2, 5)


# ================================================================================ bad folders
def test_folder_without_weights(tmp_path):
    CONFIG.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no weights"):
        BertModel.from_pretrained(tmp_path)


def test_nonexistent_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        BertModel.from_pretrained(tmp_path / "does-not-exist")


def test_truncated_safetensors(tmp_path):
    src = saved(make(), tmp_path)
    path = src / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        BertModel.from_pretrained(src)


def test_corrupted_bin_random_bytes(tmp_path):
    src = saved(make(), tmp_path / "src")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(random.Random(0).randbytes(4096))
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        BertModel.from_pretrained(src)


def test_corrupted_bin_never_escapes_as_another_error(tmp_path):
    """Whatever the random bytes, a corrupted pytorch_model.bin is a ValueError."""
    src = saved(make(), tmp_path / "src")
    (src / "model.safetensors").unlink()
    wrong = {}
    for seed in range(64):
        (src / "pytorch_model.bin").write_bytes(random.Random(seed).randbytes(4096))
        try:
            bertlab.read_state_dict(src)
        except ValueError:
            continue
        except Exception as e:  # collecting what escapes is the point
            wrong[seed] = f"{type(e).__name__}: {e}"
        else:
            wrong[seed] = "loaded"
    assert not wrong, f"not a ValueError for seeds {wrong}"


def test_truncated_bin(tmp_path):
    src = saved(make(), tmp_path / "src")
    state = load_file(str(src / "model.safetensors"))
    dst = write_bin_folder(state, src, tmp_path / "bin")
    data = (dst / "pytorch_model.bin").read_bytes()
    (dst / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        BertModel.from_pretrained(dst)


def test_config_of_another_model_type(tmp_path):
    src = saved(make(), tmp_path)
    config = json.loads((src / "config.json").read_text())
    config["model_type"] = "roberta"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="roberta"):
        BertModel.from_pretrained(src)


def test_config_that_is_not_json(tmp_path):
    src = saved(make(), tmp_path)
    (src / "config.json").write_text('{"model_type": "bert", "hidden_size": 32,')
    with pytest.raises(ValueError, match="config.json"):
        BertModel.from_pretrained(src)


# ================================================================================ saving
def test_save_pretrained_writes_exactly_two_files(tmp_path):
    model = make(BertForSequenceClassification)
    model.save_pretrained(tmp_path / "out")
    # Saving again over an existing folder leaves nothing behind either.
    model.save_pretrained(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["model_type"] == "bert"
    assert "attn_implementation" not in config
    assert len(config["id2label"]) == 3
    reloaded = BertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert_same_weights(reloaded, model)
    assert_same_outputs(reloaded, model)


def test_pretraining_model_keeps_decoder_tied(tmp_path):
    model = make(BertForPreTraining)
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight.data_ptr() == emb.data_ptr()
    src = saved(model, tmp_path)
    assert json.loads((src / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert "cls.predictions.bias" in load_file(str(src / "model.safetensors"))

    reloaded, info = BertForPreTraining.from_pretrained(src, output_loading_info=True)
    assert no_losses(info), info
    decoder = reloaded.cls.predictions.decoder.weight
    assert decoder.data_ptr() == reloaded.bert.embeddings.word_embeddings.weight.data_ptr()
    assert torch.equal(decoder, emb)
    assert_same_outputs(reloaded, model)
    # Still tied after the load: changing the embeddings changes the decoder.
    with torch.no_grad():
        reloaded.bert.embeddings.word_embeddings.weight[5].fill_(3.0)
    assert torch.all(reloaded.cls.predictions.decoder.weight[5] == 3.0)


def test_default_name_resolves_to_bundled_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no local folder called "default" can interfere
    bundled = bertlab.bundled_model_dir()
    assert bertlab.files.resolve_model_dir("default") == bundled
    model, info = BertModel.from_pretrained("default", output_loading_info=True)
    assert no_losses(info), info
    assert model.config.dtype == torch.float32  # a load records the dtype, as transformers
    assert model.config.replace(dtype=None) == BertConfig.from_pretrained(bundled)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (6, 384)
    state = load_file(str(bundled / "model.safetensors"))
    key = next(k for k in state if k.endswith("word_embeddings.weight"))
    assert torch.equal(model.embeddings.word_embeddings.weight, state[key])

"""The transformers surface of bertlab's models that the side-by-side snippets do not reach:
gradient checkpointing (activation memory measured, gradients equal), names from the local
Hugging Face cache, torch.hub, the Auto classes on other architectures, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

import bertlab
from bertlab import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

REPO = Path(__file__).resolve().parents[1]
TINY = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


def saved_activation_bytes(model, batch) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one forward (the
    activation memory a training step holds), parameters left out."""
    params = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(t):
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch)
    return total, out


def test_gradient_checkpointing_cuts_activation_memory_and_keeps_gradients():
    torch.manual_seed(0)
    config = BertConfig(**TINY, attn_implementation="sdpa")
    model = BertForMaskedLM(config).train()  # dropout on: the recomputation must redraw it
    ids = torch.randint(5, 120, (4, 48))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)

    def run(checkpointing: bool):
        if checkpointing:
            model.gradient_checkpointing_enable()
        else:
            model.gradient_checkpointing_disable()
        model.zero_grad()
        torch.manual_seed(1)
        saved, out = saved_activation_bytes(model, batch)
        out.loss.backward()
        return saved, out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain_bytes, plain_loss, plain_grads = run(False)
    ckpt_bytes, ckpt_loss, ckpt_grads = run(True)
    assert model.is_gradient_checkpointing
    assert torch.equal(plain_loss, ckpt_loss)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # Four layers: only each layer's input is kept instead of every intermediate.
    assert ckpt_bytes < plain_bytes / 3, (ckpt_bytes, plain_bytes)
    # In eval (or without grad) nothing is recomputed and outputs are unchanged.
    model.eval()
    with torch.no_grad():
        a = model(ids).logits
        model.gradient_checkpointing_disable()
        assert torch.equal(a, model(ids).logits)


def test_gradient_checkpointing_is_transformers_api():
    model = BertModel(BertConfig(**TINY))
    assert model.supports_gradient_checkpointing and not model.is_gradient_checkpointing
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert model.encoder.checkpoint_options == {"use_reentrant": True}
    model.train()
    model.enable_input_require_grads()  # what PEFT does: reentrant checkpoints need it
    out = model(torch.randint(5, 120, (2, 8)))
    out.last_hidden_state.sum().backward()
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None


# ---------------------------------------------------------------------------- the HF cache
def fake_cache(root: Path, repo: str, source: Path, revision: str = "main") -> Path:
    """The layout the Hugging Face libraries write: models--org--name/refs/<rev> holds a
    commit, snapshots/<commit>/ the files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / revision).write_text(commit)
    snapshot = base / "snapshots" / commit
    shutil.copytree(source, snapshot)
    return snapshot


@pytest.fixture(scope="module")
def small_folder(module_tmp) -> Path:
    torch.manual_seed(0)
    d = module_tmp.mktemp("small")
    BertForMaskedLM(BertConfig(**TINY)).save_pretrained(d)
    return d


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_name_in_the_local_hf_cache_loads_as_transformers_finds_it(
    small_folder, tmp_path, monkeypatch, variable
):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / ("cache" if variable == "HF_HUB_CACHE" else "home/hub")
    fake_cache(root, "bert-base-uncased", small_folder)
    monkeypatch.setenv(variable, str(root if variable == "HF_HUB_CACHE" else root.parent))
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    ours = BertForMaskedLM.from_pretrained("bert-base-uncased").eval()
    ref = transformers.BertForMaskedLM.from_pretrained(
        "bert-base-uncased",
        local_files_only=True,
        cache_dir=root,  # (it read the env at import)
    ).eval()
    ids = torch.randint(5, 120, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    assert bertlab.BertConfig.from_pretrained("bert-base-uncased").hidden_size == 32


def test_the_cache_under_its_google_bert_name_and_a_revision(small_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    fake_cache(tmp_path, "google-bert/bert-base-uncased", small_folder, revision="v1")
    model = BertModel.from_pretrained("bert-base-uncased", revision="v1", cache_dir=tmp_path)
    assert model.config.hidden_size == 32
    with pytest.raises(FileNotFoundError, match="at revision 'main'"):
        BertModel.from_pretrained("bert-base-uncased", revision="main")


def test_a_name_not_cached_says_where_it_looked_and_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        BertModel.from_pretrained("bert-base-uncased")
    message = str(e.value)
    assert str(tmp_path / "models--bert-base-uncased") in message
    assert "never downloads" in message and "'default'" in message
    assert "BertConfig.preset('base')" in message


def test_hub_keywords_are_accepted_and_never_saved(small_folder, tmp_path):
    model = BertForMaskedLM.from_pretrained(
        small_folder,
        cache_dir=str(tmp_path / "unused"),
        revision="main",
        force_download=False,
        local_files_only=True,
        token=None,
        trust_remote_code=False,
        low_cpu_mem_usage=True,
        device_map="cpu",
    )
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    for key in ("cache_dir", "revision", "force_download", "token", "device_map"):
        assert key not in saved
    with pytest.raises(TypeError, match="'not_a_keyword'"):
        BertForMaskedLM.from_pretrained(small_folder, not_a_keyword=1)
    with pytest.raises(ValueError, match="splits the model"):
        BertForMaskedLM.from_pretrained(small_folder, device_map={"bert": "cpu", "cls": "cpu"})
    with pytest.raises(ValueError, match="'int8'"):
        BertForMaskedLM.from_pretrained(small_folder, dtype="int8")
    with pytest.raises(ValueError, match="never uploads"):
        model.save_pretrained(tmp_path / "x", push_to_hub=True)


def test_torch_hub_load_from_a_local_clone():
    model = torch.hub.load(str(REPO), "model", "default", source="local")
    tok = torch.hub.load(str(REPO), "tokenizer", "default", source="local")
    mlm = torch.hub.load(str(REPO), "modelForMaskedLM", "default", source="local")
    assert isinstance(model, BertModel) and isinstance(mlm, BertForMaskedLM)
    enc = tok("the cat sat", return_tensors="pt")
    direct = BertModel.from_pretrained("default")
    with torch.no_grad():
        assert torch.equal(model(**enc).last_hidden_state, direct(**enc).last_hidden_state)
    qa = torch.hub.load(str(REPO), "modelForQuestionAnswering", "default", source="local")
    assert type(qa).__name__ == "BertForQuestionAnswering"


# ---------------------------------------------------------------------------- Auto, refusals
AUTO = {
    "AutoModel": "BertModel",
    "AutoModelForPreTraining": "BertForPreTraining",
    "AutoModelForMaskedLM": "BertForMaskedLM",
    "AutoModelForNextSentencePrediction": "BertForNextSentencePrediction",
    "AutoModelForSequenceClassification": "BertForSequenceClassification",
    "AutoModelForTokenClassification": "BertForTokenClassification",
    "AutoModelForQuestionAnswering": "BertForQuestionAnswering",
    "AutoModelForMultipleChoice": "BertForMultipleChoice",
}


@pytest.mark.parametrize("auto,cls", AUTO.items())
def test_auto_classes_give_the_class_transformers_gives(small_folder, auto, cls):
    ours = getattr(bertlab, auto).from_pretrained(small_folder)
    assert (
        type(ours).__name__
        == cls
        == type(getattr(transformers, auto).from_pretrained(small_folder)).__name__
    )
    fresh = getattr(bertlab, auto).from_config(bertlab.AutoConfig.from_pretrained(small_folder))
    assert type(fresh).__name__ == cls


@pytest.mark.parametrize(
    "config",
    [
        transformers.RobertaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        transformers.DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64),
    ],
    ids=["roberta", "distilbert"],
)
def test_another_architecture_is_refused_naming_it(tmp_path, config):
    config.save_pretrained(tmp_path)
    for load in (
        bertlab.AutoConfig.from_pretrained,
        bertlab.AutoModel.from_pretrained,
        BertModel.from_pretrained,
        bertlab.AutoTokenizer.from_pretrained,
    ):
        with pytest.raises(ValueError, match=f"'{config.model_type}'.*reads BERT only"):
            load(tmp_path)
    with pytest.raises(ValueError, match="'roberta'"):
        bertlab.AutoConfig.for_model("roberta")
    with pytest.raises(OSError, match="from_pretrained"):
        bertlab.AutoModel()


def test_resize_token_embeddings_grows_like_transformers_and_refuses_ids_in_use(small_folder):
    ours = BertForMaskedLM.from_pretrained(small_folder)
    ref = transformers.BertForMaskedLM.from_pretrained(small_folder)
    old = ours.get_input_embeddings().weight.detach().clone()
    for model in (ours, ref):
        emb = model.resize_token_embeddings(125, pad_to_multiple_of=8)
        assert emb.weight.shape == (128, 32) and model.config.vocab_size == 128
    assert torch.equal(ours.get_input_embeddings().weight[:120], old)
    assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight
    assert ours.cls.predictions.bias.shape == (128,)
    ids = torch.tensor([[2, 127, 5]])
    assert ours(ids).logits.shape == ref(ids).logits.shape == (1, 3, 128)
    ours.config.sep_token_id = 102
    with pytest.raises(ValueError, match="sep_token_id=102.*at least 103 rows"):
        ours.resize_token_embeddings(100)
    assert ours.get_input_embeddings().weight.shape[0] == 128  # nothing changed


def test_forward_keywords_trainer_passes_and_unknown_ones():
    model = BertForSequenceClassification(BertConfig(**TINY)).eval()
    ids = torch.randint(5, 120, (2, 6))
    out = model(ids, labels=torch.tensor([0, 1]), num_items_in_batch=torch.tensor(2))
    assert out.loss is not None
    with pytest.raises(TypeError, match="'output_hiden_states'"):
        model(ids, output_hiden_states=True)
    with pytest.raises(ValueError, match="head_mask"):
        model(ids, head_mask=torch.ones(4, 4))

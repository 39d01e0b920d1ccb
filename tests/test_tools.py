"""The tools people train transformers' models with, run on bertlab models: transformers'
Trainer (with its data collators), PEFT's LoRA, accelerate's Accelerator and
sentence-transformers. Each test trains or runs a few steps on a tiny model and checks what
could go wrong: the loss falls, it equals transformers' loss on the same weights, saved files
reload to the same outputs, merged adapters give the adapter model's logits.

The models are tiny (2 layers, hidden 32) over a vocabulary of the toy tasks' 28 words,
and every run is a few full-batch steps.
"""

from __future__ import annotations

import random

import pytest
import torch

import bertlab

transformers = pytest.importorskip("transformers", reason="Trainer and collators: a test extra")

# The words of the toy tasks: a sentence is positive when it holds a POSITIVE word (sequence
# classification), and every NAME is an entity (token classification). Each word is one token.
POSITIVE = ["good", "great", "fine", "nice", "lovely"]
NEGATIVE = ["bad", "awful", "poor", "sad", "dull"]
NAMES = ["alice", "bob", "carol", "paris", "london", "rome"]
FILLER = ["the", "movie", "film", "was", "is", "a", "very", "really", "with", "in", "and", "plot"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + POSITIVE + NEGATIVE + NAMES + FILLER

SMALL = dict(
    vocab_size=len(VOCAB),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)


def collator_tokenizer(folder):
    """The tokenizer that transformers' data collators pad with (they call its ``pad``),
    read from a model folder: bertlab's."""
    return bertlab.BertTokenizer.from_pretrained(folder)


def sentences(n: int, seed: int) -> tuple[list[str], list[int]]:
    """n toy sentences and their labels (1: a positive word in it)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = i % 2
        words = rng.choices(FILLER + NAMES, k=rng.randint(3, 9))
        words.insert(rng.randrange(len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def folder_with(model: bertlab.BertPreTrainedModel, path) -> str:
    """Save a model and the toy vocabulary into ``path``; return it as a string."""
    model.save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", "utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(module_tmp):
    path = module_tmp.mktemp("vocab")
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", "utf-8")
    return bertlab.BertTokenizer.from_pretrained(path)


def classification_data(tokenizer, n: int, seed: int) -> list[dict]:
    texts, labels = sentences(n, seed)
    enc = tokenizer(texts)
    return [
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": label}
        for ids, mask, types, label in zip(
            enc["input_ids"], enc["attention_mask"], enc["token_type_ids"], labels, strict=True
        )
    ]


def tagging_data(tokenizer, n: int, seed: int) -> list[dict]:
    """Rows tagged 1 on names, 0 elsewhere, -100 on [CLS] and [SEP] (one token per word)."""
    names = {tokenizer.vocab[w] for w in NAMES}
    rows = classification_data(tokenizer, n, seed)
    for row in rows:
        ids = row["input_ids"]
        row["labels"] = [-100] + [int(i in names) for i in ids[1:-1]] + [-100]
    return rows


def mlm_data(tokenizer, n: int, seed: int) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k != "labels"}
        for row in classification_data(tokenizer, n, seed)
    ]


def saved_model(cls_name: str, path, seed: int = 0, **config) -> str:
    """A bertlab model of class ``cls_name`` on the SMALL config, without dropout unless
    ``config`` says otherwise, saved with the toy vocabulary; returns the folder."""
    torch.manual_seed(seed)
    settings = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **SMALL, **config}
    model = getattr(bertlab, cls_name)(bertlab.BertConfig(**settings))
    return folder_with(model, path)


def training_args(path, **overrides):
    settings = dict(
        output_dir=str(path),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        max_steps=12,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return transformers.TrainingArguments(**{**settings, **overrides})


def losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def run_trainer(model, args, train, collator, eval_data=None):
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=train, eval_dataset=eval_data, data_collator=collator
    )
    trainer.train()
    return trainer


# ============================================================================ Trainer
def test_trainer_trains_sequence_classification_as_on_transformers_model(tokenizer, tmp_path):
    """The same Trainer run (seed, data, arguments) on bertlab's model (its default packed
    kernel) and on transformers' (sdpa) loaded from the same folder logs the same losses;
    evaluate, predict and save_model work on it."""
    folder = saved_model("BertForSequenceClassification", tmp_path / "model")
    train = classification_data(tokenizer, 16, seed=1)
    dev = classification_data(tokenizer, 20, seed=2)
    collator = transformers.DataCollatorWithPadding(collator_tokenizer(folder))

    model = bertlab.BertForSequenceClassification.from_pretrained(folder)
    trainer = transformers.Trainer(
        model=model,
        args=training_args(tmp_path / "run"),
        train_dataset=train,
        eval_dataset=train,
        data_collator=collator,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before / 2, (before, after)

    theirs = transformers.BertForSequenceClassification.from_pretrained(folder)
    reference = run_trainer(theirs, training_args(tmp_path / "ref"), train, collator)
    ours_losses, their_losses = losses(trainer), losses(reference)
    assert len(ours_losses) == 12
    assert ours_losses == pytest.approx(their_losses, abs=1e-4)

    predictions = trainer.predict(dev)
    assert predictions.predictions.shape == (20, 2)
    assert predictions.label_ids.tolist() == [row["labels"] for row in dev]
    assert predictions.metrics["test_loss"] == pytest.approx(trainer.evaluate(dev)["eval_loss"])

    # The Trainer saves a model that is not one of transformers' classes as its weights alone
    # (model.safetensors); the config is written beside them.
    trainer.save_model()
    if not (tmp_path / "run" / "config.json").is_file():
        with pytest.raises(FileNotFoundError, match="weights only"):  # says what to do
            bertlab.AutoModelForSequenceClassification.from_pretrained(tmp_path / "run")
    model.config.save_pretrained(tmp_path / "run")
    reloaded = bertlab.AutoModelForSequenceClassification.from_pretrained(tmp_path / "run")
    assert type(reloaded) is bertlab.BertForSequenceClassification
    batch = collator(dev[:6])
    batch.pop("labels")
    model.eval()
    with torch.no_grad():
        want = model(**batch).logits
        got = reloaded(**batch).logits
    assert (got - want).abs().max() < 1e-6
    assert (want - theirs.eval()(**batch).logits).abs().max() < 1e-4


def test_trainer_masked_lm_checkpoints_and_resumes(tokenizer, tmp_path):
    """MLM with transformers' masking collator: the losses of transformers' model on the same
    weights; checkpoints written mid-run (the tied decoder weight is saved once) from which a
    new Trainer resumes to the same losses; the saved model reloads, still tied."""
    folder = saved_model("BertForMaskedLM", tmp_path / "model")
    train = mlm_data(tokenizer, 16, seed=3)
    collator = transformers.DataCollatorForLanguageModeling(
        collator_tokenizer(folder), mlm_probability=0.3
    )
    args = training_args(tmp_path / "run", save_strategy="steps", save_steps=6)
    ours = run_trainer(bertlab.BertForMaskedLM.from_pretrained(folder), args, train, collator)
    theirs = run_trainer(
        transformers.BertForMaskedLM.from_pretrained(folder),
        training_args(tmp_path / "ref"),
        train,
        collator,
    )
    got = losses(ours)
    assert got == pytest.approx(losses(theirs), abs=1e-4)
    assert sum(got[-3:]) < sum(got[:3])

    resumed = transformers.Trainer(
        model=bertlab.BertForMaskedLM.from_pretrained(folder),
        args=training_args(tmp_path / "run"),
        train_dataset=train,
        data_collator=collator,
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-6"))
    assert losses(resumed)[-6:] == pytest.approx(got[-6:], abs=1e-6)

    ours.save_model(tmp_path / "saved")
    ours.model.config.save_pretrained(tmp_path / "saved")
    reloaded = bertlab.AutoModelForMaskedLM.from_pretrained(tmp_path / "saved").eval()
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    batch = collator_tokenizer(folder).pad(train[:4], return_tensors="pt")
    assert (logits_of(reloaded, batch) - logits_of(ours.model.eval(), batch)).abs().max() < 1e-6


@pytest.mark.parametrize("cls_name", ["BertForMaskedLM", "BertForPreTraining"])
def test_tied_decoder_weight_is_named_once_so_safetensors_saves_the_state_dict(tmp_path, cls_name):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = getattr(bertlab, cls_name)(bertlab.BertConfig(**SMALL))
    state = model.state_dict()
    assert "cls.predictions.decoder.weight" not in state
    save_file(state, tmp_path / "weights.safetensors")  # refuses two names for one tensor
    loaded = load_file(tmp_path / "weights.safetensors")
    fresh = getattr(bertlab, cls_name)(bertlab.BertConfig(**SMALL))
    fresh.load_state_dict(loaded)  # strict: nothing missing
    assert fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight
    assert torch.equal(fresh.get_output_embeddings().weight, model.get_input_embeddings().weight)
    # A state dict that names it (transformers' models do) loads as well.
    table = loaded["bert.embeddings.word_embeddings.weight"]
    named = {**loaded, "cls.predictions.decoder.weight": table}
    getattr(bertlab, cls_name)(bertlab.BertConfig(**SMALL)).load_state_dict(named)
    # Untied, the decoder is a weight of its own and keeps its name.
    untied = getattr(bertlab, cls_name)(bertlab.BertConfig(**SMALL, tie_word_embeddings=False))
    assert "cls.predictions.decoder.weight" in untied.state_dict()


def test_trainer_token_classification_with_its_collator(tokenizer, tmp_path):
    folder = saved_model("BertForTokenClassification", tmp_path / "model")
    train = tagging_data(tokenizer, 16, seed=4)
    collator = transformers.DataCollatorForTokenClassification(collator_tokenizer(folder))
    ours = run_trainer(
        bertlab.BertForTokenClassification.from_pretrained(folder),
        training_args(tmp_path / "run"),
        train,
        collator,
    )
    theirs = run_trainer(
        transformers.BertForTokenClassification.from_pretrained(folder),
        training_args(tmp_path / "ref"),
        train,
        collator,
    )
    got = losses(ours)
    assert got == pytest.approx(losses(theirs), abs=1e-4)
    assert sum(got[-3:]) < sum(got[:3])
    predictions = ours.predict(train[:5])
    T = max(len(row["input_ids"]) for row in train[:5])
    assert predictions.predictions.shape == (5, T, 2)


def test_gradient_accumulation_update_equals_one_doubled_batch(tokenizer, tmp_path):
    """bertlab's losses are batch means and it says so (accepts_loss_kwargs = False): the
    Trainer divides each micro-batch's loss by the accumulation steps, so two batches of 4
    accumulated move the weights as one batch of 8 does. Plain SGD, no clipping: AdamW's first
    step would hide a wrong scale (it divides the gradient by its own size)."""
    folder = saved_model("BertForSequenceClassification", tmp_path / "model")
    train = classification_data(tokenizer, 32, seed=5)
    collator = transformers.DataCollatorWithPadding(collator_tokenizer(folder))
    common = dict(
        max_steps=1,
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        logging_steps=100,
    )

    def weights_after(run: str, **args) -> dict[str, torch.Tensor]:
        model = bertlab.BertForSequenceClassification.from_pretrained(folder)
        run_trainer(model, training_args(tmp_path / run, **common, **args), train, collator)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    start = bertlab.BertForSequenceClassification.from_pretrained(folder).state_dict()
    accumulated = weights_after(
        "accumulated", per_device_train_batch_size=4, gradient_accumulation_steps=2
    )
    doubled = weights_after("doubled", per_device_train_batch_size=8)
    moved = max((accumulated[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3  # the update is not empty
    for key in start:
        assert (accumulated[key] - doubled[key]).abs().max() < 1e-5, key


# ============================================================================ PEFT
def lora_training(model, batch: dict, steps: int = 8) -> list[float]:
    """A few full-batch AdamW steps on the trainable (adapter) parameters; the losses."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    out = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        out.append(loss.item())
    model.eval()
    return out


def logits_of(model, batch: dict) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        return model(**inputs).logits


# transformers' own model warns when PEFT reads its is_gradient_checkpointing (renamed there).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(
    "cls_name, task_type, make_data, collator_class",
    [
        (
            "BertForSequenceClassification",
            "SEQ_CLS",
            classification_data,
            "DataCollatorWithPadding",
        ),
        (
            "BertForTokenClassification",
            "TOKEN_CLS",
            tagging_data,
            "DataCollatorForTokenClassification",
        ),
    ],
    ids=["sequence", "tokens"],
)
def test_lora_trains_saves_reloads_and_merges(
    tokenizer, tmp_path, capsys, cls_name, task_type, make_data, collator_class
):
    peft = pytest.importorskip("peft", reason="LoRA through PEFT: a test extra")
    # Weights drawn wider than BERT's 0.02, so the frozen random encoder tells the tokens
    # apart and a few adapter steps can fit the task.
    folder = saved_model(cls_name, tmp_path / "model", initializer_range=0.2)
    collator = getattr(transformers, collator_class)(collator_tokenizer(folder))
    batch = collator(make_data(tokenizer, 16, seed=6))
    cls = getattr(bertlab, cls_name)

    def lora() -> peft.LoraConfig:
        return peft.LoraConfig(task_type=task_type, r=4, target_modules=["query", "value"])

    model = peft.get_peft_model(cls.from_pretrained(folder), lora())
    reference = peft.get_peft_model(getattr(transformers, cls_name).from_pretrained(folder), lora())
    trainable, total = model.get_nb_trainable_parameters()
    assert (trainable, total) == reference.get_nb_trainable_parameters()
    # LoRA on query and value of 2 layers (r (H + H) each) and the classifier, which PEFT
    # trains in full for these tasks.
    assert trainable == 2 * 2 * 4 * (32 + 32) + (32 * 2 + 2)
    capsys.readouterr()
    model.print_trainable_parameters()
    reference.print_trainable_parameters()
    ours_line, their_line = capsys.readouterr().out.strip().splitlines()
    assert ours_line == their_line and f"{trainable:,}" in ours_line

    base_logits = logits_of(cls.from_pretrained(folder), batch)
    steps = lora_training(model, batch)
    assert steps[-1] < 0.75 * steps[0], steps
    adapted = logits_of(model, batch)
    assert (adapted - base_logits).abs().max() > 1e-2  # the adapter changed the outputs

    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    reloaded = peft.PeftModel.from_pretrained(cls.from_pretrained(folder), tmp_path / "adapter")
    assert (logits_of(reloaded, batch) - adapted).abs().max() < 1e-6

    merged = reloaded.merge_and_unload()
    assert type(merged) is cls
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert (logits_of(merged, batch) - adapted).abs().max() < 1e-5
    merged.save_pretrained(tmp_path / "merged")
    again = (
        bertlab.AutoModelForSequenceClassification
        if task_type == "SEQ_CLS"
        else (bertlab.AutoModelForTokenClassification)
    )
    assert (
        logits_of(again.from_pretrained(tmp_path / "merged"), batch) - adapted
    ).abs().max() < 1e-5


def test_trainer_on_a_lora_model_saves_the_adapter(tokenizer, tmp_path):
    peft = pytest.importorskip("peft", reason="LoRA through PEFT: a test extra")
    folder = saved_model("BertForSequenceClassification", tmp_path / "model", initializer_range=0.2)
    collator = transformers.DataCollatorWithPadding(collator_tokenizer(folder))
    train = classification_data(tokenizer, 16, seed=10)
    config = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"])
    model = peft.get_peft_model(
        bertlab.BertForSequenceClassification.from_pretrained(folder), config
    )
    trainer = run_trainer(model, training_args(tmp_path / "run", max_steps=8), train, collator)
    steps = losses(trainer)
    assert steps[-1] < 0.75 * steps[0], steps
    trainer.save_model()  # a PeftModel: the Trainer writes the adapter
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()
    fresh = bertlab.BertForSequenceClassification.from_pretrained(folder)
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "run")
    batch = collator(train)
    assert (logits_of(reloaded, batch) - logits_of(model.eval(), batch)).abs().max() < 1e-6


def test_lora_with_gradient_checkpointing_gives_the_same_gradients(tokenizer, tmp_path):
    """PEFT readies a checkpointed model through enable_input_require_grads (the embeddings are
    frozen, so without it the recomputed layers would give the adapters no gradient)."""
    peft = pytest.importorskip("peft", reason="LoRA through PEFT: a test extra")
    folder = saved_model("BertForSequenceClassification", tmp_path / "model")
    collator = transformers.DataCollatorWithPadding(collator_tokenizer(folder))
    batch = collator(classification_data(tokenizer, 8, seed=7))

    def lora_grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)  # the same LoRA initialisation
        base = bertlab.BertForSequenceClassification.from_pretrained(folder)
        if checkpointing:
            base.gradient_checkpointing_enable()
        config = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["query", "value"])
        model = peft.get_peft_model(base, config)
        # PEFT hooked the embeddings' output (enable_input_require_grads) only when asked to
        assert hasattr(base, "_require_grads_hook") == checkpointing
        calls = []
        base.bert.encoder.layer[0].register_forward_pre_hook(lambda *args: calls.append(1))
        with torch.no_grad():  # B starts at 0, which gives A no gradient: make it non-zero
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.1)
        model.train()
        model(**batch).loss.backward()
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in the backward pass
        return {n: p.grad for n, p in model.named_parameters() if "lora" in n}

    plain, recomputed = lora_grads(False), lora_grads(True)
    assert len(plain) == 8 and all(g is not None for g in recomputed.values())
    for name, grad in plain.items():
        assert grad.abs().max() > 0, name
        assert (recomputed[name] - grad).abs().max() < 1e-6, name


# ============================================================================ accelerate
def test_accelerate_trains_and_the_unwrapped_model_saves(tokenizer, tmp_path):
    accelerate = pytest.importorskip("accelerate", reason="a test extra")
    folder = saved_model("BertForSequenceClassification", tmp_path / "model")
    collator = transformers.DataCollatorWithPadding(collator_tokenizer(folder))
    rows = classification_data(tokenizer, 16, seed=8)
    loader = torch.utils.data.DataLoader(rows, batch_size=16, collate_fn=collator)
    accelerator = accelerate.Accelerator(cpu=True)
    model = bertlab.BertForSequenceClassification.from_pretrained(folder)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    steps = []
    for _ in range(12):
        for batch in loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps.append(loss.item())
    assert steps[-1] < steps[0] / 2, steps

    unwrapped = accelerator.unwrap_model(model)
    assert type(unwrapped) is bertlab.BertForSequenceClassification
    unwrapped.save_pretrained(tmp_path / "trained")
    reloaded = bertlab.AutoModelForSequenceClassification.from_pretrained(tmp_path / "trained")
    unwrapped.eval()
    batch = collator(rows)
    assert (logits_of(reloaded, batch) - logits_of(unwrapped, batch)).abs().max() < 1e-6
    assert (
        logits_of(reloaded, batch)
        - logits_of(bertlab.BertForSequenceClassification.from_pretrained(folder), batch)
    ).abs().max() > 1e-2  # what was saved is the trained model


# ============================================================================ sentence-transformers
def bertlab_sentence_transformer(model, tokenizer, max_length: int = 128):
    """A SentenceTransformer whose first module runs a bertlab model: the module below turns
    texts into the tokenizer's tensors and gives ``token_embeddings``; sentence-transformers'
    own mean Pooling and Normalize follow."""
    st = pytest.importorskip("sentence_transformers", reason="a test extra")
    from sentence_transformers.base.modules import InputModule, Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    class BertlabEncoder(InputModule):
        def __init__(self):
            super().__init__()
            self.auto_model = model
            self.tokenizer = tokenizer
            self.max_seq_length = max_length

        def preprocess(self, inputs, prompt=None, **kwargs) -> dict[str, torch.Tensor]:
            texts = [prompt + t for t in inputs] if prompt else list(inputs)
            enc = self.tokenizer(
                texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            return dict(enc)

        def forward(self, features: dict, **kwargs) -> dict:
            names = ("input_ids", "attention_mask", "token_type_ids")
            out = self.auto_model(**{k: features[k] for k in names if k in features})
            return {**features, "token_embeddings": out.last_hidden_state}

        def get_embedding_dimension(self) -> int:
            return model.config.hidden_size

        get_word_embedding_dimension = get_embedding_dimension

        def save(self, output_path: str, *args, **kwargs) -> None:
            model.save_pretrained(output_path)
            tokenizer.save_pretrained(output_path)

    encoder = BertlabEncoder()
    modules = [encoder, Pooling(model.config.hidden_size, "mean"), Normalize()]
    return st.SentenceTransformer(modules=modules, device="cpu")


TEXTS = [
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome",
    "bertlab reads the same checkpoints",
]


def test_sentence_transformer_on_a_bertlab_model_encodes_as_the_bundled_model():
    st = pytest.importorskip("sentence_transformers", reason="a test extra")
    folder = bertlab.bundled_model_dir()
    model = bertlab.BertModel.from_pretrained(folder).eval()
    ours = bertlab_sentence_transformer(model, bertlab.BertTokenizer.from_pretrained(folder))
    reference = st.SentenceTransformer(str(folder), device="cpu")
    got = ours.encode(TEXTS, convert_to_tensor=True)
    want = reference.encode(TEXTS, convert_to_tensor=True)
    assert got.shape == want.shape == (len(TEXTS), 384)
    assert (got - want).abs().max() < 1e-5
    assert (want[0] - want[1]).abs().max() > 1e-2  # different texts, different vectors


def test_sentence_transformers_loss_trains_a_bertlab_model(tokenizer, tmp_path):
    """Contrastive training with sentence-transformers' in-batch-negatives loss: each sentence
    should find its own reversed word order among the batch. The trained model saved by
    bertlab then loads in sentence-transformers' own Transformer module and encodes the same."""
    st = pytest.importorskip("sentence_transformers", reason="a test extra")
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    folder = saved_model("BertModel", tmp_path / "model", initializer_range=0.2)
    model = bertlab.BertModel.from_pretrained(folder)
    encoder = bertlab_sentence_transformer(model, tokenizer)
    loss_fn = MultipleNegativesRankingLoss(encoder)
    texts, _ = sentences(16, seed=9)
    reversed_texts = [" ".join(t.split()[::-1]) for t in texts]
    features = [encoder.preprocess(texts), encoder.preprocess(reversed_texts)]
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=3e-3)
    encoder.train()
    steps = []
    for _ in range(8):
        loss = loss_fn(features, labels=None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps.append(loss.item())
    assert steps[-1] < 0.75 * steps[0], steps

    encoder.eval()
    model.save_pretrained(tmp_path / "trained")
    tokenizer.save_pretrained(tmp_path / "trained")
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    standard = st.SentenceTransformer(
        modules=[Transformer(str(tmp_path / "trained")), Pooling(32, "mean"), Normalize()],
        device="cpu",
    )
    got = encoder.encode(texts[:4], convert_to_tensor=True)
    want = standard.encode(texts[:4], convert_to_tensor=True)
    assert (got - want).abs().max() < 1e-5

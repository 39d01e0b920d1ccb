"""A training step's memory (bertlab.train.memory): the estimate against the peak PyTorch's
memory tracker measures over steps of the real training loop, within a stated tolerance; a
batch size that cannot fit refused by pretrain and finetune, and by their commands, before any
step runs, with the estimate and the limit; a fine-tuning batch counted at its longest
sequence, not at --max-length; the README's demo and the defaults far from any limit; what is
available, read as documented."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import torch

import bertlab
import bertlab.train.finetune
import bertlab.train.memory as memory
import bertlab.train.pretrain
from bertlab.cli.main import main
from bertlab.data.corpus import prepare
from bertlab.nn.config import BertConfig, resolve_source
from bertlab.nn.heads import BertForPreTraining, BertForSequenceClassification
from bertlab.nn.model import BertModel
from bertlab.tasks.pretraining import PretrainingObjective
from bertlab.train.finetune import FinetuneConfig, finetune
from bertlab.train.loop import TrainConfig, train
from bertlab.train.memory import StepMemory, check_fits, gib, step_memory
from bertlab.train.pretrain import PretrainConfig, pretrain

try:  # PyTorch's tracker of tensor memory by kind (weights, gradients, optimizer, activations)
    from torch.distributed._tools.mem_tracker import MemTracker
except ImportError:  # a PyTorch built without torch.distributed
    MemTracker = None

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 2**30
# The estimate bounds the measured peak from above, and by at most this factor: it counts every
# part at its largest at once, where the real peak sees some of them freed.
TOLERANCE = 2.0


def never(*args, **kwargs):
    raise AssertionError("training started")


# ============================================================================ against a measure
def measured_peak(model, task, batch, precision="float32") -> int:
    """The peak of tensor memory over three steps of ``bertlab.train.loop.train`` on ``batch``
    (the first step allocates the optimizer's moments; the later ones hold them throughout)."""
    tracker = MemTracker()
    tracker.track_external(model)

    def data(step, micro):
        tracker.reset_mod_stats()  # the tracker follows one forward pass at a time
        return batch

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(out_dir=out, steps=3, precision=precision, checkpoints=False)
        with tracker:
            train(model, task, data, config)
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    return int(peak["Total"])


def pretraining_batch(rows, seq_len, vocab, every=7, padded=False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (rows, seq_len), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1:, seq_len // 2 :] = 0
    labels = torch.full_like(ids, -100)
    labels[:, ::every] = ids[:, ::every]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
        "labels": labels,
        "next_sentence_label": torch.zeros(rows, dtype=torch.long),
        "mlm_count": torch.tensor([float((labels != -100).sum())]),
        "nsp_count": torch.tensor([float(rows)]),
    }


def classify(model, batch):
    out = model(**batch)
    return out.loss, {"loss": out.loss.detach()}


def config(layers=2, hidden=64, heads=2, inner=256, vocab=1000) -> BertConfig:
    return BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=inner,
        vocab_size=vocab,
        max_position_embeddings=256,
    )


CASES = {
    # name: (config, head, rows, seq_len, precision, checkpointing)
    "pre-training": (config(), "pretraining", 8, 128, "float32", False),
    "pre-training, a 30,522-token vocabulary": (
        config(vocab=30522),
        "pretraining",
        16,
        64,
        "float32",
        False,
    ),
    "classification": (config(heads=4), "classify", 16, 64, "float32", False),
    "classification, a wider feed-forward": (
        config(inner=512),
        "classify",
        8,
        128,
        "float32",
        False,
    ),
    "classification, bfloat16 autocast": (config(), "classify", 8, 128, "bfloat16", False),
    "classification, gradient checkpointing": (
        config(layers=4),
        "classify",
        8,
        128,
        "float32",
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_estimate_bounds_the_measured_peak_within_the_tolerance(case):
    if MemTracker is None:
        pytest.skip("this PyTorch has no torch.distributed._tools.mem_tracker to measure with")
    cfg, head, rows, seq_len, precision, checkpointing = CASES[case]
    torch.manual_seed(0)
    if head == "pretraining":
        model, task = BertForPreTraining(cfg), PretrainingObjective()
        batch = pretraining_batch(rows, seq_len, cfg.vocab_size)
        predicted = -(-seq_len // 7)  # every 7th position, the first included
    else:
        model, task = BertForSequenceClassification(cfg), classify
        batch = pretraining_batch(rows, seq_len, cfg.vocab_size)
        batch = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        batch["labels"] = torch.zeros(rows, dtype=torch.long)
        predicted = 0
    if checkpointing:
        model.gradient_checkpointing_enable()
    parameters = sum(p.numel() for p in model.parameters())
    estimate = step_memory(
        cfg,
        parameters,
        rows,
        seq_len,
        predicted=predicted,
        precision=precision,
        checkpointing=checkpointing,
    )
    assert estimate.activations > estimate.model  # the batch's part is what is tested here
    peak = measured_peak(model, task, batch, precision)
    assert peak <= estimate.total <= TOLERANCE * peak, (case, peak, estimate)


def test_a_padded_batch_takes_less_than_the_full_length_the_estimate_counts():
    if MemTracker is None:
        pytest.skip("this PyTorch has no torch.distributed._tools.mem_tracker to measure with")
    torch.manual_seed(0)
    cfg = config()
    model = BertForPreTraining(cfg)
    batch = pretraining_batch(8, 128, cfg.vocab_size, padded=True)  # 7 rows half padding
    parameters = sum(p.numel() for p in model.parameters())
    estimate = step_memory(cfg, parameters, 8, 128, predicted=19)
    assert measured_peak(model, PretrainingObjective(), batch) <= estimate.total


def test_the_parts_follow_the_settings():
    cfg = config()
    plain = step_memory(cfg, 1000, 8, 128)
    assert (plain.weights, plain.gradients, plain.optimizer) == (4000, 4000, 8000)
    assert step_memory(cfg, 1000, 16, 128).activations == 2 * plain.activations  # per row
    assert step_memory(cfg, 1000, 8, 128, predicted=20).activations > plain.activations
    assert step_memory(cfg, 1000, 8, 128, checkpointing=True).activations < plain.activations
    bf16 = step_memory(cfg, 1000, 8, 128, precision="bfloat16")
    assert bf16.activations < plain.activations and bf16.weights == 6000
    longer = step_memory(cfg, 1000, 4, 256)  # as many tokens, each attending to twice as many
    assert longer.activations > plain.activations


# ============================================================================ the refusals
def test_check_fits_names_the_setting_the_estimate_and_the_limit(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda device: (int(22.1 * GIB), "here: 22.1 GiB"))
    estimate = StepMemory(
        weights=30 * 2**20,
        gradients=30 * 2**20,
        optimizer=60 * 2**20,
        activations=int(412.2 * GIB),
        rows=100_000,
        seq_len=128,
    )
    with pytest.raises(ValueError) as e:
        check_fits(estimate, "--batch-size 100000", "cpu")
    assert str(e.value) == (
        "--batch-size 100000 needs about 412.3 GiB for a training step (weights, gradients and "
        "optimizer state 120 MiB, activations 412.2 GiB for 100,000 sequences of 128 tokens); "
        "here: 22.1 GiB: about 5,333 sequences of 128 tokens fit"
    )
    small = step_memory(config(), 10_000, 8, 128)
    assert check_fits(small, "--batch-size 8", "cpu") is small
    monkeypatch.setattr(memory, "available", lambda device: None)  # unknown: nothing refused
    assert check_fits(estimate, "--batch-size 100000", "cpu") is estimate


@pytest.fixture(scope="module")
def corpus(module_tmp):
    root = module_tmp.mktemp("corpus")
    vocab = bertlab.bundled_model_dir()
    wikitext = FIXTURES / "wikitext2_sample.tokens"
    short = prepare(wikitext, vocab, root / "64", max_seq_length=64, progress=False)
    long = prepare(wikitext, vocab, root / "128", max_seq_length=128, progress=False)
    tiny = config(hidden=32, inner=64, vocab=30522)
    tiny.save_pretrained(root)
    return {"short": short, "long": long, "config": root / "config.json"}


def pretrain_config(corpus, out, **kw) -> PretrainConfig:
    steps = TrainConfig(out_dir=str(out), steps=10, grad_accum=kw.pop("grad_accum", 1))
    return PretrainConfig(data=str(corpus["short"]), train=steps, model=str(corpus["config"]), **kw)


def test_an_impossible_pretraining_batch_is_refused_before_any_step(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(bertlab.train.pretrain, "train", never)
    out = tmp_path / "run"
    with pytest.raises(ValueError) as e:  # this machine's own memory: no machine has 37 TiB
        pretrain(pretrain_config(corpus, out, batch_size=10_000_000))
    assert re.fullmatch(
        r"--batch-size 10000000 needs about [\d.]+ GiB for a training step \(weights, "
        r"gradients and optimizer state \d+ MiB, activations [\d.]+ GiB for 10,000,000 "
        r"sequences of 64 tokens\); this machine has [\d.]+ GiB available: about [\d,]+ "
        r"sequences of 64 tokens fit",
        str(e.value),
    ), str(e.value)
    assert not out.exists()  # nothing written: the run folder is made after the checks
    monkeypatch.setattr(memory, "available", lambda device: (8 * GIB, "here: 8.0 GiB"))
    long = dict(long_data=str(corpus["long"]), long_batch_size=100_000)
    with pytest.raises(ValueError, match=r"^--long-batch-size 100000 needs about .* of 128 tokens"):
        pretrain(pretrain_config(corpus, out, batch_size=8, **long))
    split = pretrain_config(corpus, out, batch_size=200_000, grad_accum=2)
    with pytest.raises(ValueError) as e:
        pretrain(split)
    assert str(e.value).startswith(
        "--batch-size 200000 (100,000 sequences a micro-batch in each process) needs about"
    )
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny(module_tmp) -> Path:
    """A 2-layer, 32-wide BERT on the bundled vocabulary."""
    folder = module_tmp.mktemp("tiny")
    torch.manual_seed(0)
    BertModel(config(hidden=32, inner=64, vocab=30522)).save_pretrained(folder)
    bertlab.BertTokenizer.from_pretrained("default").save_pretrained(folder)
    return folder


class Trained(Exception):
    """Raised where the training loop would have started."""


def reached(*args, **kwargs):
    raise Trained


def test_a_fine_tuning_batch_is_counted_at_its_longest_sequence(sst2, tiny, tmp_path, monkeypatch):
    """A batch is padded to its longest sequence: on short sentences a large --max-length costs
    nothing, and is not refused; a batch size whose batch of the longest sentences cannot fit
    is, before any step."""
    monkeypatch.setattr(memory, "available", lambda device: (100 * 2**20, "here: 100 MiB"))
    monkeypatch.setattr(bertlab.train.finetune, "train", reached)
    train = str(sst2 / "train.tsv")
    fits = FinetuneConfig(task="classify", train=train, model=str(tiny), max_length=512)
    prepared = bertlab.train.finetune.prepare(fits)
    longest = max(len(f["input_ids"]) for f in prepared.train.features)
    assert longest < 128  # SST-2 sentences; at 512 tokens a batch of 32 would not fit here:
    parameters = sum(p.numel() for p in prepared.model.parameters())
    assert step_memory(prepared.model.config, parameters, 32, 512).total > 100 * 2**20
    with pytest.raises(Trained):
        finetune(fits, tmp_path / "fits", progress=False)
    rows = len(prepared.train.features)  # a batch larger than the training set is all of it
    need = step_memory(prepared.model.config, parameters, rows, longest)
    room = need.total - need.activations // 2 - 4 * parameters  # the weights are built already
    monkeypatch.setattr(memory, "available", lambda device: (room, "here: so much"))
    too_many = FinetuneConfig(task="classify", train=train, model=str(tiny), batch_size=10**7)
    with pytest.raises(ValueError) as e:
        finetune(too_many, tmp_path / "run", progress=False)
    assert str(e.value) == (
        f"--batch-size 10000000 needs about {gib(need.total)} for a training step (weights, "
        f"gradients and optimizer state {gib(need.model)}, activations {gib(need.activations)} "
        f"for {rows:,} sequences of {longest} tokens); here: so much: about {rows // 2:,} "
        f"sequences of {longest} tokens fit"
    )
    assert not (tmp_path / "run").exists()


def test_the_commands_refuse_it_in_one_line(corpus, sst2, tiny, tmp_path, capsys, monkeypatch):
    argv = ["finetune", "classify", "--train", str(sst2 / "train.tsv"), "--model", str(tiny)]
    monkeypatch.setattr(memory, "available", lambda device: (20 * 2**20, "here: 20 MiB"))
    assert main([*argv, "-o", str(tmp_path / "f"), "--batch-size", "10000000"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("bertlab finetune: error: --batch-size 10000000 needs about ")
    assert err.count("\n") == 1 and "here: 20 MiB" in err and "Traceback" not in err
    monkeypatch.undo()  # this machine's own memory: no machine has 37 TiB
    argv = ["pretrain", "--data", str(corpus["short"]), "--model", str(corpus["config"])]
    assert main([*argv, "-o", str(tmp_path / "p"), "--batch-size", "10000000"]) == 2
    # pretrain says at once what it is checking (one line), then refuses in one line
    said, refusal = capsys.readouterr().err.splitlines()
    assert said.startswith("pretrain: checking the settings")
    assert refusal.startswith("bertlab pretrain: error: --batch-size 10000000 needs about ")
    assert not (tmp_path / "f").exists() and not (tmp_path / "p").exists()


def test_the_demo_and_the_defaults_are_far_from_any_limit():
    """What the README's demo fine-tunes (the bundled model, 32 sentences of 64 tokens) and
    the commands' defaults need: well under what any machine that runs bertlab has."""
    bundled = resolve_source("default").config
    weights = sum(p.numel() for p in BertForSequenceClassification(bundled).parameters())
    assert step_memory(bundled, weights, 32, 64).total < 1 * GIB
    assert step_memory(bundled, weights, 32, 128).total < 2 * GIB
    mini = BertConfig.preset("mini")
    pretraining = sum(p.numel() for p in BertForPreTraining(mini).parameters())
    assert step_memory(mini, pretraining, 32, 128, predicted=20).total < 1 * GIB


# ============================================================================ what is there
def test_what_is_available_is_read_as_documented(tmp_path, monkeypatch):
    free = memory.cpu_available()  # this machine's own: /proc/meminfo, or psutil
    assert free is None or free > 0
    monkeypatch.setattr(memory, "cpu_available", lambda: 8 * GIB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert memory.available("cpu") == (8 * GIB, "this machine has 8.0 GiB available")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's processes share the machine
    assert memory.available("cpu") == (
        2 * GIB,
        "this machine has 8.0 GiB available, 2.0 GiB for each of its 4 processes",
    )
    assert memory.available("meta") is None
    if not torch.cuda.is_available():
        assert memory.available("cuda") is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("123\n")
    assert memory.cgroup_room(v2) is None
    (v2 / "memory.max").write_text(f"{8 * GIB}\n")
    (v2 / "memory.current").write_text(f"{2 * GIB}\n")
    assert memory.cgroup_room(v2) == 6 * GIB
    assert memory.cgroup_room(tmp_path / "none") is None
    assert gib(412.3 * GIB) == "412.3 GiB" and gib(87 * 2**20) == "87 MiB"

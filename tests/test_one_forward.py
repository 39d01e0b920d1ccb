"""What is read is what runs: model.py's own ``BertLayer.forward`` computes the layer in every way
a model is run (eager in each dtype and kernel, int8, training, with hooks, with adapters,
compiled and exported), observed through the interpreter's profiler, not through a hook on a
module; and a model's modules keep the classes they were built as, whatever is done to it."""

import inspect
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import needs_int8
from torch import nn

from bertlab import BertConfig, BertForMaskedLM, BertModel
from bertlab.nn import cpu
from bertlab.nn import heads as heads_module
from bertlab.nn import model as model_module
from bertlab.nn.compiled import Compiled
from bertlab.nn.heads import HEADS
from bertlab.nn.model import BertLayer
from bertlab.nn.precision import quantize_int8

CFG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
)
LAYERS = CFG.num_hidden_layers


def model_and_batch(cls=BertModel, **changes):
    torch.manual_seed(0)
    model = cls(CFG.replace(**changes)).eval()
    ids = torch.randint(1, 99, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return model, ids, mask


def layer_calls(fn) -> int:
    """How many times the interpreter entered model.py's BertLayer.forward while ``fn`` ran."""
    code = BertLayer.forward.__code__
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code is code:
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return count


def inference(model, ids, mask, **kwargs):
    def run():
        with torch.inference_mode():
            model(ids, attention_mask=mask, **kwargs)

    return run


@pytest.mark.parametrize("kernel", ["packed", "sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_inference_runs_the_layer_forward_in_every_kernel_and_dtype(kernel, dtype):
    model, ids, mask = model_and_batch(attn_implementation=kernel)
    model.to(dtype)
    assert layer_calls(inference(model, ids, mask)) == LAYERS
    one = ids[:1, :5]  # one short sentence, the case module calls cost the most
    assert layer_calls(inference(model, one, None)) == LAYERS


@needs_int8
def test_int8_runs_the_layer_forward():
    model, ids, mask = model_and_batch()
    q = quantize_int8(model, calibrate=[{"input_ids": ids, "attention_mask": mask}])
    assert layer_calls(inference(q, ids, mask)) == LAYERS


def test_training_runs_the_layer_forward_with_and_without_recomputation():
    model, ids, mask = model_and_batch(BertForMaskedLM)
    model.train()
    labels = ids.masked_fill(mask == 0, -100)

    def step():
        model(ids, attention_mask=mask, labels=labels).loss.backward()

    assert layer_calls(step) == LAYERS
    model.gradient_checkpointing_enable()
    assert layer_calls(step) == 2 * LAYERS  # the forward, then again during backward


def test_a_hook_does_not_change_which_forward_runs():
    model, ids, mask = model_and_batch()
    with torch.inference_mode():
        want = model(ids, attention_mask=mask).last_hidden_state
    seen = []
    model.encoder.layer[0].attention.self.query.register_forward_hook(
        lambda m, i, o: seen.append(o.shape)
    )
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert layer_calls(inference(model, ids, mask)) == LAYERS
    finally:
        handle.remove()
    assert seen  # the hooked projection was called as a module
    with torch.inference_mode():
        got = model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_lora_adapters_run_inside_the_layer_forward():
    peft = pytest.importorskip("peft", reason="peft is a test extra: pip install -e '.[test]'")
    model, ids, mask = model_and_batch()
    adapted = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["query", "value"], init_lora_weights=False)
    )
    assert layer_calls(inference(adapted, ids, mask)) == LAYERS
    with torch.inference_mode():
        got = adapted(input_ids=ids, attention_mask=mask).last_hidden_state
        with adapted.disable_adapter():
            bare = adapted(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.allclose(got, bare)  # the adapters computed


def _forward_lines() -> range:
    lines, first = inspect.getsourcelines(BertLayer.forward)
    return range(first, first + len(lines))


def test_torch_compile_traces_the_layer_forward():
    """torch.compile's tracer reads the forward's bytecode rather than calling it: the graph it
    hands its backend names model.py's BertLayer.forward lines as the source of its nodes."""
    model, ids, mask = model_and_batch()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(ids, attention_mask=mask)
    torch._dynamo.reset()
    path, lines = Path(model_module.__file__).name, _forward_lines()
    traced = set()
    for gm in graphs:
        for node in gm.graph.nodes:
            for line in (node.meta.get("stack_trace") or "").splitlines():
                if f'{path}", line ' in line and ", in forward" in line:
                    number = int(line.split(", line ")[1].split(",")[0])
                    if number in lines:
                        traced.add(number)
    assert traced, "no node of the compiled graph came from BertLayer.forward"


def test_the_compiled_program_is_exported_from_the_layer_forward(monkeypatch):
    """Compiled(model) exports the model (torch.export runs the forward), then compiles the
    exported program; stopped after the export, the forward was seen to run."""
    if (why := Compiled.available()) is not None:
        pytest.skip(why)
    import torch._inductor

    class Exported(Exception):
        pass

    def stop(*args, **kwargs):
        raise Exported

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", stop)
    # the program whatever this CPU's class (where Compiled uses one is tests/test_cpu.py's)
    here = cpu.current()
    monkeypatch.setattr(
        cpu, "_CURRENT", [replace(here, compiled=frozenset({"float32"}), compiled_tokens={})]
    )
    model, ids, mask = model_and_batch()
    compiled = Compiled(model)

    def build():
        with torch.inference_mode(), pytest.raises(Exported):
            compiled(input_ids=ids[:1, :6])

    assert layer_calls(build) >= LAYERS


def test_torch_export_runs_the_layer_forward():
    """What the ONNX exporter and Compiled trace: torch.export of the model."""
    model, ids, mask = model_and_batch()

    def export():
        torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask})

    assert layer_calls(export) >= LAYERS


# ============================================================== the classes a model is made of
ALLOWED = {model_module.__name__, heads_module.__name__}


def foreign(model: nn.Module) -> list[str]:
    """Modules whose class comes from neither nn/model.py, nn/heads.py nor torch.nn."""
    return [
        f"{name}: {type(m).__module__}.{type(m).__name__}"
        for name, m in model.named_modules()
        if type(m).__module__ not in ALLOWED and not type(m).__module__.startswith("torch.nn.")
    ]


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_loaded_model_is_made_of_the_papers_classes_and_keeps_them(head, tmp_path):
    torch.manual_seed(0)
    HEADS[head](CFG.replace(num_labels=3)).save_pretrained(tmp_path)
    model = HEADS[head].from_pretrained(tmp_path)
    built = {name: type(m) for name, m in model.named_modules()}
    assert not foreign(model)
    for change in (
        lambda m: m.to(torch.bfloat16),
        lambda m: m.float(),
        lambda m: m.eval(),
        lambda m: m.train(),
        lambda m: m.to("cpu"),
        lambda m: m.half(),
        lambda m: m.double(),
        lambda m: m.requires_grad_(False),
        lambda m: m.set_fast_inference(False),
    ):
        change(model)
        assert {name: type(m) for name, m in model.named_modules()} == built
    ids = torch.randint(1, 99, (2, 6))
    model.float().eval()
    with torch.inference_mode():
        ids = ids.unsqueeze(1).expand(2, 2, 6) if head == "multiple-choice" else ids
        model(ids)
    assert {name: type(m) for name, m in model.named_modules()} == built


def test_no_method_of_nn_module_is_overridden_to_change_a_model_behind_its_back():
    for cls in (BertModel, *HEADS.values()):
        for name in ("_apply", "train", "eval", "to", "__setstate__"):
            assert getattr(cls, name) is getattr(nn.Module, name), f"{cls.__name__}.{name}"

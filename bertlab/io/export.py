"""Export: a model folder -> an ONNX file that onnxruntime runs, checked against the eager model.

    export_onnx(model_dir, out_dir, head="base") -> ExportReport

writes ``out_dir/model.onnx`` (inputs input_ids, attention_mask, token_type_ids; the batch and
sequence axes dynamic, and the choice axis of multiple choice), ``config.json`` and the
tokenizer files of the model folder. Before it reports success it runs the file in onnxruntime
on a batch of another shape than the one it was exported with, with padding, and compares
every output with the eager model's at the real tokens. Everything is written into a
temporary folder beside ``out_dir`` and renamed at the end: a failed export leaves nothing.

A packed model exports the padded "sdpa" computation (packing.py's docstring says why); the
results are the same at real tokens. The lower-level pieces (``example_inputs``,
``dynamic_shapes``, ``OutputTuple``) serve torch.export as well (tests/test_export.py).

onnx, onnxscript and onnxruntime are optional (``pip install bertlab[export]``): imported only
here, inside the functions that need them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertlab.files import replace_folder, resolve_model_dir
from bertlab.io.checkpoint import PT_BIN, PT_BIN_INDEX, SAFETENSORS, SAFETENSORS_INDEX
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import HEADS, head_of
from bertlab.nn.model import BertPreTrainedModel

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZER_FILES = (
    "vocab.txt",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
)
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PT_BIN, PT_BIN_INDEX)
DEFAULT_OPSET = 18
ATOL = 1e-4  # largest difference allowed between onnxruntime and the eager model
EXPORT_SHAPE = (2, 8)  # (B, T) of the batch traced
CHECK_SHAPE = (3, 13)  # (B, T) of the batch checked: another shape, so the axes must be dynamic
CHOICES = (2, 3)  # C of multiple choice: traced, checked
ONNX_EXTERNAL_ABOVE = 1 << 30  # bytes of weights above which they go to model.onnx.data


class ExportCheckError(ValueError):
    """The exported graph did not run in onnxruntime, or its outputs differ from eager."""


@dataclass(frozen=True)
class ExportReport:
    """What ``export_onnx`` wrote and how it checked it."""

    path: Path  # the model.onnx written
    head: str
    opset: int
    outputs: tuple[str, ...]  # the graph's output names, in order
    exported_shape: tuple[int, ...]  # input_ids shape traced
    checked_shape: tuple[int, ...]  # input_ids shape run in onnxruntime
    max_diff: float  # largest |onnxruntime - eager| at real tokens, over every output
    atol: float
    files: tuple[str, ...]  # every file of the output folder

    def __str__(self) -> str:
        return (
            f"wrote {self.path} (head {self.head}, opset {self.opset}, outputs "
            f"{', '.join(self.outputs)})\n"
            f"checked in onnxruntime: exported with input_ids {self.exported_shape}, run on "
            f"{self.checked_shape} with padding; largest difference from eager at real tokens "
            f"{self.max_diff:.3g} (tolerance {self.atol:g})\n"
            f"files: {', '.join(self.files)}"
        )


# ============================================================================ graph pieces
class OutputTuple(nn.Module):
    """The model with plain inputs and a tuple of its computed outputs (the fields that are
    not None, in order): what an ONNX graph can return, with names."""

    def __init__(self, model: BertPreTrainedModel):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T), or (B, C, T) for multiple choice
        attention_mask: torch.Tensor,  # the same shape, 1 = token, 0 = padding
        token_type_ids: torch.Tensor,  # the same shape
    ) -> tuple[torch.Tensor, ...]:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return tuple(getattr(out, n) for n in output_names(out))


def output_names(out: Any) -> tuple[str, ...]:
    """The fields of a model output that were computed."""
    return tuple(f.name for f in fields(out) if getattr(out, f.name) is not None)


def is_multiple_choice(model: nn.Module) -> bool:
    from bertlab.nn.heads import BertForMultipleChoice

    return isinstance(model, BertForMultipleChoice)


def example_inputs(
    config: BertConfig,
    batch: int,
    seq_len: int,
    choices: int | None = None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A batch of random token ids (B, T), or (B, C, T) with ``choices``: the first row full,
    the others padded at the right to shorter lengths, segment 1 on the second half of each
    row's tokens. Its shape is what matters to an export; its padding, to a check."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, seq_len) if choices is None else (batch, choices, seq_len)
    ids = torch.randint(1, config.vocab_size, shape, generator=g)
    rows = ids.reshape(-1, seq_len)
    lengths = torch.randint(1, seq_len + 1, (rows.shape[0],), generator=g)
    lengths[0] = seq_len  # one full row, so padding is not the same everywhere
    cols = torch.arange(seq_len)
    mask = (cols[None, :] < lengths[:, None]).long()
    types = ((cols[None, :] >= lengths[:, None] // 2) & mask.bool()).long()
    types = types.clamp(max=config.type_vocab_size - 1)
    return {
        "input_ids": (rows * mask).reshape(shape),
        "attention_mask": mask.reshape(shape),
        "token_type_ids": types.reshape(shape),
    }


def dynamic_shapes(multiple_choice: bool, max_len: int) -> dict[str, dict[int, Any]]:
    """torch.export dims for every input: batch and sequence (and choices) dynamic, the
    sequence at most ``max_len`` (max_position_embeddings)."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=1 << 16)
    seq = Dim("sequence", min=1, max=max_len)
    if multiple_choice:
        axes = {0: batch, 1: Dim("choices", min=1, max=64), 2: seq}
    else:
        axes = {0: batch, 1: seq}
    return {name: axes for name in INPUTS}


def _batches(model: BertPreTrainedModel) -> tuple[dict, dict]:
    """The batch to trace and the batch to check, of different shapes."""
    mc = is_multiple_choice(model)
    max_len = model.config.max_position_embeddings
    (b0, t0), (b1, t1) = EXPORT_SHAPE, CHECK_SHAPE
    c0, c1 = CHOICES if mc else (None, None)
    traced = example_inputs(model.config, b0, min(t0, max_len), c0, seed=0)
    checked = example_inputs(model.config, b1, min(t1, max_len), c1, seed=1)
    return traced, checked


def compare(
    got: tuple[torch.Tensor, ...],
    want: tuple[torch.Tensor, ...],
    names: tuple[str, ...],
    attention_mask: torch.Tensor,
) -> float:
    """Largest |got - want| over every output, per-token outputs at real tokens only (padding
    positions hold what a layout leaves there). attention_mask (B, T) or (B, C, T)."""
    if len(got) != len(want):
        raise ExportCheckError(f"the graph gave {len(got)} outputs, the model {len(want)}")
    real = attention_mask.bool()
    worst = 0.0
    for name, g, w in zip(names, got, want, strict=True):
        g, w = torch.as_tensor(g).detach(), w.detach()
        if tuple(g.shape) != tuple(w.shape):
            raise ExportCheckError(f"output {name}: shape {tuple(g.shape)}, eager {tuple(w.shape)}")
        if tuple(w.shape[: real.dim()]) == tuple(real.shape):
            g, w = g[real], w[real]
        worst = max(worst, float((g.float() - w.float()).abs().max()))
    return worst


# ============================================================================ ONNX
def _require_onnx() -> Any:
    """onnxruntime, or an error naming what to install."""
    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ModuleNotFoundError(
            f"ONNX export needs {', '.join(missing)}: pip install 'bertlab[export]' "
            f"(or pip install {' '.join(missing)})"
        )
    import onnxruntime

    return onnxruntime


def write_onnx(
    model: BertPreTrainedModel,
    path: Path,
    inputs: dict[str, torch.Tensor],
    opset: int = DEFAULT_OPSET,
) -> tuple[str, ...]:
    """torch.onnx.export (the dynamo exporter) of ``model`` traced on ``inputs``, every axis of
    the inputs dynamic. Returns the output names."""
    _require_onnx()
    with torch.no_grad():
        names = output_names(model(**inputs))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    # The exporter warns about its own renaming of axes and logs each step: not the user's news.
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            _export(model, path, inputs, names, opset, weights > ONNX_EXTERNAL_ABOVE)
        finally:
            quiet.setLevel(level)
    return names


def _export(
    model: BertPreTrainedModel,
    path: Path,
    inputs: dict[str, torch.Tensor],
    names: tuple[str, ...],
    opset: int,
    external_data: bool,
) -> None:
    torch.onnx.export(
        OutputTuple(model).eval(),
        (),
        str(path),
        kwargs=inputs,
        input_names=list(INPUTS),
        output_names=list(names),
        dynamic_shapes=dynamic_shapes(
            is_multiple_choice(model), model.config.max_position_embeddings
        ),
        opset_version=opset,
        dynamo=True,
        external_data=external_data,
        verbose=False,
    )


def check_onnx(
    path: Path, model: BertPreTrainedModel, inputs: dict[str, torch.Tensor], atol: float = ATOL
) -> float:
    """Run ``path`` in onnxruntime on ``inputs`` and compare with the eager model. Returns the
    largest difference at real tokens; raises ExportCheckError when onnxruntime cannot run the
    graph or the difference passes ``atol``."""
    ort = _require_onnx()
    with torch.no_grad():
        out = model(**inputs)
    names = output_names(out)
    want = tuple(getattr(out, n) for n in names)
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = session.run(list(names), {k: v.numpy() for k, v in inputs.items()})
    except Exception as e:  # onnxruntime raises its own types: any failure to run is one
        raise ExportCheckError(f"onnxruntime could not run {path.name}: {e}") from e
    diff = compare(tuple(got), want, names, inputs["attention_mask"])
    if not diff <= atol:  # NaN fails too
        shape = tuple(inputs["input_ids"].shape)
        raise ExportCheckError(
            f"onnxruntime's outputs differ from eager by {diff:.3g} at real tokens on input_ids "
            f"{shape}, more than the tolerance {atol:g}"
        )
    return diff


def _check_source(model_dir: Path) -> dict[str, Any]:
    """Refuse a folder that is not a BERT model with weights, before any work."""
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json: not a model folder")
    data = json.loads(config_file.read_text())
    model_type = data.get("model_type")
    if model_type != "bert":
        raise ValueError(
            f"{model_dir} holds a {model_type!r} model (config.json model_type); bertlab exports "
            "BERT models only (model_type 'bert')"
        )
    if not any((model_dir / f).is_file() for f in WEIGHT_FILES):
        raise FileNotFoundError(
            f"{model_dir} has no weights: expected one of {', '.join(WEIGHT_FILES)}"
        )
    return data


def export_onnx(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    head: str | None = None,
    opset: int = DEFAULT_OPSET,
    overwrite: bool = False,
    atol: float = ATOL,
) -> ExportReport:
    """Export the model in ``model_dir`` (a folder, or "default" for the bundled model) with
    ``head`` (a key of ``nn.heads.HEADS``; default: the one config.json's architectures names, else
    "base") to ``out_dir/model.onnx``, with config.json and the tokenizer files, after checking
    it in onnxruntime (see the module docstring). ``out_dir`` must not hold files unless
    ``overwrite``. Int8 export is not offered: quantise the ONNX file with onnxruntime's tools."""
    source = resolve_model_dir(model_dir)
    data = _check_source(source)
    head = head_of(data.get("architectures")) if head is None else head
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
    if not 7 <= opset <= 23:
        raise ValueError(f"opset {opset} is outside the range the exporter supports (7 to 23)")
    target = Path(out_dir)
    if target.resolve() == source.resolve() or target.resolve() in source.resolve().parents:
        raise ValueError(
            f"{target} holds the model folder {source}: export into another folder "
            "(--overwrite would delete the model)"
        )
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} is a file; expected a folder to write into")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(f"{target} already holds files; pass --overwrite to replace them")
    _require_onnx()

    model = HEADS[head].from_pretrained(source).eval()
    traced, checked = _batches(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp's folder is private; the exported one is an ordinary folder
        path = tmp / "model.onnx"
        names = write_onnx(model, path, traced, opset)
        diff = check_onnx(path, model, checked, atol)
        shutil.copyfile(source / "config.json", tmp / "config.json")
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
        replace_folder(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(
        path=target / "model.onnx",
        head=head,
        opset=opset,
        outputs=names,
        exported_shape=tuple(traced["input_ids"].shape),
        checked_shape=tuple(checked["input_ids"].shape),
        max_diff=diff,
        atol=atol,
        files=tuple(sorted(p.name for p in target.iterdir())),
    )

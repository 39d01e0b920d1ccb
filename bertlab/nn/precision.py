"""Lower-precision inference: int8 dynamic quantisation of the linear layers (CPU).

bfloat16 needs nothing here: ``model.to(torch.bfloat16)`` (or ``from_pretrained(dir,
dtype=torch.bfloat16)``) for inference, ``torch.autocast(device, torch.bfloat16)`` for training.
``torch.compile(model)`` works on every kernel; ``tests/test_precision.py`` holds it to the
eager results.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose nn.Linear layers run in int8 with dynamic activation scales
    (CPU inference only). Weights are quantised once, per output channel; activations per
    call. What it costs in accuracy is measured by ``bertlab bench int8``, not assumed."""
    try:
        from torch.ao.quantization import quantize_dynamic
    except ImportError as e:  # pragma: no cover - a PyTorch without eager-mode quantisation
        raise RuntimeError(f"PyTorch {torch.__version__} has no dynamic quantisation") from e
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 dynamic quantisation runs on the CPU: move the model there first")
    with warnings.catch_warnings():
        # PyTorch marks its eager-mode quantisation API as deprecated; it is still the one that
        # ships with it. bertlab moves when it goes.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        import copy

        from torch.ao.quantization import per_channel_dynamic_qconfig

        # One scale per output row of each weight: far less error than one per tensor.
        spec = {nn.Linear: per_channel_dynamic_qconfig}
        return quantize_dynamic(copy.deepcopy(model).float().eval(), spec, torch.qint8)

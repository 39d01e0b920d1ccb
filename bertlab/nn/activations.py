"""The activation functions a config can name (``hidden_act``): one table.

Each entry gives the module the network holds (``BertIntermediate.intermediate_act_fn``, the
MLM head's ``transform_act_fn``), the same function overwriting its input (for an output that no
gradient will read), and oneDNN's name for it, by which the linear-product seam (products.py)
applies it inside the product that feeds it. A leaf: it imports nothing of bertlab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Activation:
    name: str  # as a config names it
    module: Callable[[], nn.Module]  # what the network holds
    inplace: Callable[[torch.Tensor], torch.Tensor]  # the same function, overwriting its input
    onednn: tuple[str, str]  # oneDNN's (attribute, algorithm) for a fused epilogue


ACTIVATIONS: dict[str, Activation] = {
    a.name: a
    for a in (
        # exact, with erf: what BERT uses
        Activation("gelu", nn.GELU, lambda t: torch.ops.aten.gelu_(t), ("gelu", "none")),
        # the tanh form of the original TensorFlow code
        Activation(
            "gelu_new",
            lambda: nn.GELU(approximate="tanh"),
            lambda t: torch.ops.aten.gelu_(t, approximate="tanh"),
            ("gelu", "tanh"),
        ),
        Activation("relu", nn.ReLU, torch.relu_, ("relu", "")),
        Activation("silu", nn.SiLU, lambda t: F.silu(t, inplace=True), ("swish", "")),
    )
}


def _identity(module: nn.Module) -> tuple[type, str | None]:
    return type(module), module.__dict__.get("approximate")  # (GELU's form; None for others)


_BY_MODULE = {_identity(a.module()): a for a in ACTIVATIONS.values()}


def activation_of(module: nn.Module) -> Activation | None:
    """The table's entry that ``module`` computes; None for a module that is not one of them
    (a user's own activation: it is then called as it is)."""
    return _BY_MODULE.get(_identity(module))

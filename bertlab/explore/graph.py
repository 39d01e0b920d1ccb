"""The network as a graph, what keras' ``plot_model`` draws for reference 004: every module the
forward pass calls, in call order, nested as the modules are, with the shapes that went in and
came out and the parameters it holds.

It is recorded from a real call (hooks on every module), not written down by hand, so it shows
the model that ran. Four of BERT's steps are arithmetic inside a module's forward rather than
modules of their own (the sum of the three embeddings, the attention scores and softmax, the
residual sums); they are added as ``op`` nodes, and the sibling modules that run side by side
(the three embedding lookups; query, key and value) are grouped as ``parallel``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Node = dict[str, Any]
# a module inside encoder layer N, in a base model ("encoder.layer.3...") or a head model's base
IN_LAYER = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)(?:\.|$)")


def shape_of(x: Any) -> str:
    """ "(1, 12, 384)" for a tensor; the first tensor of a tuple or output; "" for anything else."""
    if isinstance(x, torch.Tensor):
        return "(" + ", ".join(map(str, x.shape)) + ")"
    if isinstance(x, dict):
        x = tuple(v for v in x.values() if v is not None)
    if isinstance(x, tuple | list) and x:
        return shape_of(x[0])
    return ""


def network_graph(
    model: nn.Module, inputs: dict[str, torch.Tensor], call: Callable[[], Any]
) -> tuple[Node, Any]:
    """Run ``call()`` (a forward pass of ``model`` on ``inputs``) with every module watched;
    returns the tree of what was called (see the module docstring) and ``call()``'s result."""
    names = {m: n for n, m in model.named_modules()}
    root: Node = _node("", model, inputs)
    stack = [root]
    seen: set[int] = set()  # parameters counted once (a tied decoder is not counted again)
    handles = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        node = _node(names[module], module, args or kwargs)
        stack[-1]["children"].append(node)
        stack.append(node)

    def post(module: nn.Module, args: tuple, out: Any) -> None:
        node = stack.pop()
        node["out"] = shape_of(out)
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        node["params"] = sum(p.numel() for p in own) + sum(c["params"] for c in node["children"])

    for module in names:
        if module is not model:
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post))
    try:
        result = call()
    finally:
        for h in handles:
            h.remove()
    root["out"] = shape_of(result)
    root["params"] = sum(c["params"] for c in root["children"])
    _reshape(root)
    return root, result


def _node(name: str, module: nn.Module, args: tuple) -> Node:
    m = IN_LAYER.search(name)
    return {
        "id": name or "model",
        "name": name.rsplit(".", 1)[-1] or type(module).__name__,
        "class": type(module).__name__,
        "in": shape_of(args),
        "out": "",
        "params": 0,
        "layer": int(m.group(1)) if m else None,
        "op": False,
        "parallel": False,
        "residual": False,
        "children": [],
        "_heads": getattr(module, "num_heads", None),  # for the shape of the scores
    }


def _op(parent: Node, name: str, shape: str) -> Node:
    return {
        "id": f"{parent['id']}.{name}",
        "name": name,
        "class": "op",
        "in": shape,
        "out": shape,
        "params": 0,
        "layer": parent["layer"],
        "op": True,
        "parallel": False,
        "residual": False,
        "children": [],
    }


def _group(parent: Node, name: str, children: list[Node], **flags: bool) -> Node:
    node = _op(parent, name, children[0]["in"])
    node.update(op=False, children=children, **flags)
    node["class"] = "group"
    node["out"] = children[0 if flags.get("parallel") else -1]["out"]
    node["params"] = sum(c["params"] for c in children)
    return node


def _take(node: Node, *names: str) -> list[Node]:
    """The children of ``node`` with these names, in call order (removed from it)."""
    taken = [c for c in node["children"] if c["name"] in names]
    node["children"] = [c for c in node["children"] if c["name"] not in names]
    return taken


def _reshape(node: Node) -> None:
    """Add the op nodes and groups of the module docstring, by the paper's class names."""
    for child in node["children"]:
        _reshape(child)
    kids = node["children"]
    kind = node["class"]
    if kind == "BertEmbeddings" and kids:
        lookups = _take(node, "word_embeddings", "token_type_embeddings", "position_embeddings")
        add = _op(node, "add (word + segment + position)", lookups[0]["out"])
        node["children"] = [_group(node, "lookups", lookups, parallel=True), add, *node["children"]]
    elif kind == "BertSelfAttention" and kids:
        qkv = _group(node, "projections", list(kids), parallel=True)
        B, T, _ = node["in"].strip("()").split(", ")
        scores = f"({B}, {node['_heads']}, {T}, {T})"
        node["children"] = [
            qkv,
            _op(node, "scores = q·kᵀ/√D + mask", scores),
            _op(node, "softmax over keys", scores),
            _op(node, "weights · v, heads merged", node["in"]),
        ]
    elif kind in ("BertSelfOutput", "BertOutput") and kids:
        norm = _take(node, "LayerNorm")
        node["children"] = [*node["children"], _op(node, "add (residual)", node["out"]), *norm]
    elif kind == "BertAttention":
        node["residual"] = True
    elif kind == "BertLayer" and len(kids) == 3:
        ffn = _group(node, "feed-forward", kids[1:], residual=True)
        node["children"] = [kids[0], ffn]
    node.pop("_heads", None)

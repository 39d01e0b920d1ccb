"""Attention kernels. Every kernel has one signature and is picked by name from ``BACKENDS``.

    kernel(q, k, v, layout, dropout_p, need_weights) -> (context, probs or None)

Padded kernels ("eager", "sdpa", "aligned"):
    q, k, v: (B, A, T, D)  queries, keys, values per head (A heads of size D)
    layout:  (B, T) bool, True where a key is a real token, or None when there is no padding
    context: (B, A, T, D)  softmax(q k^T / sqrt(D) + mask) v
    probs:   (B, A, T, T)  the attention probabilities, or None when the kernel cannot give them
The packed kernel ("packed"):
    q, k, v: (N, A, D)     the real tokens only, sequence after sequence (in bfloat16 CPU
                           inference, then spare rows that no sequence reads: round_rows)
    layout:  a packing.Packing, which says where each sequence starts
    context: (N, A, D)     each sequence attends over its own tokens only; probs is None

The kernel is named once, by the config's attn_implementation; BertModel puts it in the batch's
layout (packing.enter), and every attention layer calls ``BACKENDS[layout.kernel]``. Under
torch.compile the "packed" name runs the padded "aligned" kernel, and under torch.export and ONNX
export the padded "sdpa" kernel (one graph with dynamic batch and length; the same numbers at
real tokens): packing.py's docstring says why.

Padding keys get a score of the dtype's most negative value, so their probability is exactly 0
(as in the reference implementation) and a padded row equals the same sequence alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bertlab.nn import avx2, cpu
from bertlab.nn.packing import WINDOW_ALIGN, Packing, WindowGroup, tracing


@functools.cache
def varlen_kernel() -> Callable[..., torch.Tensor] | None:
    """PyTorch's variable-length flash attention (CUDA, half precision), None where this PyTorch
    has none. Imported on first use: its module imports torch._dynamo, which about doubled the
    time of every ``import bertlab``, and only CUDA runs call it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # pragma: no cover - older PyTorch
        return None
    return varlen_attn


Kernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float, bool],
    tuple[torch.Tensor, torch.Tensor | None],
]


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention equation written out (Vaswani et al. 2017, eq. 1). Returns probabilities."""
    scale = q.size(-1) ** -0.5  # multiplied, not divided, to round as the reference does
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, A, T, T)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    context = torch.matmul(F.dropout(probs, p=dropout_p), v)  # (B, A, T, D)
    return context, probs if need_weights else None


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """PyTorch's fused scaled_dot_product_attention. Cannot return probabilities: when they are
    asked for, the model runs ``eager_attention`` for that call instead."""
    if need_weights:
        return eager_attention(q, k, v, mask, dropout_p, need_weights)
    attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T) bool
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p), None


def aligned_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sdpa_attention`` over keys and values padded to a multiple of WINDOW_ALIGN, the added
    keys masked out: the same numbers, faster on the CPU. PyTorch's CPU attention kernel works
    in blocks, and runs a key length just short of a multiple of its block (15 keys) at up to
    several times the time of the multiple (16 keys). The compiled graph runs this kernel
    (packing.enter), where the padding is one fused copy of the keys and values; in eager mode
    the copies cost more than they save at some sizes, and exported graphs keep the plain
    equation that other runtimes recognise.

    In a program bertlab compiles itself where float32 runs on bertlab's AVX2 kernels (the
    products are its operators there: avx2.ops), the attention is its operator too,
    ``torch.ops.bertlab.attention``: each row's real tokens as one sequence of
    ``avx2.attention`` where they come first and number at most ATTENTION_TOKENS, PyTorch's
    kernel otherwise."""
    if need_weights:
        return eager_attention(q, k, v, mask, dropout_p, need_weights)
    if _as_operator(q, dropout_p):
        return torch.ops.bertlab.attention(q, k, v, mask, avx2.ATTENTION_TOKENS), None
    T = k.shape[-2]
    pad = -T % WINDOW_ALIGN
    k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
    if mask is None:
        keys = (torch.arange(T + pad, device=q.device) < T)[None]  # (1, T + pad)
    else:
        keys = F.pad(mask, (0, pad))  # (B, T + pad), False where added
    return sdpa_attention(q, k, v, keys, dropout_p, False)


def _as_operator(q: torch.Tensor, dropout_p: float) -> bool:
    """A graph traced for a program of bertlab's own that calls its AVX2 kernels as operators
    (avx2.traced_as_operators), float32 inference, the policy's float32 kernel bertlab's own, D a
    multiple of 8."""
    return (
        q.dtype == torch.float32
        and dropout_p == 0.0
        and q.shape[-1] % 8 == 0
        and cpu.current().float32_kernel in cpu.OWN_FLOAT32
        and avx2.traced_as_operators()
    )


def varlen_ok(q: torch.Tensor, dropout_p: float) -> bool:
    """True when PyTorch's variable-length flash kernel can take the packed batch in one call:
    CUDA, half precision, no dropout (the kernel has none)."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and dropout_p == 0.0
        and varlen_kernel() is not None
    )


def _on_avx2(q: torch.Tensor, dropout_p: float, packing: Packing) -> bool:
    """Inference in float32 where the policy runs bertlab's AVX2 kernels (cpu.py) and they
    loaded, on sequences of at most ``avx2.ATTENTION_TOKENS`` tokens, D a multiple of 8."""
    return (
        q.dtype == torch.float32
        and q.is_cpu
        and not q.requires_grad
        and dropout_p == 0.0
        and packing.max_seqlen <= avx2.ATTENTION_TOKENS
        and q.shape[-1] % 8 == 0
        and q.stride()[1:] == (q.shape[-1], 1)
        and cpu.current().float32_kernel in cpu.OWN_FLOAT32
        and avx2.load() is None
        and not tracing()
    )


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    packing: Packing,
    dropout_p: float,
    need_weights: bool = False,
) -> tuple[torch.Tensor, None]:
    """Attention over packed tokens, each sequence on its own, no padding computed.

    In float32 inference where the CPU policy runs bertlab's AVX2 kernels (avx2.py), batches
    whose sequences are at most ``avx2.ATTENTION_TOKENS`` long run there, in one call: each
    sequence over its own tokens, nothing padded or gathered. Otherwise, a batch without padding
    runs as one batched SDPA call. On CUDA in half precision without
    dropout, PyTorch's variable-length flash kernel does all sequences in one call. Otherwise
    each sequence is one small SDPA call on a view of the packed tensor (faster than the
    written-out equation in bfloat16 and as fast in float32, and closer to float32 in bfloat16
    because its softmax never rounds the scores), over a window rounded to 16 rows whose
    borrowed keys are masked out (``Packing.windows``: the kernel works in blocks, and a length
    just short of one costs nearly the next one's time). Windows of one width are gathered and
    run as one batched call (``Packing.window_groups``; the same numbers, bit for bit): fewer,
    larger calls, which matters most in bfloat16, where the products are fast and attention is
    a larger share of the time. When gradients are recorded, the written-out equation runs
    instead, on each sequence's own rows: its backward makes a fine-tuning step a little
    cheaper. (The measurements behind these choices: docs/performance.md.)"""
    if need_weights:
        raise ValueError("the packed kernel does not return attention probabilities")
    N, A, D = q.shape
    if _on_avx2(q, dropout_p, packing):  # bertlab's kernel: every sequence on its own tokens
        out = avx2.attention(q, k, v, packing.cu_seqlens, packing.max_seqlen)
        if N > packing.total:
            out[packing.total :] = 0  # spare rows
        return out, None
    if packing.dense:  # (B*T, A, D) -> (B, A, T, D)
        B, T = packing.batch, packing.seq_len

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, A, D).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), dropout_p=dropout_p)
        return out.transpose(1, 2).reshape(N, A, D), None
    if varlen_ok(q, dropout_p):
        cu, m = packing.cu_seqlens, packing.max_seqlen
        return varlen_kernel()(q, k, v, cu, cu, m, m), None
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, A, N, D) views
    if q.requires_grad:
        # Training: one sequence at a time through the written-out equation, whose backward is
        # the cheaper one; the pieces are joined by cat, which autograd can differentiate.
        pieces, start = [], 0
        for n in packing.lengths:
            s = slice(start, start + n)
            o = eager_attention(qh[:, :, s], kh[:, :, s], vh[:, :, s], None, dropout_p, False)[0]
            pieces.append(o[0].transpose(0, 1))  # (n, A, D)
            start += n
        return torch.cat(pieces), None
    # Inference: one SDPA call per sequence on a window of the packed tensor rounded up to a
    # multiple of 16 rows (Packing.windows), each result written straight into the output.
    out = torch.empty_like(q)  # (N, A, D); rows past the last sequence (spare rows) are zeros
    out[packing.total :] = 0
    for w in packing.window_groups(N, q.dtype, q.device):
        if isinstance(w, WindowGroup):  # k windows of one width: gathered, one call
            count, width = w.count, w.width
            qg, kg, vg = (
                t.index_select(0, w.rows).view(count, width, A, D).transpose(1, 2)
                for t in (q, k, v)
            )  # (count, A, width, D)
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=w.mask, dropout_p=dropout_p)
            o = o.transpose(1, 2).reshape(count * width, A, D)
            out.index_copy_(0, w.to, o.index_select(0, w.own))
            continue
        s = slice(w.first, w.first + w.width)
        o = F.scaled_dot_product_attention(
            qh[:, :, s], kh[:, :, s], vh[:, :, s], attn_mask=w.mask, dropout_p=dropout_p
        )  # (1, A, width, D)
        out[w.start : w.start + w.n] = o[0, :, w.own : w.own + w.n].transpose(0, 1)
    return out, None


BACKENDS: dict[str, Kernel] = {
    "eager": eager_attention,
    "sdpa": sdpa_attention,
    "aligned": aligned_attention,
    "packed": packed_attention,
}

"""How a batch is laid out inside the encoder, behind one enter/exit seam.

    layout = enter(kernel, attention_mask, B, T, device, spare_rows)
    x = layout.grow(embeddings(*layout.inputs(input_ids, token_type_ids, position_ids, ...)))
    x = encoder(x, layout)          # every attention layer reads layout.kernel and its keys
    hidden = layout.exit(x)         # (B, T, H) padded, or (N, H) packed without spare rows
    layout.pad(per_token_output)    # -> (B, T, ...), for the outputs a user sees

Two layouts: ``Padded`` (the "eager", "sdpa" and "aligned" kernels: (B, T, ...) with a (B, T)
key mask) and ``Packing`` (the "packed" kernel, below).

Under torch.compile, torch.export and ONNX export a packed model runs the padded layout: the
packed token count N is data (how many ones the mask holds), and a graph whose shapes follow it
would be specialised or recompiled per batch. The padded computation gives the same numbers at
the real tokens (tests/test_packed.py holds packed = sdpa there), so one graph with dynamic batch
and sequence length serves every batch (tests/test_export.py). Its attention is the "aligned"
kernel under torch.compile and in the programs bertlab compiles itself (keys padded to a
multiple of WINDOW_ALIGN, as the packed kernel's windows are; ``aligned_export``), and the plain
"sdpa" kernel in exported files.

The packed (unpadded) layout:

A padded batch (B, T, ...) with an attention mask holds N <= B*T real tokens. Packed, those N
tokens sit one after another in an (N, ...) tensor, sequence by sequence; ``cu_seqlens`` gives
where each sequence starts (sequence b is rows cu_seqlens[b]:cu_seqlens[b+1]). Every linear
layer, LayerNorm and activation then runs on real tokens only; attention runs per sequence.

When a batch has no padding at all, packing is the identity: the (B*T, ...) view of the batch,
and attention can run batched (``Packing.dense``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

_IS_EXPORTING = getattr(torch.compiler, "is_exporting", None)  # (not in every PyTorch)
_IS_COMPILING = torch.compiler.is_compiling
_JIT_TRACING = torch.jit.is_tracing


def exporting() -> bool:
    """True while torch.export or ONNX export traces the model. Where PyTorch keeps the flag
    that torch.export sets, the flag is read: torch.compile of PyTorch 2.9 (2.9.1) answers
    ``torch.compiler.is_exporting()`` with True anywhere it traces."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is not None:
        return bool(flag)
    return _IS_EXPORTING is not None and bool(_IS_EXPORTING())


_ALIGNED = contextvars.ContextVar("bertlab_aligned_export", default=False)


@contextlib.contextmanager
def aligned_export() -> Iterator[None]:
    """Within it, an exported packed model runs the "aligned" attention kernel, as torch.compile
    does, instead of the plain "sdpa" one: for graphs that bertlab compiles itself
    (nn/compiled.py), never for files that other runtimes read."""
    token = _ALIGNED.set(True)
    try:
        yield
    finally:
        _ALIGNED.reset(token)


def own_program() -> bool:
    """True while a program that bertlab compiles itself is exported (inside ``aligned_export``):
    it may call bertlab's own operators (avx2.ops), which no other runtime has."""
    return exporting() and _ALIGNED.get()  # (torch.export only: dynamo cannot read it)


def tracing() -> bool:
    """True while torch.compile, torch.export, ONNX export or torch.jit traces the model: then
    nothing may depend on the values in a tensor (data-dependent checks are skipped, a packed
    model runs padded)."""
    # (the three questions asked directly: a batch-1 forward asks this dozens of times)
    return bool(
        _IS_COMPILING() or (_IS_EXPORTING is not None and _IS_EXPORTING()) or _JIT_TRACING()
    )


def round_rows(n: int) -> int:
    """n rounded up to a multiple of 2**(bit length of n - 5), and of 8: at most n/16 more, or 7.

    oneDNN builds (and caches) a kernel for each matrix shape it sees, which costs far more than
    running one; packed batches have a new token count almost every time. Rounded, the counts
    fall on 16 shapes per doubling, so a long run soon meets only shapes it has built.
    """
    step = max(8, 1 << max(n.bit_length() - 5, 0))
    return -(-n // step) * step


_POSITIONS: dict[str, torch.Tensor] = {}  # device -> 0, 1, 2, ... (int64), grown as asked


def positions(n: int, device) -> torch.Tensor:
    """(n,) int64: 0..n-1, a view of one tensor kept per device (torch.arange's own call cost
    about three views' time). Not an inference tensor, so training may read it too."""
    key = str(device)
    kept = _POSITIONS.get(key)
    if kept is None or kept.numel() < n:
        with torch.inference_mode(False):
            kept = _POSITIONS[key] = torch.arange(max(n, 512), device=device)
    return kept[:n]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, H) hidden states and their (B, T) attention mask (None: no padding) -> (B, H)
    float32 means over the real tokens (sentence-transformers' mean pooling)."""
    hidden = hidden.float()
    if mask is None:
        return hidden.sum(1) / hidden.shape[1]
    m = mask.unsqueeze(-1).float()
    return (hidden * m).sum(1) / m.sum(1)


def check_rows(mask: torch.Tensor) -> None:
    """mask (B, T) bool: refuse a row without a single token (every kernel calls this). Skipped
    while tracing: the check reads the mask's values."""
    if tracing():
        return
    empty = (~mask.any(1)).nonzero()
    if len(empty):
        raise ValueError(
            f"row {int(empty[0])} of attention_mask has no tokens (all padding): "
            "there is nothing for it to attend over"
        )


WINDOW_ALIGN = 16  # attention windows are rounded up to a multiple of this many rows
SHARED_ROWS = 32  # consecutive sequences this short in all share one attention window


def window_order(lengths: list[int] | tuple[int, ...]) -> list[int]:
    """An order for a batch's sequences (indices into ``lengths``) in which consecutive short
    ones fill the packed attention's shared windows (``Packing.windows``): best fit by
    decreasing length into bins of SHARED_ROWS tokens, the sequences longer than that first.
    Each sequence's numbers are the same in any order; what changes is how many attention calls
    and query blocks the batch needs. For 256 SST-2 sentences (13.7 tokens on average) the
    batch order makes 138 windows and this one 108: fewer attention calls, which saves a few
    percent of such a batch's time in bfloat16 and less in float32, where the products weigh
    more. It suits a caller that puts the results back in place, as the server's batches do; a
    padded batch in this order pads as much as in any other."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    long = [i for i in order if lengths[i] > SHARED_ROWS]
    room: list[list[list[int]]] = [[] for _ in range(SHARED_ROWS + 1)]  # bins by rows free
    bins: list[list[int]] = []
    for i in order[len(long) :]:
        n = lengths[i]
        free = next((r for r in range(n, SHARED_ROWS + 1) if room[r]), None)
        if free is None:  # no bin has room: a new one
            bin_, free = [], SHARED_ROWS
            bins.append(bin_)
        else:
            bin_ = room[free].pop()
        bin_.append(i)
        room[free - n].append(bin_)
    return long + [i for bin_ in bins for i in bin_]


@dataclass(frozen=True)
class Window:
    """One attention call on a packed tensor, for one sequence or several consecutive ones: rows
    first:first+width are read, ``mask`` (1, 1, width, width) lets each query see the keys of
    its own sequence only (None when the window is one sequence's rows exactly), and window rows
    own:own+n are the sequences' rows start:start+n."""

    first: int
    width: int
    mask: torch.Tensor | None
    own: int
    start: int
    n: int


@dataclass(frozen=True)
class _Span:
    """A window's geometry (``Packing._spans``): rows first:first+width, its sequences' rows
    own:own+n of it (packed rows start:start+n), and whether it needs a mask (it borrows rows
    or holds several sequences)."""

    first: int
    width: int
    own: int
    start: int
    n: int
    masked: bool


@dataclass(frozen=True)
class WindowGroup:
    """Windows of one width run as one batched attention call: the packed rows they read
    (``rows``, k * width of them, window after window), their masks (k, 1, width, width) (None when
    no window needs one), and which rows of the (k * width) result are sequences' own rows
    (``own``) and where in the packed tensor they go (``to``)."""

    width: int
    count: int  # k, the windows
    rows: torch.Tensor  # (k * width,) int64
    mask: torch.Tensor | None
    own: torch.Tensor  # (m,) int64
    to: torch.Tensor  # (m,) int64


@dataclass(frozen=True)
class Packing:
    """Where the real tokens of a padded (B, T) batch are."""

    batch: int  # B
    seq_len: int  # T
    indices: torch.Tensor | None  # (N,) positions of the real tokens in the flat (B*T) batch;
    #                               None when there is no padding (N = B*T)
    cu_seqlens: torch.Tensor  # (B+1,) int32: sequence b is packed rows cu[b]:cu[b+1]
    lengths: tuple[int, ...]  # (B,) real tokens per sequence
    max_seqlen: int
    rows: int = 0  # rows the encoder runs on: N, or more with spare rows (0: N)
    _windows: dict = field(default_factory=dict, repr=False, compare=False)

    kernel = "packed"  # the attention kernel of this layout (attention.BACKENDS)

    @property
    def keys(self) -> Packing:
        """What the kernel reads to know which keys each query sees: the packing itself."""
        return self

    @property
    def dense(self) -> bool:
        """True when no row has padding: the packed tensor is just the batch, flattened."""
        return self.indices is None

    @property
    def total(self) -> int:
        """N, the number of real tokens."""
        return int(sum(self.lengths))

    @classmethod
    def from_mask(
        cls,
        mask: torch.Tensor | None,
        batch: int,
        seq_len: int,
        device,
        spare_rows: Callable[[int], int] | None = None,
    ) -> Packing:
        """mask (B, T), nonzero at real tokens, or None for no padding. Every row must hold a
        token: an all-padding row has nothing to attend over and is refused. ``spare_rows``
        (e.g. ``round_rows``) gives the rows to run a batch with padding on."""
        if mask is None or bool(mask.all()):
            lengths = (seq_len,) * batch
            indices = None
        else:
            mask = mask.bool()
            check_rows(mask)
            lengths = tuple(mask.sum(1).tolist())
            indices = mask.reshape(-1).nonzero().squeeze(1)
        # (one tensor from the lengths, by way of numpy, a third of torch.tensor's time: at batch 1
        # each small operation costs microseconds, the products around it having pushed it out
        # of the CPU's caches)
        starts = np.fromiter(itertools.accumulate(lengths, initial=0), np.int32, batch + 1)
        cu = torch.from_numpy(starts).to(device)
        n = int(sum(lengths))
        rows = spare_rows(n) if spare_rows is not None and indices is not None else n
        return cls(batch, seq_len, indices, cu, lengths, max(lengths), rows)

    # ------------------------------------------------------------------ the seam
    def inputs(
        self,
        input_ids: torch.Tensor | None,  # (B, T)
        token_type_ids: torch.Tensor | None,  # (B, T)
        position_ids: torch.Tensor | None,  # (B, T), (1, T) or (T,)
        inputs_embeds: torch.Tensor | None,  # (B, T, H)
    ) -> tuple[torch.Tensor | None, ...]:
        """The embeddings' inputs for the real tokens only, (N,) and (N, H). Each token keeps
        the position of its column, as in the padded layout."""
        B, T = self.batch, self.seq_len
        if position_ids is None:
            position_ids = positions(T, self.cu_seqlens.device)
        where = self.unpad(position_ids.expand(B, T))
        ids, types, embeds = (
            None if t is None else self.unpad(t) for t in (input_ids, token_type_ids, inputs_embeds)
        )
        return ids, types, where, embeds

    def grow(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H) -> (rows, H): spare rows after the last token, computed by every layer and
        read by no sequence (see round_rows). Only where no gradient is recorded."""
        if self.rows <= self.total or x.requires_grad:
            return x
        return F.pad(x, (0, 0, 0, self.rows - self.total))

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, ...) -> (N, ...): the real tokens, spare rows dropped."""
        return x[: self.total] if x.shape[0] > self.total else x

    def windows(
        self, rows: int, dtype: torch.dtype, device, align: int = WINDOW_ALIGN
    ) -> tuple[Window, ...]:
        """The attention calls of the packed (rows, ...) tensor: each reads a window of rows
        holding one sequence, or several short neighbours, and is masked so that every token
        sees its own sequence only.

        PyTorch's CPU attention kernel works in blocks, and runs up to twice as long on a
        sequence whose length is just short of a multiple of its block size (127 tokens) as on
        the multiple (128). So a window of n tokens is rounded up to ``align`` rows: its own tokens
        and the next sequence's first ones (where the packed tensor ends first, the window moves
        back over the previous sequence's last ones), the borrowed keys shut out by an additive
        mask of -inf, the borrowed queries' results dropped (so a neighbour's rows could only
        reach a sequence if they held inf or NaN).

        The kernel's cost also goes by the call and the block of queries more than by the
        tokens: 16 or 32 keys and queries cost about the same. So consecutive sequences of
        SHARED_ROWS tokens or fewer in all share one window, the mask block-diagonal (each
        sequence's keys for its own queries): on batches of short sentences, fewer and fuller
        calls take about a quarter off a layer's attention in bfloat16. A window of one
        sequence whose length is already a multiple, or that the tensor cannot surround, reads
        just its rows, without a mask. Computed once per batch, shared by every layer."""
        key = (rows, dtype, str(device), align)
        if key not in self._windows:
            plan = (self._window(span, rows, dtype, device) for span in self._spans(rows, align))
            self._windows[key] = tuple(plan)
        return self._windows[key]

    def _window(self, span: _Span, rows: int, dtype: torch.dtype, device) -> Window:
        mask = self._block_masks([span], rows, dtype, device)[2] if span.masked else None
        return Window(span.first, span.width, mask, span.own, span.start, span.n)

    def window_groups(
        self, rows: int, dtype: torch.dtype, device, align: int = WINDOW_ALIGN
    ) -> tuple[Window | WindowGroup, ...]:
        """The ``windows``, those of one width gathered into a ``WindowGroup`` (a width only one
        window has stays a Window, read in place). Computed once per batch, every group's
        indices and masks at once (``_block_masks``): for 256 SST-2 sentences (138 windows in
        4 groups) about a third of the time of writing each window's mask on its own."""
        key = ("groups", rows, dtype, str(device), align)
        if key not in self._windows:
            by_width: dict[int, list[_Span]] = {}
            for span in self._spans(rows, align):
                by_width.setdefault(span.width, []).append(span)
            plan: list[Window | WindowGroup] = []
            for width, spans in sorted(by_width.items()):
                if len(spans) == 1:
                    plan.append(self._window(spans[0], rows, dtype, device))
                    continue
                read, own, mask = self._block_masks(spans, rows, dtype, device)
                if not any(span.masked for span in spans):
                    mask = None
                k = len(spans)
                at = torch.from_numpy(np.flatnonzero(own))  # rows of the (k * width) result
                to = torch.from_numpy(read[own])  # and where they go in the packed tensor
                read = torch.from_numpy(read.reshape(-1))
                plan.append(
                    WindowGroup(width, k, read.to(device), mask, at.to(device), to.to(device))
                )
            self._windows[key] = tuple(plan)
        return self._windows[key]

    def _spans(self, rows: int, align: int) -> list[_Span]:
        """The windows' geometry (see ``windows``): consecutive sequences of SHARED_ROWS tokens
        or fewer in all share one, each rounded up to a multiple of ``align`` rows."""
        key = ("spans", rows, align)
        if key not in self._windows:
            plan, start, i, lengths = [], 0, 0, self.lengths
            while i < len(lengths):
                first_i, n = i, lengths[i]
                i += 1
                while i < len(lengths) and n + lengths[i] <= SHARED_ROWS:
                    n += lengths[i]
                    i += 1
                width = -(-n // align) * align
                if width > rows:  # the tensor cannot surround it: its own rows
                    width = n
                first = min(start, rows - width)  # the window holds start:start+n
                masked = width != n or i - first_i > 1
                plan.append(_Span(first, width, start - first, start, n, masked))
                start += n
            self._windows[key] = plan
        return self._windows[key]

    def _block_masks(
        self, spans: list[_Span], rows: int, dtype: torch.dtype, device
    ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """For k windows of one width W: the packed rows each reads, (k, W) int64; which of
        those are its sequences' own rows, (k, W) bool; and the additive masks, (k, 1, W, W):
        0 where a query and a key are tokens of one sequence, or a borrowed row meets itself,
        -inf elsewhere."""
        width = spans[0].width
        first, own, n = (np.array([getattr(s, f) for s in spans]) for f in ("first", "own", "n"))
        r = np.arange(width)
        read = first[:, None] + r  # (k, W)
        mine = (r >= own[:, None]) & (r < (own + n)[:, None])
        # each own row's sequence, and a borrowed row (spare rows too): a group of its own
        sequence = np.pad(self._sequences(), (0, rows - self.total), constant_values=-1)
        group = np.where(mine, sequence[read], -1 - r)
        mask = np.where(group[:, :, None] == group[:, None, :], 0.0, -np.inf).astype(np.float32)
        mask = torch.from_numpy(mask).to(dtype).view(len(spans), 1, width, width)
        return read, mine, mask.to(device)

    def _sequences(self) -> np.ndarray:
        """(N,) int64: the sequence each packed row belongs to. Computed once per batch."""
        if "sequences" not in self._windows:
            self._windows["sequences"] = np.repeat(np.arange(self.batch), self.lengths)
        return self._windows["sequences"]

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the real tokens, sequence by sequence."""
        flat = x.reshape(self.batch * self.seq_len, *x.shape[2:])
        return flat if self.indices is None else flat.index_select(0, self.indices)

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), ``fill`` at the padding positions."""
        if self.indices is not None:
            full = x.new_full((self.batch * self.seq_len, *x.shape[1:]), fill)
            x = full.index_copy(0, self.indices, x)
        return x.reshape(self.batch, self.seq_len, *x.shape[1:])

    def first_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, ...): each sequence's first real token (its [CLS])."""
        if self.indices is None:  # no padding: every seq_len-th row, a view
            return x[: self.batch * self.seq_len : self.seq_len]
        return x.index_select(0, self.cu_seqlens[:-1].long())

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H) -> (B, H) float32: each sequence's mean over its rows, summed in float32.

        No padded copy is made: for 256 SST-2 sentences (3,501 tokens in a 256 x 60 batch) this
        is several times faster than padding them back, casting the (B, T, H) copy to float32
        and masking it. Through the server or the embed pipeline, alternating runs showed no
        difference beyond their noise (a few percent)."""
        x = x[: self.total].float()
        if self.batch == 1:
            return x.sum(0, keepdim=True) / self.total
        which = torch.from_numpy(self._sequences()).to(x.device)
        lengths = torch.tensor(self.lengths, dtype=torch.float32, device=x.device)
        sums = x.new_zeros(self.batch, x.shape[-1])
        return sums.index_add_(0, which, x) / lengths[:, None]

    def split_heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        """(N, H) -> (N, A, D), the packed kernel's layout of queries, keys and values."""
        return t.view(t.shape[0], heads, t.shape[-1] // heads)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(N, A, D) -> (N, H)."""
        return t.reshape(t.shape[0], -1)


@dataclass(frozen=True)
class Padded:
    """The padded layout of the "eager", "sdpa" and "aligned" kernels: tensors stay (B, T, ...)."""

    kernel: str  # "eager", "sdpa" or "aligned" (attention.BACKENDS)
    mask: torch.Tensor | None  # (B, T) bool, True at real tokens; None: no padding

    @property
    def keys(self) -> torch.Tensor | None:
        """What the kernel reads to know which keys each query sees: the (B, T) mask."""
        return self.mask

    def inputs(self, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return tensors

    def grow(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def pad(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        return x

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def first_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (B, ...): the token in column 0 (the [CLS]), as the reference reads."""
        return x[:, 0]

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, H) float32: each row's mean over its real tokens."""
        return mean_pool(x, self.mask)

    def split_heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, T, H) -> (B, A, T, D)."""
        B, T, H = t.shape
        return t.view(B, T, heads, H // heads).transpose(1, 2)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, A, T, D) -> (B, T, H)."""
        B, A, T, D = t.shape
        return t.transpose(1, 2).reshape(B, T, A * D)


Layout = Padded | Packing


def enter(
    kernel: str,
    mask: torch.Tensor | None,
    batch: int,
    seq_len: int,
    device: torch.device,
    spare_rows: Callable[[int], int] | None = None,
) -> Layout:
    """The layout a batch runs in. kernel: the config's attn_implementation, or "sdpa" for a
    packed model asked for attention probabilities. mask (B, T), nonzero at real tokens, or None.
    While tracing (compile, export), a packed model runs padded: see the module docstring."""
    if kernel == "packed" and not tracing():
        return Packing.from_mask(mask, batch, seq_len, device, spare_rows)
    if kernel == "packed":
        compiling = torch.compiler.is_compiling() and not exporting()
        kernel = "aligned" if compiling or _ALIGNED.get() else "sdpa"
    if mask is None:
        return Padded(kernel, None)
    mask = mask.bool()
    check_rows(mask)
    if not tracing() and bool(mask.all()):
        mask = None  # no padding: let the kernel skip the mask
    return Padded(kernel, mask)

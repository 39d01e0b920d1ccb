"""The packed (unpadded) layout: the only place that knows it.

A padded batch (B, T, ...) with an attention mask holds N <= B*T real tokens. Packed, those N
tokens sit one after another in an (N, ...) tensor, sequence by sequence; ``cu_seqlens`` gives
where each sequence starts (sequence b is rows cu_seqlens[b]:cu_seqlens[b+1]). Every linear
layer, LayerNorm and activation then runs on real tokens only; attention runs per sequence.

When a batch has no padding at all, packing is the identity: the (B*T, ...) view of the batch,
and attention can run batched (``Packing.dense``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def round_rows(n: int) -> int:
    """n rounded up to a multiple of 2**(bit length of n - 5), and of 8: at most n/16 more, or 7.

    oneDNN builds (and caches) a kernel for each matrix shape it sees, about 10 ms each on the
    project's CPU; packed batches have a new token count almost every time. Rounded, the
    counts fall on 16 shapes per doubling, so a long run soon meets only shapes it has built.
    """
    step = max(8, 1 << max(n.bit_length() - 5, 0))
    return -(-n // step) * step


def check_rows(mask: torch.Tensor) -> None:
    """mask (B, T) bool: refuse a row without a single token (every kernel calls this)."""
    empty = (~mask.any(1)).nonzero()
    if len(empty):
        raise ValueError(
            f"row {int(empty[0])} of attention_mask has no tokens (all padding): "
            "there is nothing for it to attend over"
        )


WINDOW_ALIGN = 16  # attention windows are rounded up to a multiple of this many rows


@dataclass(frozen=True)
class Window:
    """One sequence's attention call on a packed tensor: rows first:first+width are read,
    ``mask`` (1, 1, 1, width) keeps out the rows that are not the sequence's own (None when all
    are), and window rows own:own+n are the sequence's rows start:start+n."""

    first: int
    width: int
    mask: torch.Tensor | None
    own: int
    start: int
    n: int


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
    _windows: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dense(self) -> bool:
        """True when no row has padding: the packed tensor is just the batch, flattened."""
        return self.indices is None

    @property
    def total(self) -> int:
        """N, the number of real tokens."""
        return int(sum(self.lengths))

    @classmethod
    def from_mask(cls, mask: torch.Tensor | None, batch: int, seq_len: int, device) -> Packing:
        """mask (B, T), nonzero at real tokens, or None for no padding. Every row must hold a
        token: an all-padding row has nothing to attend over and is refused."""
        if mask is None or bool(mask.bool().all()):
            lengths = (seq_len,) * batch
            indices = None
        else:
            mask = mask.bool()
            check_rows(mask)
            lengths = tuple(mask.sum(1).tolist())
            indices = mask.reshape(-1).nonzero().squeeze(1)
        cu = torch.zeros(batch + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lengths).cumsum(0)
        return cls(batch, seq_len, indices, cu.to(device), lengths, max(lengths))

    def windows(
        self, rows: int, dtype: torch.dtype, device, align: int = WINDOW_ALIGN
    ) -> tuple[Window, ...]:
        """Per sequence, the rows its attention call reads from the packed (rows, ...) tensor.

        PyTorch's CPU attention kernel runs up to twice as long on a sequence whose length is
        just short of a multiple of its block size (127 tokens: 238 us, 128: 126 us, on the
        project's CPU). So each sequence of n tokens reads a window of n rounded up to
        ``align`` rows: its own tokens and the next sequence's first ones (where the packed
        tensor ends first, the window moves back over the previous sequence's last ones), the
        borrowed keys shut out by an additive mask of -inf, the borrowed queries' results
        dropped (so a neighbour's rows could only reach a sequence if they held inf or NaN).
        A sequence whose length is already a multiple, or that the tensor cannot surround,
        reads just its own rows, without a mask. Computed once per batch, shared by every
        layer."""
        key = (rows, dtype, str(device), align)
        if key not in self._windows:
            plan, start = [], 0
            for n in self.lengths:
                width = -(-n // align) * align
                if width == n or width > rows:
                    plan.append(Window(start, n, None, 0, start, n))
                else:
                    first = min(start, rows - width)  # the window holds start:start+n
                    mask = torch.zeros(width, dtype=dtype, device=device)
                    own = start - first  # where the sequence's own rows begin in the window
                    mask[:own] = float("-inf")
                    mask[own + n :] = float("-inf")
                    plan.append(Window(first, width, mask.view(1, 1, 1, width), own, start, n))
                start += n
            self._windows[key] = tuple(plan)
        return self._windows[key]

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
        return x.index_select(0, self.cu_seqlens[:-1].long())

"""The rows of every pre-training step, read from a prepared corpus, and their masks.

The stream is defined without the number of processes. Row g of the run (counted over every
global micro-batch from the phase's start: micro-batch u holds rows u x rows_per_micro to
(u + 1) x rows_per_micro - 1) comes from shard g mod n_shards, the (g // n_shards)-th example of
that shard's stream, which goes over the shard in a fresh random order each pass. Rank r of W
processes takes the rows g with g mod W = r: those of shards r, r + W, ..., which it alone
opens and reads. So the global batches, their rows and their order are the same for any W that
divides both the number of shards and the rows of a micro-batch (which the stream checks), and a
run may continue on another W at the step it stopped at.

A row's mask is drawn from its own generator, seeded with the row's identity: (seed, shard,
example, pass) for dynamic masking, fresh each pass; (seed, shard, example) for static masking,
the same mask every pass, as a mask fixed at preparation would be (the ``dupe_factor`` copies of
the corpus are other examples, so they get other masks). So masks depend on neither the process
nor the global random state, and a resumed run sees the very batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertlab.data.corpus import PretrainingCorpus, read_meta
from bertlab.data.masking import MaskingConfig, mask_tokens, special_tokens_mask
from bertlab.distributed import agree, sum_over_ranks, world
from bertlab.nn.losses import IGNORE_INDEX


def _seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (numpy's SeedSequence: no collisions by addition)."""
    a, b = np.random.SeedSequence([int(p) for p in parts]).generate_state(2)
    return (int(a) << 31) ^ int(b)


SHARD_ARRAYS = ("input_ids", "offsets", "sep", "nsp")  # a shard's files: NAME.KEY.npy


def check_shards(directory: str | Path, meta: dict[str, Any], shards: list[int]) -> None:
    """Check these shards of a prepared corpus against its meta.json before training reads
    them: each of a shard's four files is there and reads as an array (memory-mapped: only the
    headers and the offsets are read), of the length meta.json gives, with offsets that go from
    0 to the shard's token count without going back. A missing or damaged file is named."""
    for k in shards:
        entry = meta["shards"][k]
        name, n = entry["name"], int(entry["examples"])
        lengths = {"input_ids": entry.get("tokens"), "offsets": n + 1, "sep": n, "nsp": n}
        arrays = {}
        for key in SHARD_ARRAYS:
            path = Path(directory) / f"{name}.{key}.npy"
            if not path.is_file():
                raise FileNotFoundError(
                    f"shard {k} of {directory} is missing a file: {path} does not exist "
                    "(prepare the corpus again)"
                )
            try:
                arrays[key] = np.load(path, mmap_mode="r")
            except Exception as e:  # a truncated or overwritten file
                raise ValueError(
                    f"{path} is damaged: it does not read as an array ({e}); prepare the "
                    "corpus again"
                ) from None
            expected = lengths[key]
            if arrays[key].ndim != 1 or (expected is not None and len(arrays[key]) != expected):
                raise ValueError(
                    f"{path} is damaged: it holds an array of shape {arrays[key].shape} where "
                    f"meta.json's shard {name} needs ({expected},); prepare the corpus again"
                )
        offsets = np.asarray(arrays["offsets"])
        if (
            offsets[0] != 0
            or offsets[-1] != len(arrays["input_ids"])
            or (np.diff(offsets) < 0).any()
        ):
            raise ValueError(
                f"{Path(directory) / f'{name}.offsets.npy'} is damaged: its offsets do not run "
                f"from 0 to the {len(arrays['input_ids'])} tokens of {name}.input_ids.npy; "
                "prepare the corpus again"
            )


class CorpusStream:
    """The rows of every step, read from a prepared corpus; this rank's rows only.

    ``batch_size`` is global, per optimizer step; ``grad_accum`` splits it into micro-batches.
    ``__call__(step, micro)`` gives this rank's part of micro-batch ``micro`` of ``step``
    (counted from ``first_step``, where this phase starts): input_ids, token_type_ids,
    attention_mask, labels (-100 where not predicted), next_sentence_label, and the global
    counts the loss divides by (``mlm_count``: masked tokens, ``nsp_count``: rows).
    """

    def __init__(
        self,
        directory: str | Path,
        batch_size: int,
        masking: MaskingConfig,
        *,
        mask_token_id: int,
        vocab_size: int,
        grad_accum: int = 1,
        first_step: int = 0,
        seed: int = 0,
        static: bool = False,
        continuation: torch.Tensor | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        r, w = world()
        self.rank = r if rank is None else rank
        self.world_size = W = w if world_size is None else world_size
        self.meta = meta = read_meta(directory)
        self.n_shards = n = len(meta["shards"])
        if batch_size % (grad_accum * W):
            raise ValueError(
                f"batch size {batch_size} cannot be split into {grad_accum} micro-batch(es) "
                f"over {W} process(es): it must be a multiple of {grad_accum * W}"
            )
        if n % W:
            raise ValueError(
                f"{directory} has {n} shard(s), which {W} processes cannot share evenly: "
                f"prepare it again with a --shard-size that gives a multiple of {W} shards"
            )
        self.micro = batch_size // grad_accum  # global rows per micro-batch
        self.grad_accum, self.first_step, self.seed = grad_accum, first_step, seed
        self.masking, self.static, self.continuation = masking, static, continuation
        self.mask_token_id, self.vocab_size = mask_token_id, vocab_size
        self.sizes = [int(entry["examples"]) for entry in meta["shards"]]
        self.own = list(range(self.rank, n, W))  # shard k is the (k // W)-th one opened here
        check_shards(directory, meta, self.own)
        self.corpus = PretrainingCorpus(directory, shards=self.own)
        self._starts = np.cumsum([0] + [self.sizes[k] for k in self.own])
        self.special = [meta["cls_token_id"], meta["sep_token_id"]]
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def _example(self, k: int, p: int) -> tuple[int, int]:
        """Shard k's p-th stream position -> (example index in shard k, pass number)."""
        n = self.sizes[k]
        epoch = p // n
        if (k, epoch) not in self._perms:
            if len(self._perms) > 4 * len(self.own):
                self._perms.clear()
            rng = np.random.Generator(np.random.PCG64(_seed(self.seed, 1, k, epoch)))
            self._perms[(k, epoch)] = rng.permutation(n)
        return int(self._perms[(k, epoch)][p % n]), epoch

    def rows(self, step: int, micro: int) -> list[tuple[int, int, int]]:
        """This rank's rows of a micro-batch: (shard, example in shard, pass)."""
        u = (step - self.first_step) * self.grad_accum + micro
        rows = []
        for g in range(u * self.micro, (u + 1) * self.micro):
            k = g % self.n_shards
            if k % self.world_size == self.rank:
                rows.append((k, *self._example(k, g // self.n_shards)))
        return rows

    def __call__(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        return self.batch(self.rows(step, micro))

    def examples(self, rows: list[tuple[int, int, int]]) -> list[dict[str, torch.Tensor]]:
        """The examples of these rows (shard, example in shard, pass), unmasked."""
        return [self.corpus[int(self._starts[k // self.world_size]) + j] for k, j, _ in rows]

    def batch(self, rows: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        """Read, mask and pad these rows (shard, example in shard, pass), with the counts the
        loss divides by, summed over the ranks. That sum carries a flag: should reading fail
        on one rank, every rank stops there, naming it and its error, none left waiting."""
        error, batch, count = None, {}, 0.0
        try:
            batch = self._read(rows)
            count = float((batch["labels"] != IGNORE_INDEX).sum())
        except Exception as e:  # raised below, on every rank
            error = e
        if self.world_size > 1:  # a stream of one process (evaluation) counts its own rows
            count, failed = sum_over_ranks([count, float(error is not None)])
            if failed:
                agree(error)
        elif error is not None:
            raise error
        # The loss divides by the masked tokens of the whole micro-batch, every rank's rows.
        batch["mlm_count"] = torch.tensor([max(count, 1.0)])
        batch["nsp_count"] = torch.tensor([float(self.micro)])
        return batch

    def _read(self, rows: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        examples, masked = [], []
        for (k, j, epoch), e in zip(rows, self.examples(rows), strict=True):
            ids = e["input_ids"][None]
            special = special_tokens_mask(ids, torch.ones_like(ids), self.special)
            gen = torch.Generator().manual_seed(
                _seed(self.seed, 2, k, j) if self.static else _seed(self.seed, 3, k, j, epoch)
            )
            ids, labels = mask_tokens(
                ids,
                special,
                self.vocab_size,
                self.mask_token_id,
                self.masking,
                gen,
                self.continuation,
            )
            examples.append({**e, "input_ids": ids[0]})
            masked.append(labels[0])
        batch = PretrainingCorpus.collate(examples, self.corpus.pad_id)
        labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
        for r, lab in enumerate(masked):
            labels[r, : len(lab)] = lab
        batch["labels"] = labels
        return batch


class Phases:
    """data(step, micro) over the phase schedule: each phase's stream from its first step.

    ``Phases.build(steps, data, batch_size, long_data, long_fraction, long_batch_size)``: most
    steps on ``data``, the last ``long_fraction`` of them on ``long_data`` (reference 001: 90% at
    128 tokens, then 512); ``masking(max_seq_length)`` gives each corpus's masking, the other
    keywords go to every ``CorpusStream``.
    """

    def __init__(self, streams: list[tuple[int, CorpusStream]]):
        self.streams = streams  # (first step, stream), in order

    @classmethod
    def build(
        cls,
        steps: int,
        data: str | Path,
        batch_size: int,
        long_data: str | Path | None,
        long_fraction: float,
        long_batch_size: int | None,
        masking: Callable[[int], MaskingConfig],
        **stream_kw: Any,
    ) -> Phases:
        long_steps = round(steps * long_fraction) if long_data else 0
        phases = [(0, data, batch_size)]
        if long_steps:
            phases.append((steps - long_steps, long_data, long_batch_size or batch_size))
        return cls(
            [
                (
                    first,
                    CorpusStream(
                        directory,
                        size,
                        masking(int(read_meta(directory)["max_seq_length"])),
                        first_step=first,
                        **stream_kw,
                    ),
                )
                for first, directory, size in phases
            ]
        )

    def stream(self, step: int) -> CorpusStream:
        return next(s for first, s in reversed(self.streams) if step >= first)

    def __call__(self, step: int, micro: int) -> dict[str, torch.Tensor]:
        return self.stream(step)(step, micro)


def evaluation_batches(
    directory: str | Path,
    examples: int,
    batch_size: int,
    masking: MaskingConfig,
    mask_token_id: int,
    vocab_size: int,
    seed: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """A fixed held-out sample: the first ``examples`` of a prepared corpus, masked once (static
    masks seeded with ``seed``), in batches. The same for every evaluation and every rank."""
    stream = CorpusStream(
        directory,
        batch_size,
        masking,
        mask_token_id=mask_token_id,
        vocab_size=vocab_size,
        seed=seed,
        static=True,
        rank=0,
        world_size=1,
    )
    starts = np.cumsum([0] + stream.sizes)
    n = min(examples, int(starts[-1]))
    batches = []
    for first in range(0, n, batch_size):
        rows = []
        for i in range(first, min(n, first + batch_size)):
            k = int(np.searchsorted(starts, i, side="right")) - 1
            rows.append((k, i - int(starts[k]), 0))
        batch = stream.batch(rows)
        batch["nsp_count"] = torch.tensor([float(len(rows))])
        batches.append(batch)
    return batches

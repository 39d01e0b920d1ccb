"""Masked-LM inputs: choose the tokens BERT predicts and corrupt them (reference 003).

BERT pre-trains by hiding some input tokens and predicting them from both sides (reference 003,
"Masked Language Modelling"; BERT paper section 3.1). The recipe here is the one in the original
``create_pretraining_data.py`` (``create_masked_lm_predictions``), per sequence:

1. candidates are the real tokens ([CLS], [SEP] and padding are never chosen); with whole-word
   masking a candidate is a whole word: a start piece and the "##" pieces that follow it;
2. ``num_to_predict = min(max_predictions, max(1, round(n_real * rate)))``;
3. the candidates are shuffled and taken whole in that order, skipping any word that would take
   the count past ``num_to_predict``, until the count is reached or the candidates run out;
4. each chosen token becomes [MASK] 80% of the time, a random token 10% of the time, and stays
   unchanged 10% of the time (reference 003: so that the model cannot rely on [MASK] being there,
   a token that fine-tuning never shows it).

The labels hold the original id at the chosen positions and -100 (ignored by the loss, as in
``bertlab.nn.heads``) elsewhere.

Everything is batched tensor work, with no Python loop over tokens or rows: shuffling is a sort
of random scores, and the greedy pass of step 3 runs as a few rounds of prefix sums over all rows
at once (see ``_take_greedily``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from bertlab.nn.losses import IGNORE_INDEX  # noqa: F401  (the label the MLM loss skips)


@dataclass(frozen=True)
class MaskingConfig:
    """How many tokens to predict and how to corrupt them; defaults are BERT's."""

    rate: float = 0.15  # share of the real tokens chosen for prediction
    mask_prob: float = 0.8  # share of the chosen tokens that become [MASK]
    random_prob: float = 0.1  # ... that become a random token; the rest stay unchanged
    # Cap per sequence: the original max_predictions_per_seq. Its value was 20 for 128-token
    # sequences and 80 for 512 (15% of 512 is 77): raise it with the sequence length.
    max_predictions: int = 20
    whole_word: bool = False  # choose whole words, never part of one

    def __post_init__(self) -> None:
        if not (0.0 < self.rate < 1.0):  # also refuses NaN
            raise ValueError(f"MaskingConfig.rate must be in (0, 1), got {self.rate!r}")
        for name in ("mask_prob", "random_prob"):
            p = getattr(self, name)
            if not (0.0 <= p <= 1.0):
                raise ValueError(f"MaskingConfig.{name} must be in [0, 1], got {p!r}")
        # A small tolerance so that e.g. 0.7 + 0.3 (1.0000000000000002 in some orders) passes.
        if self.mask_prob + self.random_prob > 1.0 + 1e-9:
            raise ValueError(
                f"MaskingConfig.mask_prob + random_prob must be <= 1, got "
                f"{self.mask_prob!r} + {self.random_prob!r} = {self.mask_prob + self.random_prob!r}"
            )
        mp = self.max_predictions
        if isinstance(mp, bool) or not isinstance(mp, int) or mp < 1:
            raise ValueError(f"MaskingConfig.max_predictions must be an integer >= 1, got {mp!r}")

    @classmethod
    def for_length(
        cls,
        seq_len: int,
        rate: float = 0.15,
        max_predictions: int | None = None,
        whole_word: bool = False,
    ) -> MaskingConfig:
        """For sequences of up to ``seq_len`` tokens: the cap defaults to ceil(rate * seq_len)
        (20 at 128 and 77 at 512 for 15%, near the original's 20 and 80)."""
        cap = max_predictions or math.ceil(rate * seq_len)
        return cls(rate=rate, max_predictions=cap, whole_word=whole_word)


def continuation_table(vocab: list[str] | dict[str, int]) -> torch.Tensor:
    """(V,) bool: True for the word pieces that continue a word ("##ing"), for whole-word masking.

    ``vocab`` is the token list (index = id) or a token -> id dict; with a dict, V is the largest
    id + 1 and ids that no token holds are False.
    """
    if isinstance(vocab, dict):
        size = max(vocab.values(), default=-1) + 1
        table = torch.zeros(size, dtype=torch.bool)
        ids = [i for t, i in vocab.items() if t.startswith("##")]
        table[torch.tensor(ids, dtype=torch.long)] = True
        return table
    return torch.tensor([t.startswith("##") for t in vocab], dtype=torch.bool)


def special_tokens_mask(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: Iterable[int]
) -> torch.Tensor:
    """(B, T) bool: True at padding (attention_mask 0) and at any id in ``special_ids``.

    input_ids (B, T), attention_mask (B, T). The original recipe excludes only [CLS] and [SEP]
    (and padding, which it never sees): [UNK] can be chosen there. ``tokenizer.all_special_ids``
    also holds [UNK] and [MASK], so passing it excludes [UNK] as well; pass
    ``[tokenizer.cls_token_id, tokenizer.sep_token_id]`` to follow the original exactly.
    """
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
            f"{tuple(input_ids.shape)}: they must match"
        )
    ids = torch.as_tensor(list(special_ids), dtype=input_ids.dtype, device=input_ids.device)
    return (attention_mask == 0) | torch.isin(input_ids, ids)


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    vocab_size: int,
    mask_token_id: int,
    config: MaskingConfig,
    generator: torch.Generator,
    continuation: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the tokens to predict and corrupt them, by the original BERT recipe.

    input_ids (B, T) integer; special_mask (B, T) bool, True at [CLS], [SEP] and padding (never
    chosen; see ``special_tokens_mask``); continuation (V,) bool from ``continuation_table``,
    needed when ``config.whole_word``. Returns ``(masked_ids, labels)``, both (B, T):
    masked_ids has input_ids' dtype, labels are long, holding the original id at the chosen
    positions and -100 elsewhere.

    Per sequence (reference 003; the original create_pretraining_data.py): with n_real the
    number of non-special tokens, ``num_to_predict = min(max_predictions, max(1,
    round(n_real * rate)))`` (0 when n_real is 0). The candidates (tokens, or whole words when
    ``whole_word``: a start piece and the "##" pieces after it) are shuffled and taken whole in
    that order, a word that would take the count past num_to_predict being skipped. Each chosen
    token independently becomes ``mask_token_id`` with probability mask_prob, a token drawn
    uniformly from [0, vocab_size) with probability random_prob (it may happen to be the same
    token), and otherwise stays as it is.

    One deviation from the original, on purpose: it counted [CLS] and [SEP] in n_real (it used
    the length of the whole instance); here only the tokens that can be chosen count, so the
    share predicted is ``rate`` of the text whatever the special tokens.

    The same generator state gives the same output: the draws (three (B, T) tensors) do not
    depend on the data, only on the batch shape.
    """
    _check_inputs(input_ids, special_mask, vocab_size, mask_token_id, config, continuation)
    batch, seq_len = input_ids.shape
    device = input_ids.device
    real = ~special_mask  # (B, T)

    n_real = real.sum(1)  # (B,)
    # round() as in the original: float64 and round-half-to-even, like Python 3's round.
    quota = (n_real.double() * config.rate).round().long().clamp(1, config.max_predictions)
    quota = quota.masked_fill(n_real == 0, 0)  # (B,)

    # Words. A piece starts a word unless it is a "##" piece right after a real token: a "##"
    # piece after [CLS], [SEP] or padding starts its own word rather than joining a word across
    # a special token (the original would have appended it to the word before the [SEP]).
    if config.whole_word:
        assert continuation is not None  # _check_inputs
        cont = continuation.to(device)[input_ids.long()]  # (B, T)
        prev_real = torch.zeros_like(real)
        prev_real[:, 1:] = real[:, :-1]
        start = real & ~(cont & prev_real)
    else:
        start = real  # every token is its own candidate
    pos = torch.arange(seq_len, device=device).expand(batch, seq_len)
    # Each position's word start: the last start at or before it. For a real position this is
    # its own word's start, since a real non-start always follows a real token of its word.
    word_start = torch.where(start, pos, 0).cummax(1).values  # (B, T)
    # Pieces per word, stored at the word's start (0 elsewhere).
    length = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    length.scatter_add_(1, word_start, real.long())

    # Shuffle (the original's rng.shuffle(cand_indexes)): a random score per word, read at its
    # start position, and a sort; non-starts sort last. float64 makes ties (which would bias the
    # order towards earlier positions) practically impossible.
    score = torch.rand(batch, seq_len, generator=generator, device=device, dtype=torch.float64)
    order = score.masked_fill(~start, 2.0).argsort(1)  # (B, T): the words first, shuffled
    # A non-start never fits: seq_len + 1 exceeds any quota (quota <= n_real <= seq_len).
    sorted_len = length.masked_fill(~start, seq_len + 1).gather(1, order)
    taken = _take_greedily(sorted_len, quota)  # (B, T), in shuffled order

    chosen_start = torch.zeros_like(taken).scatter_(1, order, taken)  # back to positions
    chosen = real & chosen_start.gather(1, word_start)  # every piece of a chosen word

    # 80 / 10 / 10 per chosen token, independently (the original draws per token, not per word).
    u = torch.rand(batch, seq_len, generator=generator, device=device, dtype=torch.float64)
    random_ids = torch.randint(
        0, vocab_size, (batch, seq_len), generator=generator, device=device, dtype=input_ids.dtype
    )
    to_mask = chosen & (u < config.mask_prob)
    to_random = chosen & ~to_mask & (u < config.mask_prob + config.random_prob)
    masked_ids = input_ids.masked_fill(to_mask, mask_token_id)
    masked_ids = torch.where(to_random, random_ids, masked_ids)
    labels = input_ids.long().masked_fill(~chosen, IGNORE_INDEX)
    return masked_ids, labels


def _take_greedily(sorted_len: torch.Tensor, quota: torch.Tensor) -> torch.Tensor:
    """The original's greedy pass, for all rows at once.

    sorted_len (B, W): word lengths in shuffled order (any value > quota for "no word");
    quota (B,). Returns taken (B, W) bool, the words that this loop takes::

        count = 0
        for word in words:              # shuffled order
            if count + len(word) <= quota:
                take(word); count += len(word)

    As rounds of prefix sums: with budget r left, a word longer than r is skipped now and at
    every later step (the budget only shrinks), so drop those; of the rest, the loop takes the
    prefix whose cumulative length fits in r. The first word after that prefix is skipped, the
    budget drops by what was taken, and the next round starts over on the words left. Each
    round takes at least one word in every row that still has one that fits, so there are at
    most max(quota) + 1 rounds; in practice two or three (one when every word is one piece).
    """
    budget = quota.clone()  # (B,)
    taken = torch.zeros_like(sorted_len, dtype=torch.bool)
    while True:
        fits = ~taken & (sorted_len <= budget[:, None])
        if not bool(fits.any()):
            return taken
        cumulative = torch.where(fits, sorted_len, 0).cumsum(1)
        take = fits & (cumulative <= budget[:, None])
        taken |= take
        budget -= torch.where(take, sorted_len, 0).sum(1)


def _check_inputs(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    vocab_size: int,
    mask_token_id: int,
    config: MaskingConfig,
    continuation: torch.Tensor | None,
) -> None:
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must be a (B, T) integer tensor, got shape {tuple(input_ids.shape)} "
            f"dtype {input_ids.dtype}"
        )
    if special_mask.shape != input_ids.shape or special_mask.dtype != torch.bool:
        raise ValueError(
            f"special_mask must be a bool tensor of input_ids' shape {tuple(input_ids.shape)}, "
            f"got shape {tuple(special_mask.shape)} dtype {special_mask.dtype}"
        )
    if not isinstance(config, MaskingConfig):
        raise TypeError(f"config must be a MaskingConfig, got {type(config).__name__}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(
            f"mask_token_id {mask_token_id} is outside the vocabulary (size {vocab_size})"
        )
    if not config.whole_word:
        return
    if continuation is None:
        raise ValueError(
            "whole-word masking needs the continuation table: pass "
            "continuation=continuation_table(vocab)"
        )
    if continuation.dim() != 1 or continuation.dtype != torch.bool:
        raise ValueError(
            f"continuation must be a (V,) bool tensor, got shape {tuple(continuation.shape)} "
            f"dtype {continuation.dtype}"
        )
    outside = (input_ids < 0) | (input_ids >= len(continuation))
    if bool(outside.any()):
        row, col = (int(i) for i in outside.nonzero()[0])
        raise ValueError(
            f"token id {int(input_ids[row, col])} at row {row}, position {col} is outside the "
            f"continuation table (size {len(continuation)})"
        )

"""Masked-LM masking (bertlab/data/masking.py) against the original BERT recipe (reference 003).

* a plain-Python transcription of the original ``create_masked_lm_predictions`` loop, fed the
  same random draws, gives exactly the same output as the vectorised code, with and without
  whole-word masking, including words skipped because they would pass the quota;
* on a large sample, 19 of 128 real tokens are chosen in every row, every position equally
  often, and the chosen tokens split 80/10/10 within binomial bounds;
* special tokens and padding are never chosen; the cap holds; whole words are taken whole;
* the same generator seed gives the same output; bad configurations are refused by name.

Speed is not asserted here (DESIGN.md: no wall-clock tests).
"""

from __future__ import annotations

import math

import pytest
import torch

from bertlab.data.masking import (
    MaskingConfig,
    continuation_table,
    mask_tokens,
    special_tokens_mask,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIAL_IDS = [PAD, CLS, SEP]
BIG_VOCAB = 30522  # bert-base-uncased's size


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def single_batch(lengths: list[int], seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """(B, seq_len) ids: [CLS] + n random ordinary tokens + [SEP], then [PAD]."""
    g = gen(seed)
    ids = torch.full((len(lengths), seq_len), PAD, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, 0] = CLS
        ids[b, 1 : n + 1] = torch.randint(MASK + 1, vocab_size, (n,), generator=g)
        ids[b, n + 1] = SEP
    return ids


def special_of(ids: torch.Tensor) -> torch.Tensor:
    return torch.isin(ids, torch.tensor(SPECIAL_IDS))


# A small word-piece vocabulary: 5 specials, 40 word starts ("w0".."w39"), 40 continuations.
SMALL_VOCAB = (
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    + [f"w{i}" for i in range(40)]
    + [f"##p{i}" for i in range(40)]
)
STARTS = range(5, 45)
CONTINUATIONS = range(45, 85)


def word_batch(rows: int, seq_len: int, seed: int) -> torch.Tensor:
    """(rows, seq_len) ids of the small vocabulary: [CLS] words [SEP] words [SEP] [PAD]..., each
    word a start piece and 0-3 "##" pieces. Some segments open with a stray "##" piece (right
    after [CLS] or [SEP]), which must be a word of its own, never joined across the special."""
    g = gen(seed)
    ids = torch.full((rows, seq_len), PAD, dtype=torch.long)

    def pick(choices: range) -> int:
        return choices[int(torch.randint(len(choices), (1,), generator=g))]

    for b in range(rows):
        total = int(torch.randint(0, seq_len - 2, (1,), generator=g))  # pieces, before [SEP]s
        split = int(torch.randint(0, total + 1, (1,), generator=g))
        row = [CLS]
        for segment_len in (split, total - split):
            pieces: list[int] = []
            if segment_len and torch.rand(1, generator=g) < 0.3:
                pieces.append(pick(CONTINUATIONS))  # stray continuation opening the segment
            while len(pieces) < segment_len:
                pieces.append(pick(STARTS))
                for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
                    pieces.append(pick(CONTINUATIONS))
            row += pieces[:segment_len] + [SEP]
        row = row[:seq_len]
        ids[b, : len(row)] = torch.tensor(row)
    return ids


def words_of(ids: list[int], special: list[bool], whole_word: bool) -> list[list[int]]:
    """The candidates of the original create_masked_lm_predictions: lists of positions. A "##"
    piece joins the word before it only when that word ends right before it (no special token
    or padding between)."""
    words: list[list[int]] = []
    for i, token in enumerate(ids):
        if special[i]:
            continue
        is_cont = SMALL_VOCAB[token].startswith("##") if token < len(SMALL_VOCAB) else False
        if whole_word and is_cont and words and words[-1][-1] == i - 1:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def quota_of(n_real: int, config: MaskingConfig) -> int:
    """num_to_predict, with Python's round as in the original."""
    return min(config.max_predictions, max(1, round(n_real * config.rate))) if n_real else 0


def original_recipe(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    vocab_size: int,
    config: MaskingConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The original loop, one token at a time. Its randomness comes from the same draws as
    mask_tokens makes, in the same order (a shuffle score per position, read at each word's
    start; a uniform per position for the 80/10/10 choice; a random id per position), so the
    outputs must match exactly. If mask_tokens changes how it draws, update this too.

    Also returns how many words were skipped (too long for what was left) before a later word
    was taken: the case that makes the greedy pass more than a prefix of the shuffle."""
    rows, seq_len = input_ids.shape
    score = torch.rand(rows, seq_len, generator=generator, dtype=torch.float64)
    u = torch.rand(rows, seq_len, generator=generator, dtype=torch.float64)
    random_ids = torch.randint(0, vocab_size, (rows, seq_len), generator=generator)
    masked, labels = input_ids.clone(), torch.full_like(input_ids, -100)
    skipped_then_taken = 0
    for b in range(rows):
        ids, special = input_ids[b].tolist(), special_mask[b].tolist()
        words = words_of(ids, special, config.whole_word)
        words.sort(key=lambda w: float(score[b, w[0]]))  # rng.shuffle(cand_indexes)
        quota = quota_of(sum(not s for s in special), config)
        count, skipped = 0, 0
        for word in words:
            if count >= quota:
                break
            if count + len(word) > quota:
                skipped += 1
                continue  # this word would pass the quota: skip it, try the next
            skipped_then_taken += skipped
            skipped = 0
            for i in word:
                count += 1
                labels[b, i] = ids[i]
                if u[b, i] < config.mask_prob:
                    masked[b, i] = MASK
                elif u[b, i] < config.mask_prob + config.random_prob:
                    masked[b, i] = random_ids[b, i]
    return masked, labels, skipped_then_taken


# ----------------------------------------------------------------------------- the recipe
@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("max_predictions", [3, 20])
@pytest.mark.parametrize("rate", [0.15, 0.5])
def test_matches_the_original_loop(whole_word, max_predictions, rate):
    ids = word_batch(300, 48, seed=1)
    special = special_of(ids)
    config = MaskingConfig(rate=rate, max_predictions=max_predictions, whole_word=whole_word)
    table = continuation_table(SMALL_VOCAB)
    got = mask_tokens(ids, special, len(SMALL_VOCAB), MASK, config, gen(7), table)
    *want, skipped_then_taken = original_recipe(ids, special, len(SMALL_VOCAB), config, gen(7))
    assert torch.equal(got[1], want[1]), "chosen positions differ from the original loop"
    assert torch.equal(got[0], want[0]), "corrupted ids differ from the original loop"
    # The comparison means something: many tokens were chosen and corrupted, and with whole
    # words some words were skipped for being too long while a later, shorter one was taken.
    assert (got[1] != -100).sum() > 300 and (got[0] == MASK).sum() > 200
    if whole_word:
        assert skipped_then_taken > 20


def test_proportions_on_a_large_sample():
    rows, n, config = 2000, 128, MaskingConfig()
    ids = single_batch([n] * rows, n + 2, BIG_VOCAB, seed=0)
    masked, labels = mask_tokens(ids, special_of(ids), BIG_VOCAB, MASK, config, gen(1))
    chosen = labels != -100

    # num_to_predict = min(20, round(128 * 0.15)) = round(19.2) = 19 exactly, in every row.
    assert quota_of(n, config) == 19
    assert chosen.sum(1).eq(19).all(), chosen.sum(1).unique()

    # Every real position is equally likely to be chosen (a biased shuffle would favour some):
    # per position, binomial(rows, 19/128); 5 sd over 128 positions fails by chance ~1e-4.
    p = 19 / n
    per_position = chosen[:, 1 : n + 1].sum(0).double()
    sd = math.sqrt(rows * p * (1 - p))
    assert (per_position - rows * p).abs().max() < 5 * sd, per_position

    # Among the chosen: [MASK], unchanged, other. A random replacement can land on [MASK] or on
    # the original token (1/V each), so the expected shares include that.
    total = int(chosen.sum())
    got = masked[chosen]
    original = labels[chosen]
    shares = {
        "mask": (int((got == MASK).sum()), 0.8 + 0.1 / BIG_VOCAB),
        "unchanged": (int((got == original).sum()), 0.1 + 0.1 / BIG_VOCAB),
        "random": (int(((got != MASK) & (got != original)).sum()), 0.1 * (1 - 2 / BIG_VOCAB)),
    }
    for name, (count, q) in shares.items():
        sd = math.sqrt(total * q * (1 - q))
        assert abs(count - total * q) < 4 * sd, (name, count / total, q)


@pytest.mark.parametrize("max_predictions", [5, 20])
def test_number_chosen_per_row_and_the_cap(max_predictions):
    lengths = list(range(0, 141))  # every real length, 0 to 140, in one (141, 144) batch
    ids = single_batch(lengths, 144, BIG_VOCAB, seed=2)
    config = MaskingConfig(max_predictions=max_predictions)
    _, labels = mask_tokens(ids, special_of(ids), BIG_VOCAB, MASK, config, gen(3))
    counts = (labels != -100).sum(1).tolist()
    assert counts == [quota_of(n, config) for n in lengths]
    assert max(counts) == max_predictions  # the cap binds on the long rows (round(21.0) > 20)
    assert counts[1] == 1  # max(1, round(0.15)): a one-token sequence still predicts one


@pytest.mark.parametrize("whole_word", [False, True])
def test_special_tokens_and_padding_are_never_chosen(whole_word):
    ids = word_batch(400, 40, seed=4)
    special = special_of(ids)
    assert special.sum() > 0 and (ids == PAD).sum() > 0  # the batch has [SEP]s and padding
    config = MaskingConfig(rate=0.9, max_predictions=40, whole_word=whole_word)
    masked, labels = mask_tokens(
        ids, special, len(SMALL_VOCAB), MASK, config, gen(5), continuation_table(SMALL_VOCAB)
    )
    assert (labels[special] == -100).all()
    assert torch.equal(masked[special], ids[special])
    assert (labels[~special] != -100).float().mean() > 0.8  # rate 0.9: nearly all real ones


def test_chosen_unchanged_and_random_ids():
    vocab_size = 50  # small, so that random replacements cover the range
    ids = single_batch([60] * 300, 64, vocab_size, seed=6)
    config = MaskingConfig(rate=0.5, max_predictions=64)
    masked, labels = mask_tokens(ids, special_of(ids), vocab_size, MASK, config, gen(7))
    chosen = labels != -100
    assert torch.equal(labels[chosen], ids[chosen])  # labels are the original ids
    assert torch.equal(masked[~chosen], ids[~chosen])  # the rest is untouched
    assert masked.min() >= 0 and masked.max() < vocab_size
    replaced = chosen & (masked != MASK) & (masked != ids)
    assert replaced.sum() > 500
    assert len(masked[replaced].unique()) == vocab_size - 1  # every id but [MASK] was drawn
    assert labels.dtype == torch.long and masked.dtype == ids.dtype


@pytest.mark.parametrize(
    "mask_prob, random_prob, expect",
    [(1.0, 0.0, "all mask"), (0.0, 0.0, "all unchanged"), (0.0, 1.0, "all random")],
)
def test_extreme_probabilities(mask_prob, random_prob, expect):
    ids = single_batch([100] * 50, 102, BIG_VOCAB, seed=8)
    config = MaskingConfig(mask_prob=mask_prob, random_prob=random_prob)
    masked, labels = mask_tokens(ids, special_of(ids), BIG_VOCAB, MASK, config, gen(9))
    chosen = labels != -100
    assert chosen.sum(1).eq(15).all()
    if expect == "all mask":
        assert (masked[chosen] == MASK).all()
    elif expect == "all unchanged":
        assert torch.equal(masked, ids)
    else:  # random ids: with V = 30522, almost none equal the original or [MASK]
        assert ((masked[chosen] != ids[chosen]) & (masked[chosen] != MASK)).float().mean() > 0.99


# ----------------------------------------------------------------------------- whole words
def test_whole_words_are_taken_whole():
    ids = word_batch(500, 64, seed=10)
    special = special_of(ids)
    config = MaskingConfig(whole_word=True)
    table = continuation_table(SMALL_VOCAB)
    _, labels = mask_tokens(ids, special, len(SMALL_VOCAB), MASK, config, gen(11), table)
    chosen = (labels != -100).tolist()
    multi_piece_chosen = 0
    for b in range(len(ids)):
        words = words_of(ids[b].tolist(), special[b].tolist(), whole_word=True)
        quota = quota_of(sum(len(w) for w in words), config)
        taken = [w for w in words if chosen[b][w[0]]]
        # every piece of a word is labelled iff its start piece is
        for w in words:
            assert all(chosen[b][i] == chosen[b][w[0]] for i in w), (b, w)
        count = sum(len(w) for w in taken)
        assert count <= quota
        # the greedy pass stops only when nothing else fits: every word left out is longer
        # than what is left of the quota
        left = [w for w in words if not chosen[b][w[0]]]
        assert all(len(w) > quota - count for w in left), (b, quota, count)
        multi_piece_chosen += sum(len(w) > 1 for w in taken)
    assert multi_piece_chosen > 200  # the check covered real multi-piece words


def test_without_whole_word_pieces_are_chosen_alone():
    ids = word_batch(500, 64, seed=10)
    special = special_of(ids)
    _, labels = mask_tokens(ids, special, len(SMALL_VOCAB), MASK, MaskingConfig(), gen(11))
    chosen = (labels != -100).tolist()
    split = 0
    for b in range(len(ids)):
        for w in words_of(ids[b].tolist(), special[b].tolist(), whole_word=True):
            split += len({chosen[b][i] for i in w}) == 2  # part of the word chosen
    assert split > 50


def test_stray_continuation_after_a_special_token_is_its_own_word():
    #            [CLS] w0 ##p0 [SEP] ##p1 w1 [SEP]
    ids = torch.tensor([[CLS, 5, 45, SEP, 46, 6, SEP]] * 2000)
    config = MaskingConfig(rate=0.2, whole_word=True)  # quota: round(4 * 0.2) = 1 piece
    table = continuation_table(SMALL_VOCAB)
    _, labels = mask_tokens(ids, special_of(ids), len(SMALL_VOCAB), MASK, config, gen(12), table)
    chosen = labels != -100
    # "w0 ##p0" (2 pieces) never fits a quota of 1; "##p1" and "w1" are one piece each. Joined
    # across the [SEP] to "w0 ##p0", "##p1" would never be chosen.
    assert not chosen[:, 1:3].any()
    assert chosen.sum(1).eq(1).all()
    assert 900 < int(chosen[:, 4].sum()) < 1100  # half of 2000, binomial sd ~22


# ----------------------------------------------------------------------------- edge cases
def test_rows_without_real_tokens():
    ids = torch.tensor(
        [
            [PAD] * 6,  # all padding
            [CLS, SEP] + [PAD] * 4,  # an empty text
            [CLS, 10, 11, 12, SEP, PAD],
        ]
    )
    for whole_word in (False, True):
        config = MaskingConfig(whole_word=whole_word)
        table = continuation_table(SMALL_VOCAB)
        masked, labels = mask_tokens(
            ids, special_of(ids), len(SMALL_VOCAB), MASK, config, gen(13), table
        )
        assert (labels[:2] == -100).all() and torch.equal(masked[:2], ids[:2])
        assert int((labels[2] != -100).sum()) == 1  # max(1, round(3 * 0.15))
    # a batch with nothing to choose at all
    masked, labels = mask_tokens(ids[:2], special_of(ids[:2]), 99, MASK, MaskingConfig(), gen(0))
    assert (labels == -100).all() and torch.equal(masked, ids[:2])


def test_determinism():
    ids = word_batch(64, 48, seed=14)
    special = special_of(ids)
    table = continuation_table(SMALL_VOCAB)
    for config in (MaskingConfig(), MaskingConfig(whole_word=True)):

        def run(seed: int, config=config):
            return mask_tokens(ids, special, len(SMALL_VOCAB), MASK, config, gen(seed), table)

        a, b, c = run(0), run(0), run(1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert not torch.equal(a[1], c[1])
        assert not torch.equal(a[0], c[0])


def test_input_ids_are_not_modified():
    ids = single_batch([20] * 4, 24, BIG_VOCAB, seed=15)
    before = ids.clone()
    mask_tokens(ids, special_of(ids), BIG_VOCAB, MASK, MaskingConfig(), gen(0))
    assert torch.equal(ids, before)


# ----------------------------------------------------------------------------- helpers
def test_continuation_table_from_list_and_dict():
    table = continuation_table(SMALL_VOCAB)
    assert table.shape == (85,) and table.dtype == torch.bool
    assert table[45:].all() and not table[:45].any()
    from_dict = continuation_table({"[PAD]": 0, "play": 1, "##ing": 3})  # id 2 unused
    assert from_dict.tolist() == [False, False, False, True]


def test_special_tokens_mask():
    ids = torch.tensor([[CLS, 10, 11, SEP, PAD], [CLS, 12, SEP, 13, SEP]])
    attention = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    got = special_tokens_mask(ids, attention, [CLS, SEP])
    want = torch.tensor([[1, 0, 0, 1, 1], [1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(got, want)
    # padding is found by the attention mask, whatever id the padding holds
    assert special_tokens_mask(torch.full((1, 3), 7), torch.tensor([[1, 0, 0]]), []).tolist() == [
        [False, True, True]
    ]


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(rate=0.0), "rate"),
        (dict(rate=1.0), "rate"),
        (dict(rate=-0.1), "rate"),
        (dict(rate=float("nan")), "rate"),
        (dict(mask_prob=-0.1), "mask_prob"),
        (dict(random_prob=-0.01), "random_prob"),
        (dict(mask_prob=1.5, random_prob=0.0), "mask_prob"),
        (dict(mask_prob=0.95, random_prob=0.1), r"mask_prob \+ random_prob"),
        (dict(max_predictions=0), "max_predictions"),
        (dict(max_predictions=2.5), "max_predictions"),
    ],
)
def test_bad_config_is_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=rf"MaskingConfig\.{field}"):
        MaskingConfig(**kwargs)


def test_edge_configs_are_accepted():
    MaskingConfig(mask_prob=0.7, random_prob=0.3)
    MaskingConfig(mask_prob=0.0, random_prob=0.0, max_predictions=1, rate=0.999)


def test_bad_arguments_are_refused():
    ids = torch.tensor([[CLS, 10, 11, SEP]])
    special = special_of(ids)
    config = MaskingConfig()
    with pytest.raises(ValueError, match="continuation table"):
        mask_tokens(ids, special, 99, MASK, MaskingConfig(whole_word=True), gen(0))
    with pytest.raises(ValueError, match="token id 200 at row 0, position 1"):
        bad = torch.tensor([[CLS, 200, 11, SEP]])
        table = continuation_table(SMALL_VOCAB)
        mask_tokens(bad, special, 300, MASK, MaskingConfig(whole_word=True), gen(0), table)
    with pytest.raises(ValueError, match="mask_token_id 99 is outside the vocabulary"):
        mask_tokens(ids, special, 99, 99, config, gen(0))
    with pytest.raises(ValueError, match="special_mask"):
        mask_tokens(ids, special[:, :3], 99, MASK, config, gen(0))
    with pytest.raises(ValueError, match="special_mask"):
        mask_tokens(ids, special.long(), 99, MASK, config, gen(0))
    with pytest.raises(ValueError, match=r"input_ids must be a \(B, T\) integer tensor"):
        mask_tokens(ids[0], special[0], 99, MASK, config, gen(0))

"""The one front half of inference: texts -> checked, tokenized rows (cut or split into windows
at the model's length) -> padded batches -> the model -> each row's output -> windows merged
back into one result per text.

    limit = max_tokens(model.config, tokenizer)           # the one length rule
    encoded = encode(tokenizer, texts, "mean", limit=limit, fields=[...], long="truncate")
    reader = Reader(model)                                # what a batch yields per row
    outputs = reader(rows, batch_of(rows, pad_id))        # one batch, for any rows
    for e, outs in zip(encoded, per_text(encoded, outputs)): merge_vectors(e, outs) ...

Every way of running inference takes these steps: the pipelines of both name sets (base.py runs
the rows in order, ``batch_size`` at a time, and predict.py and tasks.py format the outputs), the
server (bertlab/serve: its batcher packs rows from many requests under a token budget and its
routes format the outputs with the pipelines' methods) and the explorer (bertlab/explore: one
row, run with hooks). What is here therefore holds everywhere: texts pass text.py's checks
before the tokenizer sees them; a text past ``max_tokens`` is refused (``TooLong``), cut, or
split into windows; each output is read from the model's own output the same way.

A row says what it yields (``Row.want``): "mean" or "cls" (a sentence vector, (H,) float32),
"logits" (a classifier's (C,)), "tokens" (a tagger's (n, C) probabilities), "span" (a reader's
start and end logits, two (n,)), "masks" (the masked-LM logits at its [MASK]s, (M, V)) or
"hidden" (every token's last hidden state, (n, H)).

Imports the network (nn) and text.py; the pipelines (base.py and those on it), the server and
the explorer import this, and nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertlab.nn.compiled import Compiled
from bertlab.nn.heads import HEADS
from bertlab.nn.packing import mean_pool
from bertlab.pipelines.text import InputError, check_text

WANTS = ("mean", "cls", "logits", "tokens", "span", "masks", "hidden")
# The heads whose own forward gives the answer; the others run their encoder (and, for "masks",
# the masked-LM head on the [MASK] rows alone).
HEADED = ("sequence-classification", "token-classification", "question-answering")
WINDOW_OVERLAP = 128  # tokens two neighbouring tagging windows share (at most half a window)
LONG = ("error", "truncate", "windows")


@dataclass
class Row:
    """One sequence for the model: its ids and what it yields (one of WANTS)."""

    input_ids: list[int]
    token_type_ids: list[int]
    want: str

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Encoded:
    """What ``encode`` made of one text: its rows (one, or its windows ``step`` pieces apart),
    its token count before any cut ([CLS] and [SEP] included), whether it was cut, and, when
    asked for, the word id, character offsets and special-token flag of each piece of the
    result: the row's pieces when there is one row, the whole text's when there are windows
    (what ``merge_tokens`` gives back)."""

    rows: list[Row]
    tokens: int
    truncated: bool = False
    word_ids: list[int | None] | None = None
    offsets: list[tuple[int, int]] | None = None
    special: list[int] | None = None
    step: int = 0


class TooLong(InputError):
    """A text past the model's length where it may not be cut: ``long="error"``, or windows
    asked of a text pair (``windows``). Callers say how their users ask for a cut."""

    def __init__(self, field: str, tokens: int, limit: int, pair: bool, windows: bool = False):
        if windows:
            message = (
                f"{field}: a text pair of {tokens} tokens cannot be split into windows (at most "
                f"{limit})"
            )
        else:
            message = f"{field} has {tokens} tokens; this model takes at most {limit}"
        super().__init__(field, message, limit=not windows)
        self.tokens, self.most, self.pair, self.windows = tokens, limit, pair, windows


def max_tokens(config: Any, tokenizer: Any) -> int:
    """The longest row, [CLS] and [SEP] included: the model's positions, or the tokenizer's
    ``model_max_length`` where that is shorter (as transformers' pipelines cut)."""
    return int(min(config.max_position_embeddings, tokenizer.model_max_length))


def tag_step(limit: int) -> int:
    """How far apart tagging windows start: their body less WINDOW_OVERLAP (at most half)."""
    body = limit - 2
    return body - min(WINDOW_OVERLAP, body // 2)


def encode(
    tokenizer: Any,
    texts: Sequence[str],
    want: str,
    *,
    limit: int,
    pairs: Sequence[str] | None = None,
    fields: Sequence[str] | None = None,
    pair_fields: Sequence[str] | None = None,
    long: str = "error",
    truncation_direction: str = "right",
    pair_truncation: str = "longest_first",
    offsets: bool = False,
) -> list[Encoded]:
    """Each text (with its pair) as rows of at most ``limit`` tokens. Every text is checked
    first (text.py), named by ``fields`` (default ``texts[i]``; a refusal of a long text names
    its text's field) and ``pair_fields`` (default ``pairs[i]``). ``long`` says what happens past
    ``limit``: "error" (``TooLong``), "truncate" (cut on the ``truncation_direction`` side; a
    pair by ``pair_truncation``, on the right) or "windows" (split, [CLS] and [SEP] around each
    window: side by side, or for tagging ("tokens") overlapping by WINDOW_OVERLAP). ``offsets``:
    keep each piece's word id, character offsets and special flag (``Encoded``)."""
    if want not in WANTS:
        raise ValueError(f"unknown row output {want!r}; one of {', '.join(WANTS)}")
    if long not in LONG:
        raise ValueError(f"long {long!r} is not one of {', '.join(LONG)}")
    fields = [f"texts[{i}]" for i in range(len(texts))] if fields is None else list(fields)
    for text, field in zip(texts, fields, strict=True):
        check_text(text, field)
    if pairs is not None:
        if len(pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        if pair_fields is None:
            pair_fields = [f"pairs[{i}]" for i in range(len(pairs))]
        for text, field in zip(pairs, pair_fields, strict=True):
            check_text(text, field)
    if not texts:
        return []
    extra = {"return_offsets_mapping": offsets, "return_special_tokens_mask": offsets}
    enc = tokenizer(
        list(texts),
        None if pairs is None else list(pairs),
        truncation=False,
        return_attention_mask=False,
        verbose=False,  # a long text is refused, cut or split below
        **extra,
    )
    L, out = limit, []
    for i, field in enumerate(fields):
        ids, types = enc["input_ids"][i], enc["token_type_ids"][i]
        n = len(ids)
        pieces = _pieces(enc, i) if offsets else {}
        if n <= L:
            out.append(Encoded([Row(ids, types, want)], n, **pieces))
            continue
        if long == "error":
            raise TooLong(field, n, L, pairs is not None)
        if pairs is not None:
            if long == "windows":
                raise TooLong(field, n, L, True, windows=True)
            if truncation_direction != "right":
                raise InputError(
                    "truncation_direction", "text pairs are truncated on the right only"
                )
            cut = tokenizer(
                [texts[i]],
                [pairs[i]],
                truncation=pair_truncation,
                max_length=L,
                return_attention_mask=False,
                **extra,
            )
            row = Row(cut["input_ids"][0], cut["token_type_ids"][0], want)
            out.append(Encoded([row], n, True, **(_pieces(cut, 0) if offsets else {})))
            continue
        if long == "truncate":
            if truncation_direction == "right":
                keep = [*range(L - 1), n - 1]
            else:
                keep = [0, *range(n - L + 1, n)]
            row = Row([ids[p] for p in keep], [0] * L, want)
            kept = {k: [v[p] for p in keep] for k, v in pieces.items()}
            out.append(Encoded([row], n, True, **kept))
            continue
        cls, body, sep = ids[:1], ids[1:-1], ids[-1:]
        step = tag_step(L) if want == "tokens" else L - 2
        rows = []
        for start in range(0, len(body), step):
            part = body[start : start + L - 2]
            rows.append(Row(cls + part + sep, [0] * (len(part) + 2), want))
            if start + L - 2 >= len(body):
                break
        out.append(Encoded(rows, n, False, step=step, **pieces))
    return out


def _pieces(enc: Any, i: int) -> dict[str, list]:
    return {
        "word_ids": enc.word_ids(i),
        "offsets": [tuple(o) for o in enc["offset_mapping"][i]],
        "special": enc["special_tokens_mask"][i],
    }


def rows_of(encoded: Sequence[Encoded]) -> list[Row]:
    """Every text's rows, in order: what runs."""
    return [row for e in encoded for row in e.rows]


def per_text(encoded: Sequence[Encoded], outputs: Sequence[Any]) -> list[list[Any]]:
    """The rows' outputs regrouped per text (a list of its windows' outputs each)."""
    out, i = [], 0
    for e in encoded:
        out.append(list(outputs[i : i + len(e.rows)]))
        i += len(e.rows)
    return out


# ============================================================================ batches
def pad_rows(rows: Sequence[Row], pad_id: int, width: int | None = None) -> dict[str, np.ndarray]:
    """The rows as a padded batch: input_ids, token_type_ids and attention_mask, (B, T) int64,
    made with numpy (the server's batcher thread never starts a team of torch workers).

    With ``width`` (the model's length), T is one more than the longest row where that fits:
    every batch then has padding, so the model runs it packed on a rounded row count
    (packing.round_rows) as it does any padded batch, and a server meets a bounded set of
    matrix shapes (about 16 per doubling of the token count), each built once, instead of one
    per exact token count, whose kernels pile up in oneDNN's cache. Over 20,000 batch-1
    requests run through the server's forward in one process, memory grew by 8% of its level
    after the first 1,000 this way, and by 14% without."""
    B, T = len(rows), max(len(r) for r in rows)
    if width is not None and T < width:
        T += 1
    ids = np.full((B, T), pad_id, dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for i, r in enumerate(rows):
        n = len(r)
        ids[i, :n], types[i, :n], mask[i, :n] = r.input_ids, r.token_type_ids, 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def batch_of(
    rows: Sequence[Row], pad_id: int, device: torch.device | str = "cpu", width: int | None = None
) -> dict[str, torch.Tensor]:
    """``pad_rows`` as tensors on ``device``."""
    return {k: torch.from_numpy(v).to(device) for k, v in pad_rows(rows, pad_id, width).items()}


# ============================================================================ the model
def head_name(model: torch.nn.Module) -> str:
    """The key of HEADS whose class ``model`` is (or derives from); "base" for any other."""
    return next((h for h, cls in HEADS.items() if isinstance(model, cls)), "base")


def runnable(model: torch.nn.Module, head: str | None = None) -> torch.nn.Module:
    """What a batch runs through: the model itself for the HEADED heads, else its encoder."""
    head = head_name(model) if head is None else head
    return model if head in HEADED else getattr(model, "bert", model)


def sentence_vectors(
    forward: torch.nn.Module | Compiled, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch through a BertModel or its ``Compiled`` program -> (B, H) float32 means over
    the real tokens and (B, H) [CLS] vectors. The model pools its output in the layout it ran
    in (``Encoded.mean``: packed, without a padded copy); a compiled program, whose output is
    padded, pools that."""
    if isinstance(forward, Compiled):
        hidden = forward(**batch).last_hidden_state.float()  # (B, T, H)
        return mean_pool(hidden, batch["attention_mask"]), hidden[:, 0]
    enc = forward.encode(**batch)
    return enc.mean(), enc.first().float()


class Reader:
    """One model's batches -> each row's output (module docstring: ``Row.want``), on the CPU.

    ``run`` is what the batch goes through: ``runnable(model)`` (default), or a ``Compiled``
    program of it. ``head``: the model's key of HEADS (default: from its class). ``mask_id``:
    the tokenizer's [MASK], for "masks" rows."""

    def __init__(
        self,
        model: torch.nn.Module,
        run: torch.nn.Module | Compiled | None = None,
        head: str | None = None,
        mask_id: int | None = None,
    ):
        self.model, self.mask_id = model, mask_id
        self.head = head_name(model) if head is None else head
        self.run: Callable[..., Any] = runnable(model, self.head) if run is None else run

    def __call__(self, rows: Sequence[Row], batch: dict[str, torch.Tensor]) -> list[Any]:
        """``rows`` padded into ``batch`` (``batch_of``) -> each row's output, in order:
        mean/cls (H,) float32; logits (C,); tokens (n, C) probabilities; span two (n,);
        masks (M, V) logits at its [MASK] positions; hidden (n, H)."""
        wants = {row.want for row in rows}
        out = hidden = means = first = None
        if self.head in HEADED:
            out = self.run(**batch)
        elif wants & {"masks", "hidden"}:
            hidden = self.run(**batch).last_hidden_state.float()  # (B, T, H)
            if wants & {"mean", "cls"}:
                means, first = mean_pool(hidden, batch["attention_mask"]), hidden[:, 0]
        else:
            means, first = sentence_vectors(self.run, batch)  # (B, H) each
        results: list[Any] = []
        for r, row in enumerate(rows):
            n = len(row)
            if row.want == "mean":
                results.append(means[r].cpu())
            elif row.want == "cls":
                results.append(first[r].clone().cpu())
            elif row.want == "logits":
                results.append(out.logits[r].float().cpu())
            elif row.want == "tokens":
                results.append(out.logits[r, :n].float().softmax(-1).cpu())
            elif row.want == "span":
                s, e = out.start_logits[r, :n].float(), out.end_logits[r, :n].float()
                results.append((s.cpu(), e.cpu()))
            elif row.want == "hidden":
                results.append(hidden[r, :n].cpu())
            elif row.want == "masks":  # the masked-LM head on the [MASK] rows alone
                head = self.model.mlm_head()
                where = [p for p, t in enumerate(row.input_ids) if t == self.mask_id]
                h = hidden[r, where].to(head.bias.dtype)  # (M, H)
                results.append(head(h).float().cpu())
            else:
                raise ValueError(f"unknown row output {row.want!r}")
        return results


# ============================================================================ windows back
def merge_vectors(e: Encoded, outs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A text's (H,) vector from its windows' vectors, each weighted by its tokens."""
    if len(outs) == 1:
        return outs[0]
    w = torch.tensor([float(len(r)) for r in e.rows])
    return (torch.stack(list(outs)) * w[:, None]).sum(0) / w.sum()


def merge_tokens(e: Encoded, outs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A text's (n, C) per-piece outputs from its windows' (n_w, C): each piece from the window
    where it sits farthest from an edge; window w starts ``w * e.step`` pieces in."""
    if len(outs) == 1:
        return outs[0]
    n = e.tokens
    merged = torch.empty(n, outs[0].shape[-1])
    room = torch.full((n,), -1)
    merged[0], merged[n - 1] = outs[0][0], outs[-1][-1]  # [CLS] and [SEP]
    for w, (row, probs) in enumerate(zip(e.rows, outs, strict=True)):
        body = len(row) - 2
        for j in range(body):
            p, r = 1 + w * e.step + j, min(j, body - 1 - j)
            if r > room[p]:
                room[p], merged[p] = r, probs[1 + j]
    return merged

"""What transformers' models offer besides their forward, with the same names and results, so
that code and tools written for them (Trainer, PEFT, accelerate, torch.hub) run on bertlab
models: ``device`` and ``dtype``, parameter counts, the embedding tables and their resizing,
gradient checkpointing, ``return_dict``, and ``from_pretrained`` / ``save_pretrained`` (whose
work is in io/checkpoint.py, imported where they are called: the one import from nn/ upward).

A mixin of model.py's BertPreTrainedModel: it reads ``self.config``, ``self.base_model`` (the
encoder) and, on models with a masked-LM head, ``self.cls.predictions``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from bertlab.nn.config import BertConfig


class TransformersSurface:
    config_class = BertConfig
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["BertLayer"]  # accelerate: never split a layer across devices
    _keys_to_ignore_on_save = None
    # Each loss is a mean over its own batch; transformers' Trainer then averages over
    # accumulated batches itself (it would not if a forward claimed to use num_items_in_batch).
    accepts_loss_kwargs = False

    def returned(self, out: Any, return_dict: bool | None) -> Any:
        """The output as asked: the output object, or (return_dict=False) its computed fields
        as a tuple. None: the config's return_dict."""
        if return_dict is None:
            return_dict = self.config.return_dict
        return out if return_dict else out.to_tuple()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the floating-point weights."""
        return next(p.dtype for p in self.parameters() if p.is_floating_point())

    @property
    def name_or_path(self) -> str:
        return self.config.name_or_path

    def num_parameters(
        self,
        only_trainable: bool = False,
        exclude_embeddings: bool = False,
        trainable_only: bool | None = None,  # bertlab's earlier name of only_trainable
    ) -> int:
        """Distinct parameters (tied weights counted once); optionally only those that train,
        or without the embedding tables (word, position, token type)."""
        if trainable_only is not None:
            only_trainable = trainable_only
        skip = set()
        if exclude_embeddings:
            skip = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        return sum(
            p.numel()
            for p in self.parameters()
            if (p.requires_grad or not only_trainable) and id(p) not in skip
        )

    def get_input_embeddings(self) -> nn.Embedding:
        return self.base_model.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.base_model.embeddings.word_embeddings = value
        self.tie_weights()

    def mlm_head(self) -> nn.Module | None:
        """The masked-LM prediction head (``cls.predictions``), None for a model without one."""
        return getattr(getattr(self, "cls", None), "predictions", None)

    def get_output_embeddings(self) -> nn.Linear | None:
        """The MLM decoder (tied to the word embeddings), or None for a model without one."""
        head = self.mlm_head()
        return None if head is None else head.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.cls.predictions.decoder = value

    def resize_token_embeddings(
        self,
        new_num_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        mean_resizing: bool = True,
    ) -> nn.Embedding:
        """Give the vocabulary ``new_num_tokens`` rows (after a tokenizer's ``add_tokens``).
        Kept rows keep their weights; new rows start at the mean of the old ones
        (``mean_resizing``, as transformers' starting point; else BERT's initialisation), and
        the MLM output bias at 0. The MLM decoder stays tied. Fewer rows than the ids the
        config names (pad and other special token ids) is refused."""
        old = self.get_input_embeddings()
        if new_num_tokens is None:
            new_num_tokens = old.num_embeddings
        if not isinstance(new_num_tokens, int) or isinstance(new_num_tokens, bool):
            raise TypeError(f"new_num_tokens must be an int, got {new_num_tokens!r}")
        if pad_to_multiple_of is not None:
            if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of <= 0:
                raise ValueError(
                    f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of!r}"
                )
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        in_use = {
            name: getattr(self.config, name)
            for name in (
                "pad_token_id",
                "bos_token_id",
                "eos_token_id",
                "sep_token_id",
                "cls_token_id",
                "mask_token_id",
                "unk_token_id",
            )
            if isinstance(getattr(self.config, name, None), int)
        }
        needed = max(in_use.values(), default=-1) + 1
        if new_num_tokens < max(needed, 1):
            used = ", ".join(f"{k}={v}" for k, v in in_use.items())
            raise ValueError(
                f"resize_token_embeddings({new_num_tokens}) would drop ids still in use ({used}):"
                f" the vocabulary needs at least {needed} rows"
            )
        keep = min(old.num_embeddings, new_num_tokens)
        new = nn.Embedding(
            new_num_tokens,
            old.embedding_dim,
            padding_idx=old.padding_idx,
            device=old.weight.device,
            dtype=old.weight.dtype,
        )
        with torch.no_grad():
            if mean_resizing:
                new.weight.copy_(old.weight.mean(0, keepdim=True).expand_as(new.weight))
            else:
                new.weight.normal_(0.0, self.config.initializer_range)
            new.weight[:keep] = old.weight[:keep]
        new.weight.requires_grad_(old.weight.requires_grad)
        self.base_model.embeddings.word_embeddings = new
        head = self.mlm_head()
        if head is not None:
            bias = torch.zeros(new_num_tokens, dtype=head.bias.dtype, device=head.bias.device)
            with torch.no_grad():
                bias[:keep] = head.bias[:keep]
            head.bias = nn.Parameter(bias, requires_grad=head.bias.requires_grad)
            if not self.config.tie_word_embeddings:
                decoder = nn.Linear(old.embedding_dim, new_num_tokens, bias=False)
                decoder.to(head.decoder.weight)
                with torch.no_grad():
                    decoder.weight.copy_(new.weight)
                    decoder.weight[:keep] = head.decoder.weight[:keep]
                head.decoder = decoder
        for m in self.modules():
            if isinstance(m, TransformersSurface):
                m.config.vocab_size = new_num_tokens
        self.tie_weights()
        return new

    def gradient_checkpointing_enable(
        self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
    ) -> None:
        """In training, keep each layer's input only and recompute the layer in the backward
        pass: activation memory falls from every layer's intermediates to one layer's, for one
        extra forward; gradients are unchanged (dropout draws the same masks again).
        ``gradient_checkpointing_kwargs`` go to ``torch.utils.checkpoint.checkpoint``."""
        encoder = self.base_model.encoder
        encoder.gradient_checkpointing = True
        encoder.checkpoint_options = dict(gradient_checkpointing_kwargs or {})

    def gradient_checkpointing_disable(self) -> None:
        self.base_model.encoder.gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.base_model.encoder.gradient_checkpointing

    # transformers' newer names of the three above
    def activation_checkpointing_enable(
        self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.gradient_checkpointing_enable(gradient_checkpointing_kwargs)

    def activation_checkpointing_disable(self) -> None:
        self.gradient_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.is_gradient_checkpointing

    def enable_input_require_grads(self) -> None:
        """Make the embeddings' output require grad, so that checkpointed layers give
        gradients to adapters when the embeddings themselves are frozen (PEFT does this)."""

        def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            output.requires_grad_(True)

        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(hook)

    def disable_input_require_grads(self) -> None:
        hook = getattr(self, "_require_grads_hook", None)
        if hook is not None:
            hook.remove()

    def init_weights(self) -> None:
        """Initialise every weight afresh (as post_init does)."""
        self.post_init()

    def can_generate(self) -> bool:
        return False  # an encoder: no text generation

    # ------------------------------------------------------------------ files
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *args: Any, **kwargs: Any):
        """Load a Hugging Face or bertlab model folder, a name in the local Hugging Face cache,
        or an original TensorFlow checkpoint (see ``io.checkpoint.load_pretrained``)."""
        from bertlab.io.checkpoint import load_pretrained

        return load_pretrained(cls, path, *args, **kwargs)

    def save_pretrained(self, directory: str | os.PathLike, **kwargs: Any) -> None:
        """Write ``config.json`` and ``model.safetensors`` (transformers loads them back); takes
        transformers' keywords (``state_dict``, ``safe_serialization``, ...)."""
        from bertlab.io.checkpoint import save_pretrained

        save_pretrained(self, directory, **kwargs)


# The tied MLM decoder weight is the word-embedding table itself: a state dict names it once,
# as saved folders do, so that tools writing a state dict with safetensors (which refuses two
# names for one tensor: transformers' Trainer.save_model and its checkpoints) can save the
# model. A state dict with or without the second name loads.
_DECODER = "cls.predictions.decoder.weight"
_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


def _tied(model: TransformersSurface) -> bool:
    decoder = model.get_output_embeddings()
    return decoder is not None and decoder.weight is model.get_input_embeddings().weight


def drop_tied_decoder(model: TransformersSurface, state: dict, prefix: str, meta: Any) -> None:
    """state_dict hook: leave out the tied decoder weight (the embeddings hold it)."""
    if _tied(model):
        state.pop(prefix + _DECODER, None)


def restore_tied_decoder(model: TransformersSurface, state: dict, prefix: str, *args: Any):
    """load_state_dict hook: a state dict without the tied decoder weight gives it the
    embeddings' table (the same tensor once loaded)."""
    if _tied(model) and prefix + _DECODER not in state and prefix + _EMBEDDINGS in state:
        state[prefix + _DECODER] = state[prefix + _EMBEDDINGS]

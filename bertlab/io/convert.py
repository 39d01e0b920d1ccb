"""``bertlab convert``: an original TensorFlow BERT checkpoint (read by tf_checkpoint.py,
without TensorFlow) written as a Hugging Face folder that bertlab and transformers load:
config.json, model.safetensors and the tokenizer files, atomically.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from bertlab.files import replace_folder
from bertlab.io.checkpoint import copy_weights, match_state_dict, read_state_dict, save_pretrained
from bertlab.io.tf_bundle import find_prefix
from bertlab.io.tf_checkpoint import VOCAB, read_tf_checkpoint
from bertlab.nn.config import BertConfig
from bertlab.nn.heads import BertForMaskedLM, BertForPreTraining
from bertlab.nn.model import BertModel
from bertlab.tokenizer import BertTokenizer


# ============================================================================ conversion
@dataclass
class ConversionReport:
    """What ``convert_tf_checkpoint`` wrote."""

    target: Path
    architecture: str
    parameters: int
    dtype: torch.dtype
    variables: int  # mapped and written
    skipped: list[str]  # optimiser state left out
    unmapped: list[str]  # left out with strict=False
    unused: list[str]  # mapped, but the model has no place for them (BertForMaskedLM's pooler)
    do_lower_case: bool | None  # None: no vocab.txt beside the checkpoint
    lower_case_guessed: bool

    def __str__(self) -> str:
        lines = [
            f"wrote {self.target}: {self.architecture}, {self.parameters:,} parameters "
            f"({str(self.dtype).removeprefix('torch.')}) from {self.variables} variables",
            f"skipped {len(self.skipped)} optimizer variables",
        ]
        if self.unmapped:
            lines.append(f"left out {len(self.unmapped)} unmapped: {', '.join(self.unmapped)}")
        if self.unused:
            lines.append(f"left out, {self.architecture} has no place for them: {self.unused}")
        if self.do_lower_case is None:
            lines.append(f"no {VOCAB} beside the checkpoint: no tokenizer files written")
        else:
            how = "guessed from the vocabulary" if self.lower_case_guessed else "as asked"
            case = "uncased (lower-cases its input)" if self.do_lower_case else "cased"
            lines.append(f"tokenizer: {case}, {how}")
        return "\n".join(lines)


def vocabulary_is_cased(vocab_file: str | os.PathLike) -> bool:
    """Whether a vocabulary keeps upper case: any token other than the bracketed specials
    (``[CLS]``, ``[unused0]`` ...) with an upper-case letter. The original releases do not record
    ``do_lower_case`` in the checkpoint; an uncased vocabulary has no upper-case tokens."""
    from bertlab.tokenizer import read_vocab

    tokens = read_vocab(vocab_file)
    return any(t != t.lower() for t in tokens if not (t.startswith("[") and t.endswith("]")))


def convert_tf_checkpoint(
    source: str | os.PathLike,
    target: str | os.PathLike,
    *,
    overwrite: bool = False,
    strict: bool = True,
    do_lower_case: bool | None = None,
) -> ConversionReport:
    """Write an original BERT checkpoint as a Hugging Face folder: ``config.json``,
    ``model.safetensors`` (BertForPreTraining when the checkpoint has the pre-training heads,
    BertForMaskedLM when it has the masked-LM head only, else BertModel; weights in the
    checkpoint's dtype), and, when ``vocab.txt`` is beside it,
    the tokenizer files (``do_lower_case`` None: guessed from the vocabulary).

    Atomic: everything is written into a temporary folder beside ``target`` and renamed at the
    end, so a failed conversion leaves nothing behind. ``target`` must not hold files unless
    ``overwrite``; the old folder goes only once the new one is whole."""
    prefix = find_prefix(source)
    dest = Path(target)
    home = prefix.parent.resolve()  # the checkpoint's folder
    if dest.resolve() == home or dest.resolve() in home.parents:
        raise ValueError(
            f"{dest} holds the checkpoint {prefix}: convert into another folder "
            "(--overwrite would delete the checkpoint)"
        )
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} is a file; expected a folder to write into")
    if dest.is_dir() and any(dest.iterdir()) and not overwrite:
        raise FileExistsError(f"{dest} already holds files; pass --overwrite to replace them")

    ckpt = read_tf_checkpoint(prefix, strict=strict)
    config = BertConfig.from_dict(ckpt.config)
    classes = (BertModel, BertForMaskedLM, BertForPreTraining)
    cls = {c.__name__: c for c in classes}[ckpt.config["architectures"][0]]
    model = cls(config)
    dtypes = {t.dtype for t in ckpt.state_dict.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    model.to(dtype)
    found, info = match_state_dict(model, ckpt.state_dict)
    # BertForMaskedLM has no pooler (as in transformers): its weights are left out, and said.
    unused = [k for k in info.unexpected_keys if not k.startswith("pooler.")]
    if info.missing_keys or unused:
        raise ValueError(
            f"{prefix}: the checkpoint does not fill {cls.__name__}: missing "
            f"{info.missing_keys}, not used {info.unexpected_keys}"
        )
    copy_weights(model, found)

    guessed = do_lower_case is None and ckpt.vocab_file is not None
    if guessed:
        do_lower_case = not vocabulary_is_cased(ckpt.vocab_file)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp's folder is private; the written one is an ordinary folder
        save_pretrained(model, tmp)
        written = read_state_dict(tmp)
        for key, tensor in found.items():  # the file holds exactly what was read
            if not torch.equal(written[key], tensor.to(dtype)):
                raise ValueError(f"{key} differs after writing {tmp}: disk full or damaged?")
        if ckpt.vocab_file is not None:
            tokenizer = BertTokenizer(
                ckpt.vocab_file,
                do_lower_case=bool(do_lower_case),
                model_max_length=config.max_position_embeddings,
            )
            tokenizer.save_pretrained(tmp)
        replace_folder(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ConversionReport(
        target=dest,
        architecture=cls.__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        dtype=dtype,
        variables=len(ckpt.state_dict),
        skipped=ckpt.skipped,
        unmapped=ckpt.unmapped,
        unused=info.unexpected_keys,
        do_lower_case=do_lower_case if ckpt.vocab_file is not None else None,
        lower_case_guessed=guessed,
    )

"""``bertlab convert SRC DEST``: an original TensorFlow BERT checkpoint -> a Hugging Face folder.

The work is ``bertlab.io.convert.convert_tf_checkpoint``; this file parses and prints.
Register it with ``add_parsers(subparsers)`` on the ``bertlab`` command's subparsers.
"""

from __future__ import annotations

import argparse


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``convert`` to the ``bertlab`` command."""
    convert = subparsers.add_parser(
        "convert",
        help="an original TensorFlow BERT checkpoint -> a Hugging Face model folder",
        description=(
            "Convert Google's original BERT release format (bert_model.ckpt.index + .data-* "
            "shards, bert_config.json, vocab.txt) to a folder that bertlab and transformers "
            "load: config.json, model.safetensors (BertForPreTraining when the checkpoint has "
            "the pre-training heads, BertForMaskedLM when it has the masked-LM head only, else "
            "BertModel) and the tokenizer files. TensorFlow is not "
            "needed. Every checksum is verified and every weight checked against "
            "bert_config.json before anything is written; optimizer state (adam_m, adam_v, "
            "global_step ...) is left out. A failed conversion leaves no folder behind."
        ),
    )
    convert.add_argument(
        "source",
        help="the checkpoint folder, or its prefix (.../bert_model.ckpt) if it holds several",
    )
    convert.add_argument("dest", help="the folder to write")
    convert.add_argument(
        "--overwrite", action="store_true", help="replace the files of an existing folder"
    )
    convert.add_argument(
        "--skip-unmapped",
        action="store_true",
        help="leave out (and list) variables bertlab does not map instead of refusing them",
    )
    case = convert.add_mutually_exclusive_group()
    case.add_argument(
        "--uncased",
        dest="do_lower_case",
        action="store_const",
        const=True,
        help="the tokenizer lower-cases its input (default: guessed from vocab.txt)",
    )
    case.add_argument(
        "--cased",
        dest="do_lower_case",
        action="store_const",
        const=False,
        help="the tokenizer keeps case (default: guessed from vocab.txt)",
    )
    convert.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from bertlab.io.convert import convert_tf_checkpoint

    report = convert_tf_checkpoint(
        args.source,
        args.dest,
        overwrite=args.overwrite,
        strict=not args.skip_unmapped,
        do_lower_case=args.do_lower_case,
    )
    print(report)
    return 0

"""``bertlab export onnx MODEL -o DIR``: a model folder -> model.onnx, checked in onnxruntime.

The work is ``bertlab.io.export.export_onnx``; this file parses and prints. Register it with
``add_parsers(subparsers)`` on the ``bertlab`` command's subparsers.
"""

from __future__ import annotations

import argparse
import sys

from bertlab.files import BUNDLED_NAMES
from bertlab.nn.heads import HEADS

EXPORT_HEADS = tuple(HEADS)  # the names of bertlab summary --head


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Add ``export`` (with its one format, ``onnx``) to the ``bertlab`` command."""
    export = subparsers.add_parser(
        "export",
        help="write a model in another format (ONNX), checked against bertlab",
        description="Write a model in another format, checked against bertlab before success.",
    )
    formats = export.add_subparsers(dest="format", required=True)
    onnx = formats.add_parser(
        "onnx",
        help="model.onnx + config.json + tokenizer files, checked in onnxruntime",
        description=(
            "Export MODEL to DIR/model.onnx (inputs input_ids, attention_mask, token_type_ids; "
            "batch and sequence axes dynamic) with config.json and the tokenizer files. The "
            "file is run in onnxruntime on a padded batch of another shape and compared with "
            "bertlab before success is reported; a failed export leaves no folder behind. "
            "Needs pip install 'bertlab[export]'. Int8 export is not offered: quantise the "
            "written file with onnxruntime.quantization if you need it."
        ),
    )
    onnx.add_argument(
        "model", help=f"a model folder, or {BUNDLED_NAMES[0]!r} for the bundled checkpoint"
    )
    onnx.add_argument("-o", "--output", required=True, help="the folder to write")
    onnx.add_argument(
        "--head",
        choices=EXPORT_HEADS,
        default=None,
        help="the model head to export (default: the one config.json names, else base)",
    )
    onnx.add_argument("--opset", type=int, default=18, help="ONNX opset version (default 18)")
    onnx.add_argument(
        "--overwrite", action="store_true", help="replace the files of an existing folder"
    )
    onnx.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from bertlab.io.export import export_onnx

    try:
        report = export_onnx(
            args.model, args.output, head=args.head, opset=args.opset, overwrite=args.overwrite
        )
    except ModuleNotFoundError as e:  # the optional ONNX packages: say what to install
        print(f"bertlab export: error: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0

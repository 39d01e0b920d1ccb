"""Compiled inference for short inputs: the whole forward pass as one program of C++ kernels, run
without Python between operations.

At one short sentence the eager model spends a large share of its time in Python (the module
calls, the tensor bookkeeping of each operation) rather than in its kernels: about a third on a
small model. ``Compiled(model)`` removes it. On its first call it exports
the model (``torch.export``, batch and sequence length dynamic) and compiles the exported graph
ahead of time into a shared library (AOTInductor), which it then calls directly:

* ``freezing``: the weights are constants of the program, packed once into the layout the
  matrix kernels read and folded where they can be;
* ``cpp.enable_concat_linear``: the query, key and value projections as one product;
* attention runs on keys padded to a multiple of 16 (the "aligned" kernel, attention.py), or
  on bertlab's AVX2 attention kernel where float32 runs on its AVX2 kernels (below);
* one program for every batch size and sequence length (one per set of inputs given: ids
  alone, ids and mask, ...).

    fast = Compiled(model)        # nothing is compiled yet
    out = fast(input_ids)         # the first call compiles (seconds); later ones reuse it

An earlier version ran the graph through ``torch.compile``. Its guards (hundreds of checks of the
model's modules and settings, made on every call) and its wrapper cost a fixed time per call, a
large part of a short sentence's time; the program called directly does not pay it (the
measurements are in docs/performance.md). What those guards watched, ``Compiled`` checks
itself, or refuses (below).

A compiled program computes the padded layout: it has no packed (unpadded) kernel, so it spends
work on padding that the model's packed forward skips. ``Compiled`` runs it where it is faster
all the same, and the model's own forward everywhere else:

    compiled program no gradient, eval mode, CPU inputs, only the inputs (input_ids,
                     attention_mask, token_type_ids, position_ids) given, at most
                     PADDING_LIMIT of the batch's positions padding (none for a single text),
                     and on CPU classes where it wins on short inputs only, at most the
                     class's positions (``.max_tokens``; cpu.COMPILED_TOKENS)
    the model        anything else: batches with more padding run packed, training, labels,
                     outputs of attention maps or hidden states, inputs on another device

PADDING_LIMIT depends on the precision of the products. In int8 the compiled graph fuses each
product's activation quantisation (six small passes over memory in eager mode) into the kernels
around it; in every precision it runs attention on keys padded to a multiple of 16 (the
"aligned" kernel, attention.py), which PyTorch's CPU kernel, working in blocks, runs faster
than a key length just short of a block. So the graph gains most over the packed model in int8
and least in float32, and its gain shrinks as the share of padding grows, until the packed
model, which skips the padding, is the faster. Each limit sits below the break-even share
measured for its precision on batches of ``bertlab bench runtimes``' news sentences
(docs/performance.md, "The choices in the code").

The program is the model as it was when it was built. The input checks (checks.py) run before
it too, so a bad token id gets the same error. If a weight changes afterwards (a cast, a move, an
in-place write such as load_state_dict or an optimizer step) or the model's config does (an
output option, the attention kernel), the next call is refused with an error saying to build a
new ``Compiled``, never answered from the old program. Hooks on the model's modules when it is
built are traced into the program; hooks added later are not seen: to watch a layer (dissect,
explore), call the model itself. Results equal the eager model's within the dtype's tolerance
(tests/test_compiled.py). The program's kernels are generated for the thread count set when it
compiles (``torch.set_num_threads`` before the first call).

Where the compiled program runs depends on the CPU (cpu.py's policy, ``cpu.current().compiled``):
it was measured faster than the model only on some classes of CPU and in some precisions (on
AVX2-only CPUs and AMD's Zen 4, in float32 and int8 on short batches only: ``.max_tokens``),
and cannot call
PyTorch's u8 int8 kernels (it would compute those products in float32) nor run bfloat16
natively on a CPU without bfloat16 instructions. In any other precision ``Compiled(model)``
calls the model itself for every input, says why once (a warning, and ``.why_eager``), and
needs no compiler.

Where the model's products run on bertlab's own kernels (float32 on sgemm-avx2, int8 on
u8-avx2 or u8-vnni: avx2.py), the program calls those same kernels: the graph is traced inside
``aligned_export``, where products.py and precision.py write each product as the operator
``torch.ops.bertlab.sgemm`` or ``torch.ops.bertlab.qgemm`` (avx2.ops: the C functions behind a
small C++ library built once with the same compiler), on panels packed in the graph, which
freezing turns into constants, and where float32 runs on sgemm-avx2, attention.py writes the
attention as ``torch.ops.bertlab.attention`` (each row's real tokens through the AVX2 attention
kernel). A short sentence then runs the model's kernels with no Python between them. Where
that library cannot be built, ``Compiled`` runs the model itself, saying why. Exports for other
runtimes (ONNX, ``torch.export`` outside bertlab) never contain them.

Compiling needs a C++ compiler (inductor's CPU backend) and Python's C headers;
``Compiled.available()`` says which is missing where one is, and ``Compiled(model)`` refuses
with that reason before any work. The pipelines take ``compile=True`` (pipelines/base.py).
"""

from __future__ import annotations

import inspect
import shutil
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from bertlab.nn import avx2, cpu
from bertlab.nn.checks import check_inputs
from bertlab.nn.packing import aligned_export
from bertlab.nn.precision import Int8Linear

# inductor's settings for the ahead-of-time compile (given to it, nothing global is changed).
OPTIONS = {"freezing": True, "cpp.enable_concat_linear": True}
# bfloat16 products also try inductor's own C++ matrix kernels (AMX tiles where the CPU has them,
# AVX512-BF16 where not) beside oneDNN's, timed on the spot as each program compiles, each product
# taking the faster: faster programs for short inputs, for two to three times the compile time
# (the choices are timed, so they vary from one compile to the next). In float32 the same tuning
# gained little for twice the compile time, so float32 keeps oneDNN's.
TUNED = {
    "max_autotune": True,
    "max_autotune_gemm_backends": "CPP,ATEN",
    "autotune_num_choices_displayed": 0,  # (inductor prints its timings otherwise)
    "max_autotune_report_choices_stats": False,
}
PRECISION_OPTIONS = {"bfloat16": TUNED}  # added to OPTIONS
# The batch the model is exported on (rows, length): its sizes are the hints by which inductor
# picks and tunes kernels for the dynamic batch and length (a size of 1 would be fixed). bfloat16
# products tuned at 8 x 32 run batches faster than those tuned at 2 x 8 (which picks kernels for
# 16 rows) and single sentences about as fast; in float32 the larger hint was slower at both
# sizes, so float32 keeps the small one (figures: docs/performance.md).
EXAMPLE = {"bfloat16": (8, 32)}
SMALL_EXAMPLE = (2, 8)
INPUTS = frozenset(("input_ids", "attention_mask", "token_type_ids", "position_ids"))
# the largest share of padded positions at which a batch runs compiled, by the products' precision
PADDING_LIMIT = {"int8": 0.4, "bfloat16": 0.3, "float32": 0.15}


def _precision(model: nn.Module) -> str:
    """The precision of the model's products: "int8" (quantize_int8's layers, also in a part of
    a quantized model such as its encoder), else its weights' dtype."""
    if hasattr(model, "int8_report") or any(isinstance(m, Int8Linear) for m in model.modules()):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def length_groups(lengths: list[int], limit: float, max_rows: int | None = None) -> list[list[int]]:
    """The indices of ``lengths`` sorted by length and cut into groups, each padded to its
    longest with at most ``limit`` of its positions padding and at most ``max_rows`` rows: the
    batches a compiled program takes from a mix of lengths. Greedy, shortest first."""
    if not 0 <= limit < 1:
        raise ValueError(f"limit must be a share of positions in [0, 1), got {limit}")
    groups: list[list[int]] = []
    group: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]
        if n < 1:
            raise ValueError(f"lengths[{i}] is {n}; a sequence has at least one token")
        full = max_rows is not None and len(group) >= max_rows
        if group and (full or 1 - (real + n) / (n * (len(group) + 1)) > limit):
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real += n
    if group:
        groups.append(group)
    return groups


class Compiled:
    """``model``'s forward compiled for inference on inputs with little padding; the model itself
    for the rest. Call it as the model is called; ``.model`` is the model, ``.calls`` counts the
    calls each path answered."""

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TypeError(f"Compiled takes a bertlab model, got {type(model).__name__}")
        self.model = model
        self.precision = _precision(model)
        policy = cpu.current()
        # why this CPU runs the model itself in this precision (None: the compiled program)
        self.why_eager = None
        if self.precision not in policy.compiled:
            self.why_eager = policy.not_compiled.get(
                self.precision, f"no compiled program for {self.precision} products"
            )
            warnings.warn(
                f"Compiled runs the {self.precision} model itself on this CPU (class "
                f"{policy.cpu_class}): {self.why_eager}",
                stacklevel=2,
            )
        elif (why := self.available()) is not None:
            raise RuntimeError(why)
        elif policy.on_avx2_kernels(self.precision) and (why := avx2.ops()) is not None:
            self.why_eager = (
                f"the {self.precision} products run on bertlab's AVX2 kernels, which the program "
                f"calls as operators, and those cannot be built here: {why}"
            )
            warnings.warn(f"Compiled runs the {self.precision} model itself: {self.why_eager}",
                          stacklevel=2)  # fmt: skip
        self._limit = PADDING_LIMIT.get(self.precision, 0.0)
        # the most positions of a batch the program runs on this CPU (None: any)
        self.max_tokens = policy.compiled_tokens.get(self.precision)
        self._options = {
            **OPTIONS,
            **PRECISION_OPTIONS.get(self.precision, {}),
            **cpu.inductor_options(),
        }
        self._signature = inspect.signature(model.forward)
        self._programs: dict[tuple, Any] = {}  # by the inputs given and their dtypes
        self._tensors: list[torch.Tensor] | None = None  # the weights the program was built on
        self._stamp: list | None = None
        self._config: dict[str, Any] | None = None  # the config the program was built with
        self.calls = {"compiled": 0, "eager": 0}  # how many calls each path answered

    def groups(self, lengths: list[int], max_rows: int | None = None) -> list[list[int]]:
        """``length_groups`` at this model's padding limit: sequences of these lengths cut into
        batches the compiled program takes."""
        return length_groups(lengths, self._limit, max_rows)

    @staticmethod
    def available() -> str | None:
        """None where inductor can build CPU kernels here, else why it cannot."""
        from torch._inductor import cpp_builder

        try:
            compiler = cpp_builder.get_cpp_compiler()
        except Exception as e:  # noqa: BLE001 - inductor says why in its own words
            return f"torch.compile finds no C++ compiler here ({e})"
        if shutil.which(compiler) is None:
            return f"torch.compile's C++ compiler {compiler!r} is not installed"
        headers = Path(sysconfig.get_paths()["include"])
        if not (headers / "Python.h").is_file():  # the C++ wrapper is a Python extension
            return (
                f"torch.compile needs Python's C headers, and {headers / 'Python.h'} is missing "
                "(on Debian: apt-get install python3-dev)"
            )
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args or not INPUTS.issuperset(kwargs):
            arguments = self._signature.bind(*args, **kwargs).arguments
        else:  # the common call, inputs by name: no need to bind them to the signature
            arguments = kwargs
        if not self._compilable(arguments):
            self.calls["eager"] += 1
            return self.model(*args, **kwargs)
        inputs = {k: v for k in INPUTS if (v := arguments.get(k)) is not None}
        check_inputs(self.model.config, inputs["input_ids"], inputs.get("attention_mask"),
                     inputs.get("token_type_ids"), inputs.get("position_ids"), None)  # fmt: skip
        self._check_unchanged()
        key = tuple((k, inputs[k].dtype) for k in sorted(inputs))  # one program per kind of call
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._build(inputs)
        self.calls["compiled"] += 1
        return program(**inputs)

    def _build(self, inputs: dict[str, torch.Tensor]) -> Any:
        """Export the model for the inputs given (batch and length dynamic; traced on an
        EXAMPLE batch) and compile it ahead of time. The attention is the "aligned" kernel
        (packing.aligned_export)."""
        from torch._inductor import aoti_compile_and_package, aoti_load_package

        rows, length = EXAMPLE.get(self.precision, SMALL_EXAMPLE)
        length = min(length, int(self.model.config.max_position_embeddings))
        example = {}
        for name, given in inputs.items():
            if name == "position_ids":
                example[name] = torch.arange(length, dtype=given.dtype).expand(rows, length)
            else:  # ids, mask (all real tokens), token types: 1, 1, 0
                value = int(name != "token_type_ids")
                example[name] = torch.full((rows, length), value, dtype=given.dtype)
        dims = {name: {0: Dim.DYNAMIC, 1: Dim.DYNAMIC} for name in inputs}
        with (
            aligned_export(),
            warnings.catch_warnings(),
            tempfile.TemporaryDirectory(prefix="bertlab-compiled-") as folder,
        ):
            warnings.simplefilter("ignore", FutureWarning)  # (export's notes on its own API)
            # inductor's timing of its choices reads a deprecated storage API (its own code)
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            cpu.current()  # (read before the trace: features read inside it lack oneDNN)
            program = torch.export.export(self.model, (), example, dynamic_shapes=dims)
            package = str(Path(folder) / "program.pt2")
            aoti_compile_and_package(program, package_path=package, inductor_configs=self._options)
            return aoti_load_package(package)  # (loaded: the package file is not read again)

    def close(self) -> None:
        """Free the compiled programs, and the libraries AOTInductor unpacked for them into the
        temporary folder (which it deletes when a program is freed; a process ended by a signal
        never frees it: ``bertlab serve`` calls this as it shuts down). A later call compiles
        again, on the model's weights and config as they are then."""
        self._programs.clear()
        self._tensors = self._stamp = self._config = None

    def _compilable(self, arguments: dict[str, Any]) -> bool:
        """True when the compiled program gives the model's results (within the dtype's
        tolerance) faster than the model (the rule in the module's text). A model moved off the
        CPU after the program was built is caught by _check_unchanged."""
        if self.why_eager is not None or torch.is_grad_enabled() or self.model.training:
            return False
        ids, mask = arguments.get("input_ids"), arguments.get("attention_mask")
        if not isinstance(ids, torch.Tensor) or ids.device.type != "cpu":
            return False
        if self.max_tokens is not None and ids.numel() > self.max_tokens:
            return False  # a class where the program wins on short inputs only
        for k, v in arguments.items():
            if k not in INPUTS and v is not None and not (isinstance(v, dict) and not v):
                return False  # labels, output options, other keywords: the model's own forward
        if mask is None:
            return True
        if not isinstance(mask, torch.Tensor):
            return False
        return 1 - int(mask.count_nonzero()) / mask.numel() <= self._limit

    def _check_unchanged(self) -> None:
        """The program holds the weights and config it was built on: refuse to answer from
        stale ones. The tensors are listed once (walking the modules costs more than the check):
        a cast, a move or an in-place write (load_state_dict, an optimizer step) changes their
        pointer or version counter."""
        if self._tensors is None:
            self._tensors = [*self.model.parameters(), *self.model.buffers()]
        try:
            stamp = [(t.data_ptr(), t._version) for t in self._tensors]
        except RuntimeError:  # inference tensors keep no version counter: their pointers
            stamp = [(t.data_ptr(), 0) for t in self._tensors]
        config = {k: v for k, v in vars(self.model.config).items() if not k.startswith("_")}
        if self._stamp is None:
            self._stamp, self._config = stamp, config
        elif stamp != self._stamp:
            raise RuntimeError(
                "the model's weights changed after it was compiled; the compiled program holds "
                "the old ones: build a new Compiled(model), or close() this one"
            )
        elif config != self._config:
            keys = {*config, *self._config}
            changed = sorted(k for k in keys if config.get(k, self) != self._config.get(k, self))
            raise RuntimeError(
                f"the model's config changed after it was compiled ({', '.join(changed)}); the "
                "compiled program was built for the old one: build a new Compiled(model), or "
                "close() this one"
            )

"""What every target exporter provides, and what it hands back."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch.export import ExportedProgram

from ..errors import InputError
from .delegation import DelegationReport

__all__ = ["Exporter", "LoweredTarget", "ExportOptions", "unsupported_dtype_node"]


#: Options that change how the files are made, never their bytes (pruned passes are proven
#: byte-identical; a forked lowering lowers the same program).
FILE_NEUTRAL = frozenset({"prune_backend_passes", "parallel"})
#: the ``MatMulNBits`` accuracy levels an int4 .onnx can record (ExportOptions.onnx_int4_accuracy_level)
INT4_ACCURACY_LEVELS = (0, 4)


@dataclass(frozen=True)
class ExportOptions:
    """Options a target may read; defaults are what a careful user would pick."""

    external_data_threshold: int = 1024  # bytes: larger ONNX initializers go to <name>.onnx.data
    #: ONNX weights in <name>.onnx.data: None (default) by ``external_data_threshold`` per
    #: initializer; False keeps them inline (up to the 2 GB protobuf limit: past it they go
    #: external whatever this says); True as None
    onnx_external_data: bool | None = None
    #: XNNPACK weights in <name>.ptd beside the .pte (ExecuTorch's program-data separation):
    #: None (default) when the weights reach ``external_weights_above`` bytes, or True / False
    xnnpack_external_data: bool | None = None
    external_weights_above: int = 256 << 20
    onnx_opset: int | None = None
    #: skip XNNPACK backend passes that cannot act on a subgraph (byte-identical .pte, faster)
    prune_backend_passes: bool = True
    #: lower XNNPACK in a forked worker while ONNX exports; None: when a core is free and the
    #: weights are under 64 MB (see exporters/forked.py)
    parallel: bool | None = None
    #: shared program: canonicalizations that keep a library from failing on ordinary models
    #: (shared_state/passes/canonical.py); semantics-preserving, both targets get them
    canonicalize: bool = True
    #: shared program: fold input-independent subgraphs (mask/position prologues) into constants
    fold_constants: bool = True
    #: XNNPACK's own pipeline on decomposed["xnnpack"] (exporters/xnnpack_rewrites.py): the ops
    #: XNNPACK refuses rewritten into ones it takes, so fewer, larger delegated subgraphs
    xnnpack_passes: bool = True
    #: ONNX's own pipeline on the ONNX model (exporters/onnx_passes.py): constant folding and
    #: the graph clean-up of torch.onnx's optimizer, minus the BatchNorm fusion that would store
    #: other bytes under a weight's name (ONNX Runtime fuses BatchNorm at load instead)
    onnx_passes: bool = True
    #: extra ``(key, text)`` pairs each file records: ONNX ``metadata_props[key]``, and a .pte
    #: constant method ``key`` returning the text's UTF-8 bytes as ints (keys are identifiers);
    #: e.g. the cache layout of ``dx.export_llm``, read back by ``dx.generate``
    file_metadata: tuple[tuple[str, str], ...] = ()
    #: ONNX Runtime's ``MatMulNBits`` accuracy level for quantized weights (int4, and the 8-bit
    #: head of ``export_llm(quantize="int4")``): 0 computes what the program computes (its 8-bit
    #: per-token activations in the graph, float arithmetic in the kernel); 4 lets the kernel
    #: quantize the float activations itself, per block, with int8 arithmetic: ONNX Runtime's
    #: fast path (2.7x per linear), proven against the program with the kernel's own activation
    #: quantization (exporters/onnx_quant.py ``kernel_activations``). None: the entry point's
    #: default, 4 for ``export_llm``'s quantized decoders, 0 for ``dx.export`` (:attr:`int4_level`)
    onnx_int4_accuracy_level: int | None = None

    @property
    def int4_level(self) -> int:
        """The accuracy level the .onnx records: the option, 0 when it was left to the default."""
        return 0 if self.onnx_int4_accuracy_level is None else self.onnx_int4_accuracy_level

    def __post_init__(self) -> None:
        if (
            self.onnx_int4_accuracy_level is not None
            and self.onnx_int4_accuracy_level not in INT4_ACCURACY_LEVELS
        ):
            raise InputError(
                f"onnx_int4_accuracy_level={self.onnx_int4_accuracy_level!r} is not one dualexport writes",
                hint="0 (the program's numerics) or 4 (ONNX Runtime's int8 kernel, faster; export_llm's "
                "default), or None for the default",
            )

    def to_dict(self) -> dict[str, Any]:
        """The options that make the files (how they are made, never their bytes, left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in FILE_NEUTRAL}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ExportOptions:
        """Options recorded in a manifest (unknown keys, from another version, are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    def plain(self) -> ExportOptions:
        """These options with every dualexport pass off: the programs the plain libraries would
        lower (``dx.export(optimize=False)``)."""
        return dataclasses.replace(
            self, canonicalize=False, fold_constants=False, xnnpack_passes=False, onnx_passes=False
        )


@dataclass(frozen=True)
class LoweredTarget:
    """Files a target wrote into the staging folder (main file first) and what it learned.

    ``weight_notes`` maps a state_dict name to why the target does not store it as-is (fused,
    folded, unused, quantized), derived from the decomposed graph; the manifest uses it when the
    bytes are not found in the artifact.
    """

    target: str
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...] = ()
    delegation: DelegationReport | None = None
    weight_notes: dict[str, str] = field(default_factory=dict)
    #: stored tensors the target computed from weights (an ONNX initializer constant-folded from
    #: them): stored name -> the weights it came from (the manifest records them as ``derived``)
    derived_copies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: every tensor the lowered program still holds, by name (invariant 2: each must be the
    #: holder's own object); the job checks and drops them before the result crosses a process
    kept_tensors: Mapping[str, Any] = field(default_factory=dict)
    #: how many XNNPACK backend passes were skipped (``exporters.backend_passes.PassPruning``)
    backend_passes: Any = None
    #: the ONNX file's default-domain opset (None for other targets)
    opset: int | None = None


class Exporter(Protocol):
    """A target: decompose the shared program for it, then lower the decomposed program to files."""

    target: ClassVar[str]
    suffix: ClassVar[str]
    #: dtypes the target's runtime has no kernels for, each with the reason and what to try: the
    #: job refuses a program that computes in one before lowering (``unsupported_dtype_node``)
    refused_dtypes: ClassVar[Mapping[torch.dtype, tuple[str, str]]]

    def passes(self, options: ExportOptions) -> tuple[str, ...]:
        """The names of the target's own passes ``options`` turns on, in order (for the cache
        key, the manifest and ``-v``)."""
        ...

    def decompose(self, program: ExportedProgram, options: ExportOptions | None = None) -> ExportedProgram:
        """Return the target's decomposed program (a new program; the shared one is untouched)."""
        ...

    def lower(
        self, decomposed: ExportedProgram, staging: pathlib.Path, name: str, options: ExportOptions
    ) -> LoweredTarget:
        """Write ``<name><suffix>`` (and side files) into ``staging``."""
        ...

    def weight_notes(self, decomposed: ExportedProgram) -> dict[str, str]:
        """Why the target may not store a weight as-is (see ``LoweredTarget.weight_notes``)."""
        ...

    def proof_program(
        self, program: ExportedProgram, options: ExportOptions
    ) -> tuple[ExportedProgram, str] | None:
        """The program the file computes when ``options`` ask for other numerics than the shared
        program's (ONNX Runtime's int4 kernel quantizing float activations itself), with a label
        for messages; None when the file computes the shared program."""
        ...


def unsupported_dtype_node(
    program: ExportedProgram, refused: Mapping[torch.dtype, tuple[str, str]]
) -> tuple[torch.fx.Node, torch.dtype] | None:
    """The first op of ``program`` that reads or computes a tensor of a refused dtype (a
    placeholder alone does not count: an unused input is harmless), and that dtype."""
    if not refused:
        return None
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        for val in vals:
            for v in val if isinstance(val, (tuple, list)) else (val,):
                if isinstance(v, torch.Tensor) and v.dtype in refused:
                    return node, v.dtype
    return None

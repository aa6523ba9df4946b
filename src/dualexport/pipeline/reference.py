"""What every file of an export must compute: the shared program's outputs on the example and at
the edges of every declared range, computed once per export and shared by all targets' proofs.

Why once, and from the shared program: the proof of a file is a comparison with the program the
file claims to be (whatever made it: a lowering, a reused file, a patched copy), so the
reference must not come from a target's own decomposition, and computing it once keeps the
proof's cost to the runs of the files themselves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..errors import DualExportError, InputError
from ..parity.inputs import inputs_with_shapes
from ..parity.judge import quantization_noise
from ..runtimes.eager import EagerRunner
from ..shared_state import SharedProgram
from ..shared_state.contract import EdgeSizes, is_stateful
from .outcome import SHARED_PROGRAM

__all__ = ["ProofSet", "Reference", "reference_sets", "approximated"]


@dataclass(frozen=True)
class ProofSet:
    """One input set of the proof: its label (``example``, ``min``, ``max-1``, ``max``), a
    sentence for messages, the flat inputs, and the shared program's flat outputs on them."""

    label: str
    where: str
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    #: per output, the output shape the input contract gives (None: not a tensor or unknown)
    shapes: tuple[tuple[int, ...] | None, ...] = ()
    #: int8 programs: per output, the SNR of the quantized reference against the float model
    noise: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reference:
    """The proof's input sets, and what judging them needs from the program."""

    sets: tuple[ProofSet, ...]
    stateful: bool
    #: int8 programs: per output computed from quantized values, its quantization step (None:
    #: float after the last dequantize)
    quant_steps: Mapping[int, float | None] = field(default_factory=dict)
    seconds: float = 0.0
    #: what the outputs are of, for messages
    label: str = SHARED_PROGRAM


def reference_sets(
    shared: SharedProgram, example: Sequence[torch.Tensor], edges: Sequence[EdgeSizes]
) -> Reference:
    """Run the shared program eagerly on the example and on inputs at each edge (each from a
    fresh state when the program is stateful)."""
    from ..shared_state.quantize import quantized_outputs

    t0 = time.perf_counter()
    program = shared.exported_program
    stateful = is_stateful(program)
    quant_steps = quantized_outputs(program)
    eager = EagerRunner(program, shared.example_args, shared.example_kwargs)
    floats = (
        EagerRunner(shared.float_program, shared.example_args, shared.example_kwargs)
        if shared.float_program is not None and quant_steps
        else None
    )
    plan: list[tuple[str, str, list[torch.Tensor], tuple[tuple[int, ...] | None, ...]]] = [
        ("example", "on the example inputs", list(example), ())
    ]
    for i, edge in enumerate(edges):
        where = "at the {} of its declared ranges ({})".format(
            edge.label, ", ".join(f"{k}={v}" for k, v in edge.symbols.items())
        )
        plan.append((edge.label, where, inputs_with_shapes(example, edge.inputs, i), edge.outputs))
    sets = []
    for index, (label, where, flat, shapes) in enumerate(plan):
        if index and stateful:
            eager.reset()
            if floats is not None:
                floats.reset()
        outs = _run_program(eager, flat, where)
        noise = quantization_noise(outs, floats.run(flat)) if floats is not None else {}
        sets.append(ProofSet(label, where, tuple(flat), tuple(outs), tuple(shapes), noise))
    return Reference(tuple(sets), stateful, quant_steps, time.perf_counter() - t0)


def approximated(reference: Reference, shared: SharedProgram, program: Any, label: str) -> Reference:
    """The proof's sets against ``program``, a target's deliberate approximation of the shared
    program (an int4 linear reading float activations, which ONNX Runtime's ``MatMulNBits`` at
    accuracy level 4 quantizes per block itself), each output's noise the shared program's own SNR
    against it.

    Why: such a file computes the approximation plus its kernel's rounding, not the shared program;
    judged against the shared program with a fixed SNR bound it fails on depth alone (30 layers of
    SmolLM2-135M's shape: 29.8 dB). Against the approximation, with the yardstick of what the
    program's own activation quantization loses (``quantized_tolerance``), it is judged by what
    its kernel adds, and a wrong code or scale still drops it far below."""
    t0 = time.perf_counter()
    eager = EagerRunner(program, shared.example_args, shared.example_kwargs)
    sets = []
    for index, case in enumerate(reference.sets):
        if index and reference.stateful:
            eager.reset()
        outs = _run_program(eager, list(case.inputs), case.where)
        sets.append(replace(case, outputs=tuple(outs), noise=quantization_noise(list(case.outputs), outs)))
    return replace(
        reference, sets=tuple(sets), label=label, seconds=reference.seconds + time.perf_counter() - t0
    )


def _run_program(eager: EagerRunner, flat: list[torch.Tensor], where: str) -> list[torch.Tensor]:
    """The shared program's outputs ``where``; a program that PyTorch itself cannot run there is
    the input's problem. Why it can happen: ``torch.export`` traces with fake tensors whose
    kernels do not check everything (an int64 tensor into a float ``Linear`` on 3-D input traced,
    then failed in eager with "mat1 and mat2 must have the same dtype")."""
    try:
        return eager.run(flat)
    except DualExportError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(
            f"the exported program does not run {where} in eager PyTorch: {type(exc).__name__}: {first}",
            hint="the model fails on these inputs before any target is involved: check the example's "
            "dtypes and sizes (and the declared ranges) against what the model computes with",
        ) from exc

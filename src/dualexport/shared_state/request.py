"""Input checks before any work: refuse bad requests with a message that says what to try.

Why before tracing: a bad request found after a minute of lowering wastes the minute, and some
bad requests do not fail at all downstream: a channels_last example input gives an XNNPACK
program that expects another memory order and returns wrong numbers, and NaN weights make every
parity check pass vacuously or fail for a reason far from its cause.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..compat.torch import dim_like_types
from ..errors import InputError

__all__ = ["validate_export_request", "check_dynamic_shapes", "check_containers", "weight_bytes"]

logger = logging.getLogger(__name__)

_SHOW = 3  # names quoted in a message before "(+N more)"


def _some(names: Sequence[str]) -> str:
    more = f" (+{len(names) - _SHOW} more)" if len(names) > _SHOW else ""
    return ", ".join(names[:_SHOW]) + more


def _leaves(obj: Any, path: str) -> Iterable[tuple[str, Any]]:
    """(path, leaf) over nested tuples, lists and dicts, with a readable path like args[0]['x']."""
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    else:
        yield path, obj


def _check_model(model: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module, a torch.export.ExportedProgram or a .pt2 path, "
            f"got {type(model).__name__}",
            hint="pass the module instance, e.g. dx.export(MyNet(), (x,)), or a program from "
            "torch.export.export",
        )
    _check_weights((("parameter", model.named_parameters()), ("buffer", model.named_buffers())))


def _check_weights(groups: Iterable[tuple[str, Iterable[tuple[str, Any]]]]) -> None:
    """Weights on the CPU and meaningful: no NaN anywhere, no infinity in a parameter (what an
    optimizer that blew up leaves). A buffer or constant may hold ``-inf``/``inf``: a causal
    mask registered as ``-inf`` above the diagonal (OpenAI's Whisper, many hand-written
    transformers) is meaning, not corruption."""
    off_cpu, bad = [], []
    for kind, items in groups:
        for name, t in items:
            if not isinstance(t, torch.Tensor):
                continue
            if t.device.type != "cpu":
                off_cpu.append(f"{kind} {name} ({t.device})")
            elif t.is_floating_point() and t.numel():
                broken = torch.isnan(t).any() if kind in ("buffer", "constant") else ~torch.isfinite(t).all()
                if bool(broken):
                    bad.append(f"{kind} {name}")
    if off_cpu:
        raise InputError(
            f"the model's weights must be on the CPU; found {_some(off_cpu)}",
            hint="call model.cpu() (for a model built on the meta device, load real "
            "weights first, e.g. load_state_dict(..., assign=True))",
        )
    if bad:
        raise InputError(
            f"the model's weights hold NaN or Inf: {_some(bad)} (a buffer may hold -inf, as a "
            "causal mask does; NaN is refused anywhere, Inf in a parameter)",
            hint="fix or reload the checkpoint; artifacts with non-finite weights "
            "cannot be checked for parity",
        )


def check_containers(args: Any, kwargs: Any) -> None:
    """``args`` a tuple, ``kwargs`` None or a mapping."""
    if not isinstance(args, tuple):
        raise InputError(
            f"args must be a tuple of example inputs, got {type(args).__name__}",
            hint="wrap a single tensor as (x,)",
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InputError(
            f"kwargs must be a dict, got {type(kwargs).__name__}",
            hint="pass keyword inputs as kwargs={'name': tensor}",
        )


def _check_inputs(args: Any, kwargs: Any) -> None:
    check_containers(args, kwargs)
    leaves = list(_leaves(args, "args")) + list(_leaves(dict(kwargs or {}), "kwargs"))
    for path, x in leaves:
        if isinstance(x, torch.Tensor):
            _check_tensor(path, x)
        elif type(x).__module__ == "numpy":
            raise InputError(
                f"{path} is a numpy {type(x).__name__}; example inputs must be torch tensors",
                hint=f"pass torch.from_numpy({path.split('[')[0]}...) instead",
            )


def _check_tensor(path: str, x: torch.Tensor) -> None:
    if x.device.type != "cpu":
        raise InputError(
            f"{path} is on device {x.device}; dualexport traces and checks on the CPU",
            hint=f"pass {path}.cpu() (and keep the model on the CPU)",
        )
    if x.layout != torch.strided:
        raise InputError(
            f"{path} has layout {x.layout}; only dense tensors can be exported",
            hint=f"pass {path}.to_dense()",
        )
    if not x.is_contiguous():
        what = (
            "channels_last"
            if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            else "non-contiguous"
        )
        raise InputError(
            f"{path} is {what} (strides {tuple(x.stride())}); the artifacts take contiguous inputs, "
            "and a channels_last example makes the ExecuTorch program expect another memory order",
            hint=f"pass {path}.contiguous()",
        )
    if x.numel() == 0:
        dims = [d for d, n in enumerate(x.shape) if n == 0]
        raise InputError(
            f"{path} is empty (shape {tuple(x.shape)}: size 0 in dim {dims[0]}); torch.export "
            "specializes a size-0 dimension, so the files would accept only empty inputs and no "
            "value could be checked",
            hint="pass an example with real sizes (2 or more in each dim you mean to vary) and "
            "declare the range with dynamic_shapes (torch.export.Dim)",
        )
    if (x.is_floating_point() or x.is_complex()) and x.numel() and not bool(torch.isfinite(x).all()):
        n = int((~torch.isfinite(x)).sum())
        raise InputError(
            f"{path} holds {n} NaN/Inf value(s)",
            hint="use finite example inputs: parity metrics are meaningless on NaN/Inf",
        )


def _check_quantize(quantize: Any, calibration: Any) -> None:
    if quantize not in (None, "int8", "int8-dynamic"):
        raise InputError(
            f"quantize={quantize!r} is not supported",
            hint="use quantize=None, 'int8' (static, calibrated) or 'int8-dynamic' (no calibration)",
        )
    if quantize is None or (quantize == "int8-dynamic" and calibration is None):
        return
    if calibration is None:
        raise InputError(
            "quantize='int8' needs calibration data",
            hint="pass calibration=[(x1,), (x2,), ...] with representative inputs, or use "
            "quantize='int8-dynamic' (activations quantized at run time, no calibration)",
        )
    if isinstance(calibration, (torch.Tensor, str, bytes)) or not isinstance(calibration, Iterable):
        raise InputError(
            f"calibration must be an iterable of argument tuples, got {type(calibration).__name__}",
            hint="pass calibration=[(x1,), (x2,)]",
        )
    if isinstance(calibration, Sequence):
        if not calibration:
            raise InputError(
                "calibration is empty: int8 quantization needs at least one batch",
                hint="pass calibration=[(x1,), (x2,), ...] with representative inputs",
            )
        for i, item in enumerate(calibration):
            if not isinstance(item, tuple):
                raise InputError(
                    f"calibration[{i}] is a {type(item).__name__}, not an args tuple",
                    hint="wrap each batch as (x,)",
                )


# ------------------------------------------------------------------------------ dynamic shapes
def _is_dim_like(v: Any) -> bool:
    return v is None or isinstance(v, (int, *dim_like_types()))


def _check_tensor_spec(path: str, x: torch.Tensor, spec: Any) -> None:
    from torch.export.dynamic_shapes import Dim

    if isinstance(spec, Mapping):
        items = list(spec.items())
        for k, _ in items:
            if not isinstance(k, int) or not -x.dim() <= k < x.dim():
                raise InputError(
                    f"dynamic_shapes for {path} names dim {k!r}, but {path} has {x.dim()} dims "
                    f"(shape {tuple(x.shape)})",
                    hint=f"use dim indices 0..{x.dim() - 1}, e.g. {{0: Dim('batch')}}",
                )
        items = [(k % x.dim(), v) for k, v in items]
    elif isinstance(spec, (tuple, list)):
        if len(spec) != x.dim():
            raise InputError(
                f"dynamic_shapes for {path} has {len(spec)} entries, but {path} has {x.dim()} dims "
                f"(shape {tuple(x.shape)})",
                hint="give one entry per dim (None for static), or a dict {dim_index: Dim}",
            )
        items = list(enumerate(spec))
    else:
        raise InputError(
            f"dynamic_shapes for tensor {path} is a {type(spec).__name__}",
            hint="use None, a dict {dim_index: Dim(...)} or a tuple with one entry per dim",
        )
    for d, v in items:
        if not _is_dim_like(v):
            raise InputError(
                f"dynamic_shapes for {path} dim {d} is {v!r}, not a Dim, int or None",
                hint="use torch.export.Dim('name', min=..., max=...) or Dim.AUTO",
            )
        size = int(x.shape[d])
        if isinstance(v, int) and not isinstance(v, bool) and v != size:
            raise InputError(
                f"dynamic_shapes for {path} fixes dim {d} to {v}, but the example has {size}",
                hint="make the example match, or mark the dim dynamic",
            )
        lo, hi = getattr(v, "min", None), getattr(v, "max", None)
        if isinstance(lo, int) and size < lo or isinstance(hi, int) and size > hi:
            raise InputError(
                f"dynamic_shapes for {path} dim {d}: the example size {size} is outside "
                f"{getattr(v, '__name__', 'Dim')}'s range [{lo}, {hi}]",
                hint="use an example inside the range, or widen the Dim's min/max",
            )
        if isinstance(v, Dim) and size in (0, 1):
            raise InputError(
                f"dynamic_shapes for {path} dim {d} is a named Dim, but the example size is {size}; "
                "torch.export specializes sizes 0 and 1, so the dim cannot stay dynamic",
                hint="use an example size of at least 2 for dynamic dims",
            )


def _check_spec_tree(path: str, value: Any, spec: Any) -> None:
    if spec is None:
        return
    if isinstance(value, torch.Tensor):
        _check_tensor_spec(path, value, spec)
    elif isinstance(value, (tuple, list)):
        if not isinstance(spec, (tuple, list)) or len(spec) != len(value):
            raise InputError(
                f"dynamic_shapes for {path} must be a sequence of {len(value)} specs "
                f"like the input, got {spec!r}",
                hint="mirror the input's structure",
            )
        for i, (v, s) in enumerate(zip(value, spec, strict=True)):
            _check_spec_tree(f"{path}[{i}]", v, s)
    elif isinstance(value, Mapping):
        if not isinstance(spec, Mapping) or set(spec) - set(value):
            raise InputError(
                f"dynamic_shapes for {path} must be a dict with keys among {sorted(value)}",
                hint="mirror the input's structure",
            )
        for k, s in spec.items():
            _check_spec_tree(f"{path}[{k!r}]", value[k], s)
    elif not _is_dim_like(spec):
        raise InputError(
            f"dynamic_shapes for the non-tensor input {path} must be None, got {spec!r}",
            hint="only tensors have dynamic dims",
        )


def check_dynamic_shapes(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, dynamic_shapes: Any
) -> None:
    """Refuse a dynamic_shapes spec that does not mirror (args, kwargs), before tracing."""
    if dynamic_shapes is None:
        return
    kwargs = dict(kwargs or {})
    if isinstance(dynamic_shapes, Mapping):
        try:
            bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
        except TypeError as exc:
            raise InputError(
                f"args/kwargs do not fit {type(model).__name__}.forward: {exc}",
                hint="pass the inputs forward() takes",
            ) from exc
        unknown = [k for k in dynamic_shapes if k not in bound]
        if unknown:
            raise InputError(
                f"dynamic_shapes names {unknown}, which are not inputs of forward (inputs: {list(bound)})",
                hint="key dynamic_shapes by forward's parameter names, or pass a tuple",
            )
        for k, spec in dynamic_shapes.items():
            _check_spec_tree(k, bound[k], spec)
        return
    if isinstance(dynamic_shapes, (tuple, list)):
        # torch.export pairs a tuple spec with forward's parameters, in order: a var-positional
        # ``*inputs`` takes one spec (a tuple) for all the arguments it collects.
        try:
            bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = {f"args[{i}]": v for i, v in enumerate(args)} | {
                f"kwargs[{k!r}]": v for k, v in kwargs.items()
            }
        if len(dynamic_shapes) != len(bound):
            raise InputError(
                f"dynamic_shapes has {len(dynamic_shapes)} entries but forward takes "
                f"{len(bound)} inputs ({list(bound)})",
                hint="give one spec per parameter of forward (None for static ones)",
            )
        for (n, v), spec in zip(bound.items(), dynamic_shapes, strict=True):
            _check_spec_tree(n, v, spec)
        return
    raise InputError(
        f"dynamic_shapes must be a dict or a tuple, got {type(dynamic_shapes).__name__}",
        hint="e.g. dynamic_shapes=({0: torch.export.Dim('batch')},)",
    )


# ------------------------------------------------------------------------------ the entry point
def validate_export_request(
    model: Any,
    args: Any,
    kwargs: Any,
    *,
    quantize: str | None,
    calibration: Iterable[Any] | None,
    dynamic_shapes: Any = None,
) -> None:
    """Raise InputError for requests that cannot succeed (or would silently export wrong
    numbers); called before tracing. ``model`` is a module (``args`` required) or an
    ExportedProgram (``args`` default to its example inputs; its ranges are its own)."""
    from torch.export import ExportedProgram

    if isinstance(model, ExportedProgram):
        _check_program_request(model, args, kwargs, dynamic_shapes)
        _check_quantize(quantize, calibration)
        return
    _check_model(model)
    if args is None:
        raise InputError(
            f"args are required to trace {type(model).__name__}: torch.export runs the model on them",
            hint="pass example inputs, e.g. dx.export(model, (x,)); only an ExportedProgram brings its own",
        )
    _check_inputs(args, kwargs)
    _check_quantize(quantize, calibration)
    check_dynamic_shapes(model, args, kwargs, dynamic_shapes)


def _check_program_request(program: Any, args: Any, kwargs: Any, dynamic_shapes: Any) -> None:
    """A program as the source: one it can serve from, weights on the CPU and finite, inputs
    that fit it, and no second set of ranges."""
    from .given import check_program, program_inputs

    check_program(program)
    if dynamic_shapes is not None:
        raise InputError(
            "dynamic_shapes was given with an ExportedProgram: a program's dynamic ranges are the "
            "ones it was exported with (its range_constraints)",
            hint="drop dynamic_shapes, or export the module with the ranges you want and pass that program",
        )
    buffers = set(program.graph_signature.buffers)
    _check_weights(
        (
            ("parameter", ((k, v) for k, v in program.state_dict.items() if k not in buffers)),
            ("buffer", ((k, v) for k, v in program.state_dict.items() if k in buffers)),
            ("constant", program.constants.items()),
        )
    )
    args, kwargs = program_inputs(program, args, kwargs)
    _check_inputs(args, kwargs)


# ------------------------------------------------------------------------------ resources
def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers (a program's state_dict and constants), each
    storage counted once (tied weights)."""
    from torch.export import ExportedProgram

    if isinstance(model, ExportedProgram):
        tensors = [
            t for t in [*model.state_dict.values(), *model.constants.values()] if isinstance(t, torch.Tensor)
        ]
    else:
        tensors = list(model.parameters()) + list(model.buffers())
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        key = (
            (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if t.device.type != "meta"
            else (id(t), 0)
        )
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total

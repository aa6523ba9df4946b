"""Input tensors saved beside the artifacts (``<name>.inputs.npz``), loaded without pickle."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from ..errors import ArtifactIOError

__all__ = ["save_inputs", "load_inputs"]

_VIEW = {torch.bfloat16: (torch.int16, "bfloat16")}


def save_inputs(path: pathlib.Path, tensors: list[torch.Tensor]) -> None:
    """Write flat input tensors as .npz (bfloat16 stored as its int16 bits, dtype name kept)."""
    from ..outputs.atomic import atomic_write_bytes
    import io

    arrays: dict[str, np.ndarray] = {}
    dtypes = []
    for i, t in enumerate(tensors):
        t = t.detach().cpu().contiguous()
        if t.dtype in _VIEW:
            view, name = _VIEW[t.dtype]
            arrays[f"t{i}"] = t.view(view).numpy()
            dtypes.append(name)
        else:
            arrays[f"t{i}"] = t.numpy()
            dtypes.append(str(t.dtype).replace("torch.", ""))
    arrays["dtypes"] = np.array(dtypes, dtype="U16")
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def load_inputs(path: pathlib.Path) -> list[torch.Tensor]:
    try:
        with np.load(path, allow_pickle=False) as data:
            dtypes = [str(d) for d in data["dtypes"]]
            out = []
            for i, name in enumerate(dtypes):
                arr = torch.from_numpy(np.array(data[f"t{i}"]))
                out.append(arr.view(torch.bfloat16) if name == "bfloat16" else arr)
    except (OSError, KeyError, ValueError) as exc:
        raise ArtifactIOError(f"cannot read inputs from {path.name}: {exc}",
                              hint="re-export, or pass inputs explicitly") from exc
    return out


def _bound(value: object) -> int | None:
    """A range bound as an int; None for (torch's int_oo) infinity."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


InputSpec = dict  # {"dtype": str, "dims": [int | [lo, hi|None], ...]}


def input_specs(program: "torch.export.ExportedProgram") -> list[InputSpec]:
    """Per user tensor input: dtype and, per dim, its static size or its exported [lo, hi] range.

    Written into the ONNX model's metadata (``dualexport.input_ranges``) so the range survives
    with the file: ONNX itself has no way to state or enforce it.
    """
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs: list[InputSpec] = []
    for name in user:
        fake = nodes[name].meta.get("val") if name in nodes else None
        if not isinstance(fake, torch.Tensor):
            continue
        dims: list = []
        for size in fake.shape:
            if isinstance(size, int):
                dims.append(size)
                continue
            rng = program.range_constraints.get(size.node.expr)
            dims.append([(_bound(rng.lower) or 0) if rng is not None else 0,
                         _bound(rng.upper) if rng is not None else None])
        specs.append({"dtype": str(fake.dtype).replace("torch.", ""), "dims": dims})
    return specs


def check_against_specs(specs: list[InputSpec], flat: list[torch.Tensor], label: str) -> None:
    """Refuse inputs outside what the program was exported for, naming the dim and its range.

    Why: outside a declared Dim range the eager reference fails with a bare guard assertion,
    ONNX Runtime accepts any size, and ExecuTorch accepts sizes below the minimum and rejects
    those above the maximum with an error code; nothing downstream would say what is wrong.
    """
    from ..errors import InputError

    if len(specs) != len(flat):
        raise InputError(f"{label}: the program takes {len(specs)} tensor inputs, got {len(flat)}",
                         hint="pass inputs with the structure of the example inputs")
    for i, (spec, t) in enumerate(zip(specs, flat)):
        dims = spec["dims"]
        if len(dims) != t.dim():
            raise InputError(f"{label}: input {i} has {t.dim()} dims, the program takes {len(dims)}",
                             hint=f"use a shape like {dims}")
        want = spec["dtype"]
        if str(t.dtype).replace("torch.", "") != want:
            raise InputError(f"{label}: input {i} is {t.dtype}, the program takes {want}",
                             hint=f"convert it with .to(torch.{want})")
        for d, (size, actual) in enumerate(zip(dims, t.shape)):
            if isinstance(size, int):
                if size != actual:
                    raise InputError(
                        f"{label}: input {i} dim {d} is {actual}, but it was exported static at {size}",
                        hint="declare the dim dynamic with torch.export.Dim in dynamic_shapes")
                continue
            lo, hi = size
            if actual < lo or (hi is not None and actual > hi):
                raise InputError(
                    f"{label}: input {i} dim {d} is {actual}, outside the exported range "
                    f"[{lo}, {hi if hi is not None else 'inf'}]",
                    hint="re-export with a wider Dim(min=..., max=...) or pass inputs inside the range")


def check_input_shapes(program: "torch.export.ExportedProgram", flat: list[torch.Tensor], label: str) -> None:
    """:func:`check_against_specs` with the specs read off ``program``."""
    check_against_specs(input_specs(program), flat, label)


def generate_input_sets(flat: list[torch.Tensor], *, seeds: int = 3) -> list[tuple[str, list[torch.Tensor]]]:
    """Input sets that catch what one random-normal example misses, shaped like ``flat``.

    Several seeds; large magnitude (x1000: overflow, saturation, loss of relative precision);
    all zeros (division by a zero norm, NaN from 0/0). Integer inputs (token ids, positions) are
    drawn from the example's own value range so they stay valid; bools stay bools.
    """
    def like(t: torch.Tensor, g: torch.Generator, mode: str) -> torch.Tensor:
        if t.dtype.is_floating_point:
            if mode == "zeros":
                return torch.zeros_like(t)
            x = torch.randn(t.shape, generator=g).to(t.dtype)
            return x * 1000 if mode == "large" else x
        if t.dtype == torch.bool:
            return torch.randint(0, 2, t.shape, generator=g).bool()
        lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 0)
        if mode == "zeros":
            return torch.full_like(t, max(lo, 0) if lo <= 0 <= hi else lo)
        return torch.randint(lo, hi + 1, t.shape, generator=g).to(t.dtype)

    out = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(1000 + seed)
        out.append((f"seed{seed}", [like(t, g, "normal") for t in flat]))
    g = torch.Generator().manual_seed(2000)
    out.append(("large", [like(t, g, "large") for t in flat]))
    out.append(("zeros", [like(t, g, "zeros") for t in flat]))
    return out


def load_input_file(path: pathlib.Path) -> list[list[torch.Tensor]]:
    """Flat input sets from ``.npz`` (no pickle) or ``.pt`` (torch.load weights_only=True).

    .npz: our own ``<name>.inputs.npz`` format, or plain arrays taken in name order as one set.
    .pt: a tensor, a tuple of tensors (one set) or a list of tuples (several sets).
    """
    path = pathlib.Path(path)
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                keys = list(data.keys())
        except (OSError, ValueError) as exc:
            raise ArtifactIOError(f"cannot read inputs from {path.name}: {exc}",
                                  hint="save arrays with numpy.savez (no object arrays)") from exc
        if "dtypes" in keys:
            return [load_inputs(path)]
        with np.load(path, allow_pickle=False) as data:
            return [[torch.from_numpy(np.array(data[k])) for k in sorted(keys)]]
    if path.suffix in (".pt", ".pth"):
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise ArtifactIOError(f"cannot read inputs from {path.name} with weights_only=True: {exc}",
                                  hint="save only tensors (torch.save((x,), path)); code is never unpickled") from exc
        if isinstance(obj, torch.Tensor):
            return [[obj]]
        if isinstance(obj, tuple) and all(isinstance(t, torch.Tensor) for t in obj):
            return [list(obj)]
        if isinstance(obj, list) and all(isinstance(s, (tuple, list)) for s in obj):
            return [list(s) for s in obj]
        raise ArtifactIOError(f"{path.name} holds {type(obj).__name__}, not tensors or tuples of tensors",
                              hint="save a tuple of tensors, or a list of such tuples")
    raise ArtifactIOError(f"unsupported input file {path.name}", hint="use .npz or .pt")


def unflatten_inputs(program: "torch.export.ExportedProgram", flat: list[torch.Tensor]
                     ) -> tuple[tuple, dict]:
    """Flat input tensors back into (args, kwargs) by the program's input spec."""
    from torch.utils import _pytree as pytree

    from ..errors import InputError

    spec = program.call_spec.in_spec
    if spec is None:
        return tuple(flat), {}
    try:
        args, kwargs = pytree.tree_unflatten(list(flat), spec)
    except Exception as exc:
        raise InputError(f"{len(flat)} input tensors do not fit the program's inputs: {exc}",
                         hint="give one tensor per input, in the order of the example inputs") from exc
    return tuple(args), dict(kwargs)


def extra_input_sets(program: "torch.export.ExportedProgram", example_flat: list[torch.Tensor],
                     inputs: object = None, generate: int = 0) -> list[tuple]:
    """The input sets beyond the example: the user's (argument tuples, ``(args, kwargs)`` pairs,
    or a .npz/.pt file) and, with ``generate``, the generated ones shaped like the example."""
    import os

    from ..errors import InputError

    sets: list[tuple] = []  # (label, args, kwargs): what run_parity takes
    if isinstance(inputs, (str, os.PathLike)):
        sets += [(f"file{i}", *unflatten_inputs(program, flat))
                 for i, flat in enumerate(load_input_file(pathlib.Path(inputs)))]
    elif inputs is not None:
        for i, item in enumerate(inputs):  # type: ignore[attr-defined]
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], tuple) \
                    and isinstance(item[1], dict):
                sets.append((f"input{i}", item[0], item[1]))
            elif isinstance(item, tuple):
                sets.append((f"input{i}", item, {}))
            else:
                raise InputError(f"inputs[{i}] must be a tuple of arguments, got {type(item).__name__}",
                                 hint="pass inputs=[(x1,), (x2,)]")
    if generate:
        sets += [(label, *unflatten_inputs(program, flat))
                 for label, flat in generate_input_sets(example_flat, seeds=generate)]
    return sets

"""Input tensors saved beside the artifacts (``<name>.inputs.npz``), loaded without pickle."""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch.export import ExportedProgram

from ..errors import ArtifactIOError, InputError
from ..outputs.atomic import atomic_write_bytes
from ..shared_state.contract import edge_sizes, unflatten_inputs

__all__ = [
    "save_inputs",
    "load_inputs",
    "generate_input_sets",
    "inputs_with_shapes",
    "load_input_file",
    "extra_input_sets",
    "edge_input_sets",
]

_VIEW = {torch.bfloat16: (torch.int16, "bfloat16")}


def save_inputs(path: pathlib.Path, tensors: list[torch.Tensor]) -> None:
    """Write flat input tensors as .npz (bfloat16 stored as its int16 bits, dtype name kept)."""
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
    np.savez(buf, allow_pickle=False, **arrays)
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
        raise ArtifactIOError(
            f"cannot read inputs from {path.name}: {exc}", hint="re-export, or pass inputs explicitly"
        ) from exc
    return out


def _like(t: torch.Tensor, g: torch.Generator, mode: str, shape: Sequence[int] | None = None) -> torch.Tensor:
    """A tensor like ``t`` (dtype; ``shape`` if given): floats random normal (x1000 for
    ``large``, zeros for ``zeros``); integers drawn from ``t``'s own value range (token ids stay
    valid), except positions (rows counting up by one), which count up at any length; bools stay
    bools."""
    shape = tuple(t.shape) if shape is None else tuple(shape)
    if t.dtype.is_floating_point:
        if mode == "zeros":
            return torch.zeros(shape, dtype=t.dtype)
        x = torch.randn(shape, generator=g).to(t.dtype)
        return x * 1000 if mode == "large" else x
    if t.dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    start = _positions_start(t)
    if start is not None and shape:  # positions stay positions: distinct, in order
        return (start + torch.arange(shape[-1], dtype=t.dtype)).expand(shape).clone()
    lo, hi = (int(t.min()), int(t.max())) if t.numel() else (0, 0)
    if mode == "zeros":
        return torch.full(shape, max(lo, 0) if lo <= 0 <= hi else lo, dtype=t.dtype)
    return torch.randint(lo, hi + 1, shape, generator=g).to(t.dtype)


def _positions_start(t: torch.Tensor) -> int | None:
    """The first value when every row of ``t`` (last dim, at least 2 long) counts up by one from
    the same start (``cache_position``, ``position_ids``), else None.

    Why: drawn at random from the example's range, a 510-long ``cache_position`` at a range edge
    repeats values, and a cache written at repeated positions is undefined (each runtime keeps
    another write): a 30-layer decoder's correct .onnx failed its proof at SNR 46 dB that way."""
    if t.dim() == 0 or t.shape[-1] < 2 or t.numel() == 0:
        return None
    rows = t.reshape(-1, t.shape[-1])
    start = int(rows[0, 0])
    want = start + torch.arange(t.shape[-1], dtype=t.dtype)
    return start if bool((rows == want).all()) else None


def inputs_with_shapes(
    flat: Sequence[torch.Tensor], shapes: Sequence[Sequence[int]], seed: int = 0
) -> list[torch.Tensor]:
    """Inputs like the example ``flat`` but with the given shapes (the edges of the ranges)."""
    g = torch.Generator().manual_seed(3000 + seed)
    return [_like(t, g, "normal", shape) for t, shape in zip(flat, shapes, strict=True)]


def generate_input_sets(flat: list[torch.Tensor], *, seeds: int = 3) -> list[tuple[str, list[torch.Tensor]]]:
    """Input sets that catch what one random-normal example misses, shaped like ``flat``.

    Several seeds; large magnitude (x1000: overflow, saturation, loss of relative precision);
    all zeros (division by a zero norm, NaN from 0/0). Integer inputs (token ids, positions) are
    drawn from the example's own value range so they stay valid; bools stay bools.
    """
    out = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(1000 + seed)
        out.append((f"seed{seed}", [_like(t, g, "normal") for t in flat]))
    g = torch.Generator().manual_seed(2000)
    out.append(("large", [_like(t, g, "large") for t in flat]))
    out.append(("zeros", [_like(t, g, "zeros") for t in flat]))
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
            raise ArtifactIOError(
                f"cannot read inputs from {path.name}: {exc}",
                hint="save arrays with numpy.savez (no object arrays)",
            ) from exc
        if "dtypes" in keys:
            return [load_inputs(path)]
        with np.load(path, allow_pickle=False) as data:
            return [[torch.from_numpy(np.array(data[k])) for k in sorted(keys)]]
    if path.suffix in (".pt", ".pth"):
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as exc:
            raise ArtifactIOError(
                f"cannot read inputs from {path.name} with weights_only=True: {exc}",
                hint="save only tensors (torch.save((x,), path)); code is never unpickled",
            ) from exc
        if isinstance(obj, torch.Tensor):
            return [[obj]]
        if isinstance(obj, tuple) and all(isinstance(t, torch.Tensor) for t in obj):
            return [list(obj)]
        if isinstance(obj, list) and all(isinstance(s, (tuple, list)) for s in obj):
            return [list(s) for s in obj]
        raise ArtifactIOError(
            f"{path.name} holds {type(obj).__name__}, not tensors or tuples of tensors",
            hint="save a tuple of tensors, or a list of such tuples",
        )
    raise ArtifactIOError(f"unsupported input file {path.name}", hint="use .npz or .pt")


def edge_input_sets(program: ExportedProgram, example_flat: Sequence[torch.Tensor]) -> list[tuple]:
    """One input set per edge of the declared ranges (``edge:min``, ``edge:max-1``,
    ``edge:max``), shaped by the contract, valued like the example."""
    return [
        (f"edge:{e.label}", *unflatten_inputs(program, inputs_with_shapes(example_flat, e.inputs, i)))
        for i, e in enumerate(edge_sizes(program))
    ]


def extra_input_sets(
    program: ExportedProgram, example_flat: list[torch.Tensor], inputs: object = None, generate: int = 0
) -> list[tuple]:
    """The input sets beyond the example: the user's (argument tuples, ``(args, kwargs)`` pairs,
    or a .npz/.pt file) and, with ``generate``, the generated ones shaped like the example."""
    sets: list[tuple] = []  # (label, args, kwargs): what run_parity takes
    if isinstance(inputs, (str, os.PathLike)):
        sets += [
            (f"file{i}", *unflatten_inputs(program, flat))
            for i, flat in enumerate(load_input_file(pathlib.Path(inputs)))
        ]
    elif inputs is not None:
        if not isinstance(inputs, Iterable):
            raise InputError(
                f"inputs must be argument tuples or a file path, got {type(inputs).__name__}",
                hint="pass inputs=[(x1,), (x2,)] or a .npz/.pt file",
            )
        for i, item in enumerate(inputs):
            if (
                isinstance(item, tuple)
                and len(item) == 2
                and isinstance(item[0], tuple)
                and isinstance(item[1], dict)
            ):
                sets.append((f"input{i}", item[0], item[1]))
            elif isinstance(item, tuple):
                sets.append((f"input{i}", item, {}))
            else:
                raise InputError(
                    f"inputs[{i}] must be a tuple of arguments, got {type(item).__name__}",
                    hint="pass inputs=[(x1,), (x2,)]",
                )
    if generate:
        sets += [
            (label, *unflatten_inputs(program, flat))
            for label, flat in generate_input_sets(example_flat, seeds=generate)
        ]
    return sets

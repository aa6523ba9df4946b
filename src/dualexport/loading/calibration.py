"""Calibration data for ``quantize="int8"`` from the command line: a ``torch.save``d list of
input tuples (loaded with ``weights_only=True``: tensors and containers only, no code), or N
random sets shaped like the example inputs."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

from ..errors import InputError

__all__ = ["load_calibration", "random_calibration"]

_FORMAT = "a torch.save'd list of input tuples, e.g. torch.save([(x1,), (x2,)], 'calib.pt')"


def load_calibration(path: str | os.PathLike[str]) -> list[tuple[Any, ...]]:
    """``[(x1,), (x2,), ...]`` from ``path``; a bare tensor per item is taken as ``(x,)``."""
    import torch

    p = pathlib.Path(path)
    if not p.is_file():
        raise InputError(f"calibration file {str(p)!r} does not exist", hint=f"pass {_FORMAT}")
    try:
        data = torch.load(p, weights_only=True, map_location="cpu")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"calibration file {str(p)!r} could not be loaded with weights_only=True: {first}",
            hint=f"pass {_FORMAT} (tensors, tuples and lists only)",
        ) from exc
    if isinstance(data, torch.Tensor) or not isinstance(data, (list, tuple)) or not data:
        raise InputError(
            f"calibration file {str(p)!r} holds a {type(data).__name__}"
            + (" with no items" if isinstance(data, (list, tuple)) else ""),
            hint=f"pass {_FORMAT}",
        )
    sets = []
    for i, item in enumerate(data):
        if isinstance(item, torch.Tensor):
            item = (item,)
        if not isinstance(item, (tuple, list)) or not all(isinstance(x, torch.Tensor) for x in item):
            raise InputError(
                f"calibration file {str(p)!r}: item {i} is a {type(item).__name__}, not a tuple of tensors",
                hint=f"pass {_FORMAT}",
            )
        sets.append(tuple(item))
    return sets


def random_calibration(example: Sequence[Any], n: int, *, seed: int = 1000) -> list[tuple[Any, ...]]:
    """``n`` input tuples shaped like ``example``: floats from N(0, 1), integers drawn from the
    example's own min..max, bools 0/1; seeded (``seed``, ``seed + 1``, ...) apart from the
    example's seeds."""
    import torch

    if n < 1:
        raise InputError(f"--calibration-random needs N >= 1, got {n}")
    sets = []
    for k in range(n):
        g = torch.Generator().manual_seed(seed + k)
        item = []
        for x in example:
            if not isinstance(x, torch.Tensor):
                item.append(x)
            elif x.is_floating_point():
                item.append(torch.randn(x.shape, generator=g).to(x.dtype))
            elif x.dtype == torch.bool:
                item.append(torch.randint(0, 2, x.shape, generator=g).bool())
            else:
                lo, hi = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
                item.append(torch.randint(lo, hi + 1, x.shape, generator=g).to(x.dtype))
        sets.append(tuple(item))
    return sets

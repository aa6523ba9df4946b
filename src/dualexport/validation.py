"""Input checks before any work: refuse bad requests with a message that says what to try."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .errors import InputError

__all__ = ["validate_export_request"]


def validate_export_request(model: Any, args: Any, kwargs: Any, *, quantize: str | None,
                            calibration: Iterable[Any] | None) -> None:
    """Raise InputError for requests that cannot succeed; called before tracing."""
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}",
                         hint="pass the module instance, e.g. dx.export(MyNet(), (x,))")
    if not isinstance(args, tuple):
        raise InputError(f"args must be a tuple of example inputs, got {type(args).__name__}",
                         hint="wrap a single tensor as (x,)")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InputError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    if quantize not in (None, "int8"):
        raise InputError(f"quantize={quantize!r} is not supported", hint="use quantize=None or 'int8'")
    if quantize == "int8" and calibration is None:
        raise InputError("quantize='int8' needs calibration data",
                         hint="pass calibration=[(x1,), (x2,), ...] with representative inputs")

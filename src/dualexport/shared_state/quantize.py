"""int8 PT2E static per-channel quantization of the shared program (both targets).

Not implemented yet: the coverage issue owns it. Raising here keeps quantize="int8" honest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import InputError

__all__ = ["quantize_shared"]


def quantize_shared(shared: Any, scheme: str, calibration: Iterable[Any] | None) -> None:
    raise InputError(f"quantize={scheme!r} is not implemented in this version",
                     hint="export without quantize")

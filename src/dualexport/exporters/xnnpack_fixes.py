"""Work-arounds for ExecuTorch 1.4.1 bugs met inside XNNPACK lowering on ordinary models, applied
only while dualexport lowers (and restored after), each proven by a test where the plain library
fails (tests/test_canonical.py).

* ``FuseBatchNormPass`` names the fused weight after the convolution's state_dict key with ``.``
  replaced by ``_`` (``create_constant_placeholder``), but FX sanitizes every other character
  that is not valid in an identifier when it names the placeholder node; the pass then looks the
  node up by the unsanitized name: ``ValueError: '..._block1-0_proj_0_weight_fused_bn' is not in
  list`` on torchvision's RegNet (module names like ``block1-0``). The name is sanitized the way
  FX does before the pass uses it. The fused weights are new tensors of XNNPACK's own (recorded as
  not stored by the weight manifest), so their names appear nowhere else.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["xnnpack_workarounds"]

_MODULES = (
    "executorch.backends.xnnpack._passes.fuse_batch_norm",
    "executorch.backends.xnnpack._passes.decompose_batch_norm",
)
_NAME = "create_constant_placeholder"
_LOCK = threading.Lock()
_DEPTH = 0
_ORIGINAL: dict[str, Any] = {}


def _sanitized(fn: Any) -> Any:
    def create_constant_placeholder(*args: Any, **kwargs: Any) -> Any:
        if "name" in kwargs:
            kwargs["name"] = re.sub(r"[^0-9a-zA-Z_]", "_", kwargs["name"])
        return fn(*args, **kwargs)

    return create_constant_placeholder


@contextlib.contextmanager
def xnnpack_workarounds() -> Iterator[None]:
    """Install the work-arounds for the duration of a lowering (re-entrant)."""
    import importlib

    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            for name in _MODULES:
                namespace = vars(importlib.import_module(name))
                _ORIGINAL[name] = namespace[_NAME]
                namespace[_NAME] = _sanitized(_ORIGINAL[name])
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                for name, fn in _ORIGINAL.items():
                    vars(importlib.import_module(name))[_NAME] = fn
                _ORIGINAL.clear()

"""ExecuTorch's private symbols dualexport reaches (``SEAMS`` lists each), behind small functions.

Why: see the package docstring. ExecuTorch takes seconds to import, so every function imports
what it needs when called; ``import dualexport`` never loads it. The module attributes
dualexport swaps while it lowers (``backend_api.copy``, ``xnnpack_preprocess.XNNPACKPassManager``,
the batch-norm passes' ``create_constant_placeholder``) are reached here too; the swaps
themselves are context managers around dualexport's own lowering
(``exporters/xnnpack_fixes.py``, ``exporters/backend_passes.py``).
"""

from __future__ import annotations

import types
from typing import Any

from . import Seam

__all__ = [
    "SEAMS",
    "backend_api_module",
    "batch_norm_pass_modules",
    "default_decomposition_table",
    "deserialize_flat_tensor",
    "deserialize_pte",
    "drop_lowered_payloads",
    "fuseable_activations",
    "load_bundled_for_executorch",
    "load_bundled_program",
    "load_for_executorch",
    "load_llm_ops",
    "reset_threadpool",
    "transform",
    "xnnpack_pass_types",
    "xnnpack_preprocess_module",
]

_PASSES = "executorch.backends.xnnpack._passes"
_BATCH_NORM_PASSES = (f"{_PASSES}.fuse_batch_norm", f"{_PASSES}.decompose_batch_norm")
_LOWERED = "executorch.exir.lowered_backend_module.LoweredBackendModule"

SEAMS: tuple[Seam, ...] = (
    Seam(
        "executorch.extension.pybindings.portable_lib._load_for_executorch",
        "load a .pte with its external weights file (.ptd)",
        "load_for_executorch",
    ),
    Seam(
        "executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool",
        "pthreadpool's workers after a fork",
        "reset_threadpool",
    ),
    Seam(
        "executorch.extension.pybindings.portable_lib._load_bundled_program_from_buffer",
        "a bundled program (.bpte) for the runtime self-test",
        "load_bundled_program",
    ),
    Seam(
        "executorch.extension.pybindings.portable_lib._load_for_executorch_from_bundled_program",
        "run a bundled program with its external weights file",
        "load_bundled_for_executorch",
    ),
    Seam(
        "executorch.exir._serialize._program.deserialize_pte_binary",
        "read a .pte's tables",
        "deserialize_pte",
    ),
    Seam(
        "executorch.extension.flat_tensor.serialize.serialize._deserialize_to_flat_tensor",
        "read a .ptd's named-data table",
        "deserialize_flat_tensor",
    ),
    Seam(
        "executorch.exir.tracer._default_decomposition_table",
        "the edge decomposition table the XNNPACK target starts from",
        "default_decomposition_table",
    ),
    Seam(
        f"{_PASSES}.fuse_activation_pass.FuseActivationPass.FUSEABLE_ACTIVATIONS",
        "does a subgraph have an activation the pass fuses",
        "fuseable_activations",
    ),
    Seam(f"{_PASSES}.XNNPACKPass", "the pass kinds XNNPACKPassManager instantiates", "xnnpack_pass_types"),
    Seam(f"{_PASSES}.XNNPACKPassManager", "the pruned manager subclasses it", "xnnpack_pass_types"),
    Seam("executorch.exir.program._program._transform", "run one backend pass on a program", "transform"),
    Seam(
        f"{_PASSES}.fuse_batch_norm.create_constant_placeholder",
        "swapped for a name-sanitizing one while dualexport lowers",
        "batch_norm_pass_modules",
    ),
    Seam(
        f"{_PASSES}.decompose_batch_norm.create_constant_placeholder",
        "swapped for a name-sanitizing one while dualexport lowers",
        "batch_norm_pass_modules",
    ),
    Seam(
        "executorch.exir.backend.backend_api.copy",
        "swapped for a deepcopy sharing the weights while dualexport lowers",
        "backend_api_module",
    ),
    Seam(
        "executorch.backends.xnnpack.xnnpack_preprocess.XNNPACKPassManager",
        "swapped for the pruned manager while dualexport lowers",
        "xnnpack_preprocess_module",
    ),
    Seam(
        f"{_LOWERED}._named_data_store_output", "drop a written delegate's weights", "drop_lowered_payloads"
    ),
    Seam(f"{_LOWERED}._processed_bytes", "drop a written delegate's blob", "drop_lowered_payloads"),
)


def load_for_executorch(path: str, data_path: str) -> Any:
    """A runtime module for the .pte at ``path`` whose weights are in ``data_path`` (the public
    ``executorch.runtime`` takes no external data file in ExecuTorch 1.4.1)."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    return _load_for_executorch(path, data_path=data_path)


def load_llm_ops() -> None:
    """Register ExecuTorch's LLM custom ops (``llama::update_cache``, ``llama::custom_sdpa``, ...):
    their shapes for a capture and their kernels for the runtime (the module loads their library
    on import; it takes a few seconds, so only a program that calls them pays)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401


def load_bundled_program(buffer: bytes) -> Any:
    """The runtime's bundled program over a .bpte's bytes (it runs its own expected-output check)."""
    from executorch.extension.pybindings.portable_lib import _load_bundled_program_from_buffer

    return _load_bundled_program_from_buffer(buffer)


def load_bundled_for_executorch(bundle: Any, data_path: str) -> Any:
    """A runtime module for a bundled program whose weights are in ``data_path``."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_bundled_program

    return _load_for_executorch_from_bundled_program(bundle, data_path=data_path)


def reset_threadpool(threads: int) -> None:
    """Re-create ExecuTorch's thread pool with ``threads`` workers (a forked child has none)."""
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    _unsafe_reset_threadpool(threads)


def deserialize_pte(data: Any) -> Any:
    """ExecuTorch's own reader of a .pte's bytes (a buffer or memoryview; not copied)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    return deserialize_pte_binary(data)


def deserialize_flat_tensor(data: bytes) -> Any:
    """ExecuTorch's reader of a FlatTensor (.ptd) flatbuffer: its segments and named data."""
    from executorch.extension.flat_tensor.serialize.serialize import _deserialize_to_flat_tensor

    return _deserialize_to_flat_tensor(data)


def default_decomposition_table() -> Any:
    """A fresh ExecuTorch edge decomposition table (a torch ``CustomDecompTable``, which the
    caller may edit: an op popped from it is preserved by ``run_decompositions``)."""
    from executorch.exir.tracer import _default_decomposition_table

    return _default_decomposition_table()


def fuseable_activations() -> frozenset[Any]:
    """The activation ops XNNPACK's FuseActivationPass fuses into the op before them."""
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass

    return frozenset(FuseActivationPass.FUSEABLE_ACTIVATIONS)


def xnnpack_pass_types() -> tuple[type, type]:
    """``(XNNPACKPass, XNNPACKPassManager)``."""
    from executorch.backends.xnnpack._passes import XNNPACKPass, XNNPACKPassManager

    return XNNPACKPass, XNNPACKPassManager


def transform(program: Any, pass_: Any) -> Any:
    """The program after one pass, the way ExecuTorch's pass managers run it."""
    from executorch.exir.program._program import _transform

    return _transform(program, pass_)


def batch_norm_pass_modules() -> tuple[types.ModuleType, ...]:
    """The modules of XNNPACK's two batch-norm passes (each calls its module-level
    ``create_constant_placeholder``)."""
    import importlib

    return tuple(importlib.import_module(name) for name in _BATCH_NORM_PASSES)


def backend_api_module() -> types.ModuleType:
    """ExecuTorch's backend_api module (it deep-copies each partition through its ``copy``)."""
    import executorch.exir.backend.backend_api as backend_api

    return backend_api


def xnnpack_preprocess_module() -> Any:
    """The module whose ``XNNPACKPassManager`` XNNPACK's preprocess instantiates (typed Any: the
    caller swaps that attribute)."""
    import executorch.backends.xnnpack.xnnpack_preprocess as preprocess

    return preprocess


def drop_lowered_payloads(graph_module: Any) -> None:
    """Drop the delegate payloads (XNNPACK blob, named weight data) of every lowered module in
    ``graph_module``: they are only needed until the file is written."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    for module in graph_module.modules():
        if isinstance(module, LoweredBackendModule):
            module._named_data_store_output = None
            module._processed_bytes = b""

"""Work-arounds inside XNNPACK lowering for ExecuTorch 1.4.1, applied only while dualexport lowers
(and restored after), each proven by a test where the plain library fails or by byte-identical
files.

* ``FuseBatchNormPass`` names the fused weight after the convolution's state_dict key with ``.``
  replaced by ``_`` (``create_constant_placeholder``), but FX sanitizes every other character
  that is not valid in an identifier when it names the placeholder node; the pass then looks the
  node up by the unsanitized name: ``ValueError: '..._block1-0_proj_0_weight_fused_bn' is not in
  list`` on torchvision's RegNet (module names like ``block1-0``), and on a top-level
  ``nn.Sequential`` of a convolution and a BatchNorm (``0_weight_fused_bn``: FX prefixes the
  leading digit). The name is sanitized the way FX does before the pass uses it. The fused weights are new tensors of XNNPACK's own (recorded as
  not stored by the weight manifest), so their names appear nowhere else.
* ``lower_all_submodules_to_backend`` deep-copies each partition's program, weights included,
  before XNNPACK preprocess ("in case backends change graph inside preprocess",
  exir/backend/backend_api.py): one full copy of the weights that nothing needs. The copy is
  made with the program's own tensors pre-filled in deepcopy's memo, so the graph is copied and
  the immutable weights are shared (ExecuTorch 1.5 adds a backend hook for the same sharing). A
  backend pass that wrote into a shared weight would change the holder's tensor, which the pin
  around the job refuses (ProgramMutatedError); the files are byte-identical either way
  (tests/test_memory_release.py).
* ``UnsqueezeCopyConfig`` takes a trailing unsqueeze whatever its shape, but the node visitor
  writes it as a static reshape, which takes one dynamic dim: with a dynamic batch and sequence
  (RoFormer's interleaved rotary ``stack([-x[..., 1::2], x[..., ::2]], -1)``) the lowering died
  with "XNNPACK reshape only supports 1 dynamic dimension", plain ExecuTorch as well.
  ``partitioner_configs`` carries the visitor's condition into the partitioner: such an
  unsqueeze stays outside the delegate.
* ``GeluConfig`` takes ``gelu`` whatever its ``approximate``, and the node visitor writes
  XNNPACK's exact (erf) GELU: ``gelu(x, approximate="tanh")`` (transformers'
  ``gelu_pytorch_tanh``: Gemma, Starcoder2) silently became the exact GELU in the .pte (a 2-layer
  Starcoder2: logits off by 1.3e-3, tokens still equal). The partitioner now leaves the tanh form
  to ExecuTorch's portable kernel, which honours it; with dualexport's XNNPACK rewrites it never
  gets there (``xnnpack_rewrites._tanh_gelu`` writes it as the elementwise ops it is).
* ``to_edge_transform_and_lower`` decomposes its input three more times
  (``_gen_edge_manager_for_partitioners``: ``run_decompositions({})`` to functionalize, then the
  table without the partitioner's ops, then the default table around its EDGE_DO_NOT_DECOMP
  marking), each a whole re-trace of the graph: on the program the target's own decomposition
  already made, 26 of the 78 s of SmolLM2-135M's runner .pte, and none changes an op.
  ``decomposed_once`` hands ExecuTorch a copy of the program whose ``run_decompositions``
  returns a graph copy (the same tensors) when nothing in the graph is in the table and nothing
  mutates, and decomposes as before otherwise (an op the partitioner then refuses).
"""

from __future__ import annotations

import contextlib
import copy
import re
import types
from collections.abc import Iterator
from typing import Any

from ..compat.executorch import backend_api_module, batch_norm_pass_modules
from ..compat.patching import patched
from ..compat.torch import op_schema, set_weight_dicts, weight_dicts
from ..shared_state.passes.graph_edit import copy_program

__all__ = [
    "xnnpack_workarounds",
    "deepcopy_sharing_weights",
    "own_dicts",
    "partitioner_configs",
    "decomposed_once",
    "nothing_to_decompose",
]

_NAME = "create_constant_placeholder"


def _sanitized(fn: Any) -> Any:
    def create_constant_placeholder(*args: Any, **kwargs: Any) -> Any:
        if "name" in kwargs:  # FX's own rule (Graph namespace): invalid characters, leading digit
            name = re.sub(r"[^0-9a-zA-Z_]+", "_", kwargs["name"])
            kwargs["name"] = f"_{name}" if name[:1].isdigit() else name
        return fn(*args, **kwargs)

    return create_constant_placeholder


def deepcopy_sharing_weights(x: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy`` that keeps an ExportedProgram's weights (state_dict and constants) as
    the same objects: the graph and its metadata are copied, the tensors are not."""
    from torch import Tensor
    from torch.export import ExportedProgram

    if memo is None and isinstance(x, ExportedProgram):
        memo = {id(t): t for t in [*x.state_dict.values(), *x.constants.values()] if isinstance(t, Tensor)}
    return copy.deepcopy(x, memo)


#: backend_api uses ``copy.deepcopy`` only; its ``copy`` name is swapped for this namespace.
_COPY = types.SimpleNamespace(copy=copy.copy, Error=copy.Error, deepcopy=deepcopy_sharing_weights)


@contextlib.contextmanager
def xnnpack_workarounds(share_weights: bool = True) -> Iterator[None]:
    """Install the work-arounds for the duration of a lowering (re-entrant, any thread:
    ``compat.patching.patched``)."""
    with contextlib.ExitStack() as swaps:
        for module in batch_norm_pass_modules():
            swaps.enter_context(patched(module, _NAME, _sanitized))
        if share_weights:
            swaps.enter_context(patched(backend_api_module(), "copy", lambda _: _COPY))
        yield


@contextlib.contextmanager
def own_dicts(program: Any) -> Iterator[None]:
    """The lowering gets dicts of its own holding the same tensors.

    Why: ExecuTorch 1.4.1 removes every lifted constant a delegate consumes from the lowered
    program's constants dict, and XNNPACK's decomposed program shares the holder's dicts
    (``shared_state/links.py``): a plain tensor attribute used by a delegated linear
    (``self.w = torch.randn(8, 8)``) vanished from the shared program, which then could not be
    saved (``SpecViolationError: Constant tensor w is not in the constants dictionary``). The
    link is restored afterwards, so ``decomposed.state_dict is holder.state_dict`` still holds
    and every tensor is still the holder's object."""
    state_dict, constants = weight_dicts(program)
    set_weight_dicts(program, dict(state_dict), dict(constants))
    try:
        yield
    finally:
        set_weight_dicts(program, state_dict, constants)


def partitioner_configs() -> list[Any]:
    """ExecuTorch's XNNPACK partitioner configs, the unsqueeze one refusing what its node visitor
    cannot write (an output with more than one dynamic dim), the GELU one refusing the tanh
    approximation its visitor drops."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.generic_node_configs import (
        GeluConfig,
        UnsqueezeCopyConfig,
    )
    from torch.fx.experimental.symbolic_shapes import free_symbols

    class UnsqueezeWithinReshapeLimits(UnsqueezeCopyConfig):
        def check_constraints(self, node: Any, ep: Any) -> bool:
            val = node.meta.get("val")
            if val is not None and sum(bool(free_symbols(d)) for d in val.shape) > 1:
                return False
            return bool(super().check_constraints(node, ep))

    class ExactGeluOnly(GeluConfig):
        def check_constraints(self, node: Any, ep: Any) -> bool:
            if node.kwargs.get("approximate", "none") != "none" or any(a != "none" for a in node.args[1:]):
                return False
            return bool(super().check_constraints(node, ep))

    swap = {UnsqueezeCopyConfig: UnsqueezeWithinReshapeLimits, GeluConfig: ExactGeluOnly}
    return [swap.get(c, c) for c in ALL_PARTITIONER_CONFIGS]


def nothing_to_decompose(program: Any, table: Any) -> bool:
    """Whether ``program.run_decompositions(table)`` would hand back the same ops: no node's op is
    in ``table``, none mutates (functionalization would rewrite it) and no subgraph (control
    flow) is there to walk."""
    import torch

    module = program.graph_module
    if any(isinstance(child, torch.fx.GraphModule) for child in module.children()):
        return False
    # a size read traces back to itself (the tables list it as a composite op)
    sizes = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default, torch.ops.aten.sym_stride.int}
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target in sizes:
            continue
        if node.target in table:
            return False
        schema = op_schema(node.target)
        if schema is not None and schema.is_mutable:
            return False
    return True


def decomposed_once(program: Any) -> Any:
    """A copy of ``program`` (the graph copied, the same tensors in dicts of its own, as
    ``run_decompositions`` hands back) for ExecuTorch's lowering, whose ``run_decompositions``
    returns such a copy again where :func:`nothing_to_decompose`, and decomposes otherwise."""
    copy = copy_program(program)
    state_dict, constants = weight_dicts(copy)
    set_weight_dicts(copy, dict(state_dict), dict(constants))
    decompose = copy.run_decompositions

    def run_decompositions(decomp_table: Any = None, decompose_custom_triton_ops: bool = False) -> Any:
        if decomp_table is not None and not decompose_custom_triton_ops:
            if nothing_to_decompose(copy, decomp_table):
                return decomposed_once(copy)
        return decompose(decomp_table, decompose_custom_triton_ops)

    setattr(copy, "run_decompositions", run_decompositions)  # this object alone  # noqa: B010
    return copy

"""Skip the XNNPACK backend passes that cannot change a delegated subgraph.

Why: XNNPACK's ``preprocess`` runs 17 passes on every delegated subgraph, and each one rebuilds
and re-verifies the ExportedProgram even when it found nothing to do; two of them also build
pattern graphs (torch.export + to_edge) the first time they run in a process. On a 6-layer
TransformerEncoder 13 of the 17 are no-ops and cost ~40% of the lowering. A pass is skipped only
when the subgraph, as it is just before that pass, lacks an op the pass needs to act at all (read
from the pass's source; the pattern passes' needs are checked against ExecuTorch's own patterns by
tests/test_backend_passes.py, which also proves pruned and full lowerings write byte-identical
.pte files). A pass this table does not name always runs, so a new ExecuTorch pass is never lost.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..compat.executorch import fuseable_activations, transform, xnnpack_pass_types, xnnpack_preprocess_module
from ..compat.patching import patched

__all__ = ["PASS_NEEDS", "PassPruning", "pruned_backend_passes"]


Needs = Callable[[torch.fx.Graph], bool]


def _names(graph: torch.fx.Graph) -> set[str]:
    return {getattr(n.target, "__name__", str(n.target)) for n in graph.nodes if n.op == "call_function"}


def _any(*ops: str) -> Needs:
    return lambda graph: not _names(graph).isdisjoint(ops)


def _all(*ops: str) -> Needs:
    return lambda graph: set(ops) <= _names(graph)


def _quantized(graph: torch.fx.Graph) -> bool:
    return any(n.startswith(("quantized_decomposed.", "torchao.")) for n in _names(graph))


def _batch_norm(graph: torch.fx.Graph) -> bool:
    return any("batch_norm" in n for n in _names(graph))


def _foldable(graph: torch.fx.Graph) -> bool:
    """ConstPropPass (ExecuTorch's ExportPass one) folds a node only when no argument is a traced
    value: every input node is a get_attr constant, or there is none (full, arange, ...)."""
    return any(
        n.op == "call_function" and all(i.op == "get_attr" for i in n.all_input_nodes) for n in graph.nodes
    )


def _fusable_activation(graph: torch.fx.Graph) -> bool:
    acts = fuseable_activations()
    return any(n.op == "call_function" and n.target in acts for n in graph.nodes)


#: Pass class name -> "the pass may change this graph". Pattern passes (SubgraphMatcher) need
#: every op their patterns share; the others act on one op kind each.
PASS_NEEDS: dict[str, Needs] = {
    "ConvertToUpsampleBilinear2d": _all("aten.upsample_bilinear2d.vec"),
    "ConvertToSDPAPass": _all("aten._softmax.default", "aten.bmm.default"),
    "ConvertToLinearPass": _any("aten.mm.default", "aten.addmm.default", "aten.bmm.default"),
    "PropagateCustomMetaPass": _quantized,
    "ConstPropPass": _foldable,
    "FuseBatchNormPass": _batch_norm,
    "DecomposeBatchNorm": _batch_norm,
    "FuseActivationPass": _fusable_activation,
    "DecomposeConcatenate": _any("aten.cat.default"),
    "RemoveGetItemPass": _any("aten.max_pool2d_with_indices.default", "aten.max.dim"),
    "InsertPadQDQPass": _any("aten.constant_pad_nd.default"),
    "Conv1dUnsqueezePass": _any("aten.convolution.default"),
    "PReLUReshapePass": _any("aten._prelu_kernel.default"),
    "RemoveRedundantCopyPass": _any("aten._to_copy.default"),
}


@dataclass(frozen=True)
class PassPruning:
    """The backend passes one lowering ran and skipped, by class name, once per subgraph."""

    ran: tuple[str, ...]
    skipped: tuple[str, ...]


class _Counter:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.skipped: list[str] = []

    def result(self) -> PassPruning:
        return PassPruning(tuple(self.ran), tuple(self.skipped))


_local = threading.local()


@functools.cache
def _pass_manager_class() -> type:
    from executorch.exir.pass_base import ExportPass

    XNNPACKPass, XNNPACKPassManager = xnnpack_pass_types()

    class PrunedXNNPACKPassManager(XNNPACKPassManager):  # type: ignore[misc,valid-type]
        """XNNPACKPassManager.transform, asking PASS_NEEDS before each pass."""

        def transform(self) -> Any:
            counter: _Counter | None = getattr(_local, "counter", None)
            if counter is None:  # another thread's lowering, not ours: run everything
                return super().transform()
            ep = self.exported_program
            for pass_ in self.passes:
                needs = PASS_NEEDS.get(pass_.__name__)
                if needs is not None and not needs(ep.graph_module.graph):
                    counter.skipped.append(pass_.__name__)
                    continue
                counter.ran.append(pass_.__name__)
                instance = pass_(ep) if issubclass(pass_, XNNPACKPass) else pass_()
                if not isinstance(instance, (XNNPACKPass, ExportPass)):
                    raise RuntimeError(f"unexpected XNNPACK pass type {type(instance).__name__}")
                ep = transform(ep, instance)
            return ep

    return PrunedXNNPACKPassManager


@contextlib.contextmanager
def pruned_backend_passes(enabled: bool = True) -> Iterator[Callable[[], PassPruning]]:
    """Within the block, XNNPACK preprocess skips passes that cannot act (this thread only).

    Yields a function returning what ran and what was skipped (nothing is recorded when
    ``enabled`` is false: ExecuTorch's own manager runs every pass). The module attribute
    ExecuTorch's preprocess reads is swapped while any enabled block is open, and restored when
    the last one closes.
    """
    counter = _Counter()
    with contextlib.ExitStack() as swap:
        if enabled:  # the attribute ExecuTorch's preprocess reads, while any enabled block is open
            swap.enter_context(patched(xnnpack_preprocess_module(), "XNNPACKPassManager", _managed))
        outer, _local.counter = getattr(_local, "counter", None), counter if enabled else None
        try:
            yield counter.result
        finally:
            _local.counter = outer


def _managed(_: Any) -> type:
    return _pass_manager_class()

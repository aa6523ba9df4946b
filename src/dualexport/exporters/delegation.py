"""DelegationReport: the XNNPACK delegation table as a small frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..errors import DelegationError

__all__ = ["DelegationReport", "check_full_delegation", "STRUCTURAL_OPS", "is_compute_op"]

#: Rows of ExecuTorch's table that compute nothing: ``getitem`` unpacks a delegate call's (or a
#: multi-output op's) results, ``alloc`` is a planned buffer, ``sym_size``/``sym_numel``/
#: ``sym_stride`` read a dynamic size, and ``mul``/``add``/``sub``/``floordiv``/``mod``/``neg``
#: (Python operators, not ``aten_*`` rows) compute on sizes. (Placeholders and outputs are not
#: rows at all.)
STRUCTURAL_OPS = frozenset(
    {
        "getitem",
        "alloc",
        "sym_size",
        "aten_sym_size_int",
        "aten_sym_numel_default",
        "aten_sym_stride_int",
        "mul",
        "add",
        "sub",
        "floordiv",
        "mod",
        "neg",
    }
)


def is_compute_op(op: str) -> bool:
    """Whether a row of the delegation table is a compute op (what the delegated share counts)."""
    return op not in STRUCTURAL_OPS


@dataclass(frozen=True)
class DelegationReport:
    """Delegated subgraphs and node counts, and per op ``(delegated, non_delegated)``.

    ``delegated_nodes``, ``non_delegated_nodes`` and ``by_op`` are ExecuTorch's
    ``get_delegation_info`` table (the one quoted in the ExecuTorch PR behind this project: docs/design.md), every
    node listed. ``delegated_share`` counts compute ops only (:data:`STRUCTURAL_OPS` aside): a
    fully delegated model reads 100%, as ExecuTorch users read "1 subgraph, all compute ops
    delegated", not 86% because every delegate call needs a ``getitem``.
    """

    subgraphs: int
    delegated_nodes: int
    non_delegated_nodes: int
    by_op: Mapping[str, tuple[int, int]]

    @property
    def compute_delegated(self) -> int:
        """Compute ops inside XNNPACK delegates."""
        return sum(d for op, (d, _) in self.by_op.items() if is_compute_op(op))

    @property
    def compute_non_delegated(self) -> int:
        """Compute ops left to ExecuTorch's portable kernels."""
        return sum(n for op, (_, n) in self.by_op.items() if is_compute_op(op))

    @property
    def delegated_share(self) -> float:
        """Share of the compute ops that XNNPACK runs (1.0 when there are none)."""
        total = self.compute_delegated + self.compute_non_delegated
        return self.compute_delegated / total if total else 1.0

    @property
    def summary(self) -> str:
        """One line, as the CLI's table title and the notebook view say it."""
        return (
            f"{self.subgraphs} subgraph(s), {self.compute_delegated} of "
            f"{self.compute_delegated + self.compute_non_delegated} compute ops delegated "
            f"({100 * self.delegated_share:.0f}%)"
        )

    def non_delegated_ops(self) -> tuple[str, ...]:
        return tuple(op for op, (_, nd) in self.by_op.items() if nd)

    @classmethod
    def from_graph_module(cls, graph_module: Any) -> DelegationReport:
        from executorch.devtools.backend_debug import get_delegation_info

        info = get_delegation_info(graph_module)
        by_op = {op: (b.delegated, b.non_delegated) for op, b in sorted(info.delegation_by_operator.items())}
        return cls(
            info.num_delegated_subgraphs,
            info.num_delegated_nodes,
            info.num_non_delegated_nodes,
            MappingProxyType(by_op),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "subgraphs": self.subgraphs,
            "delegated_nodes": self.delegated_nodes,
            "non_delegated_nodes": self.non_delegated_nodes,
            "compute_delegated": self.compute_delegated,
            "compute_non_delegated": self.compute_non_delegated,
            "delegated_share": round(self.delegated_share, 4),
            "by_op": {op: {"delegated": d, "non_delegated": n} for op, (d, n) in self.by_op.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DelegationReport:
        by_op = {op: (int(v["delegated"]), int(v["non_delegated"])) for op, v in data["by_op"].items()}
        return cls(
            int(data["subgraphs"]),
            int(data["delegated_nodes"]),
            int(data["non_delegated_nodes"]),
            MappingProxyType(by_op),
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled through its dict form (a mappingproxy does not pickle): a forked lowering
        sends its report back to the parent."""
        return (DelegationReport.from_dict, (self.to_dict(),))

    def to_markdown(self) -> str:
        lines = [
            f"Total delegated subgraphs: {self.subgraphs}",
            f"Number of delegated nodes: {self.delegated_nodes}",
            f"Number of non-delegated nodes: {self.non_delegated_nodes}",
            f"Compute ops delegated: {self.summary} (getitem, alloc and size reads are not compute)",
            "",
            "| op_type | occurrences_in_delegated_graphs | occurrences_in_non_delegated_graphs |",
            "|---|---:|---:|",
        ]
        lines += [f"| {op} | {d} | {n} |" for op, (d, n) in self.by_op.items()]
        return "\n".join(lines) + "\n"


def check_full_delegation(report: DelegationReport | None, program: Any = None) -> None:
    """For ``require_full_delegation=True``: raise DelegationError naming every op XNNPACK left
    to the portable runtime (and, from ``program``, the node and model line of the first one)."""
    if report is None:
        return
    missing = [op for op, (_, nd) in report.by_op.items() if nd and is_compute_op(op)]
    if not missing:
        return
    from ..shared_state.nodes import describe_node, op_name

    first: Any = None
    dotted: dict[str, str] = {}
    if program is not None:
        for n in program.graph.nodes:
            key = op_name(n).replace(".", "_") if n.op == "call_function" else None
            if key in missing:
                dotted.setdefault(key, op_name(n))
                first = first if first is not None else n
    names = [dotted.get(op, op) for op in missing]
    counts = ", ".join(f"{dotted.get(op, op)} x{report.by_op[op][1]}" for op in missing)
    raise DelegationError(
        f"require_full_delegation: {len(missing)} op(s) were not delegated to XNNPACK: {counts}"
        + (f"; the first at {describe_node(first)}" if first is not None else ""),
        ops=names,
        hint="replace those ops in the model with ones XNNPACK supports, or pass "
        "require_full_delegation=False to accept portable kernels for them",
    )

"""DelegationReport: the XNNPACK delegation table as a small frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..errors import DelegationError

__all__ = ["DelegationReport", "check_full_delegation"]


@dataclass(frozen=True)
class DelegationReport:
    """Delegated subgraphs and node counts, and per op ``(delegated, non_delegated)``.

    The same numbers as ExecuTorch's ``get_delegation_info`` table (the one quoted in the
    ExecuTorch PR behind DESIGN.md), kept as data so tests and benchmarks can assert on them.
    """

    subgraphs: int
    delegated_nodes: int
    non_delegated_nodes: int
    by_op: Mapping[str, tuple[int, int]]

    @property
    def delegated_share(self) -> float:
        total = self.delegated_nodes + self.non_delegated_nodes
        return self.delegated_nodes / total if total else 1.0

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
    missing = [op for op, (_, nd) in report.by_op.items() if nd and op not in ("getitem", "alloc")]
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

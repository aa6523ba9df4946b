"""The delegated share counts compute ops (issue 20): a fully delegated model reads 100%, not 86%
because each delegate call needs a ``getitem``; the table still lists every node."""

from __future__ import annotations

from types import MappingProxyType

import pytest

import dualexport as dx
from dualexport.exporters.delegation import check_full_delegation


def _report(by_op: dict[str, tuple[int, int]], subgraphs: int = 1) -> dx.DelegationReport:
    delegated = sum(d for d, _ in by_op.values())
    return dx.DelegationReport(
        subgraphs, delegated, sum(n for _, n in by_op.values()), MappingProxyType(by_op)
    )


# TinyConvNet's table (README, `make demo`): every compute op delegated, one getitem outside
TINY_CONV = {
    "aten__native_batch_norm_legit_no_training_default": (2, 0),
    "aten_convolution_default": (3, 0),
    "aten_linear_default": (1, 0),
    "aten_mean_dim": (1, 0),
    "aten_relu_default": (3, 0),
    "aten_view_copy_default": (1, 0),
    "getitem": (2, 1),
}


def test_a_fully_delegated_model_reads_100_percent() -> None:
    d = _report(TINY_CONV)
    assert (d.delegated_nodes, d.non_delegated_nodes) == (13, 1)  # ExecuTorch's own counts, kept
    assert (d.compute_delegated, d.compute_non_delegated) == (11, 0)
    assert d.delegated_share == 1.0
    assert d.summary == "1 subgraph(s), 11 of 11 compute ops delegated (100%)"
    assert "| getitem | 2 | 1 |" in d.to_markdown()  # the table still lists every op


def test_structural_nodes_do_not_count_and_portable_compute_does() -> None:
    d = _report(
        {
            "aten_linear_default": (3, 0),
            "aten_where_self": (0, 1),
            "aten_sym_size_int": (0, 2),
            "alloc": (0, 4),
            "getitem": (1, 3),
        },
        subgraphs=2,
    )
    assert (d.compute_delegated, d.compute_non_delegated) == (3, 1)
    assert d.delegated_share == pytest.approx(0.75)
    assert dx.DelegationReport.from_dict(d.to_dict()) == d
    assert d.to_dict()["compute_non_delegated"] == 1
    with pytest.raises(dx.DelegationError, match="1 op\\(s\\) were not delegated.*aten_where_self x1"):
        check_full_delegation(d)


def test_only_structural_nodes_outside_is_full_delegation() -> None:
    check_full_delegation(
        _report({"aten_add_tensor": (1, 0), "getitem": (0, 1), "aten_sym_size_int": (0, 1)})
    )

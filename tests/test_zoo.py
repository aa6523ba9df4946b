"""The model zoo on both targets: one ``dx.export`` per case, then per target a chain of stages
(export without error, structural check, weights from disk, parity on every input set).

Each (case, target) is its own test so that an expected failure is marked per target, strictly:
when a library or dualexport fix makes an xfail pass, the test fails and the catalogue must be
updated (and docs/coverage.md regenerated).
"""

from __future__ import annotations

import pathlib

import pytest

from zoo import TARGETS, ZOO, Case
from zoo.coverage import STABLE_COLUMNS as _STABLE
from zoo.testing import case_params, case_run, check_target


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.mark.parametrize(("case", "target"), case_params(ZOO))
def test_zoo_case(case: Case, target: str, zoo_dir: pathlib.Path) -> None:
    check_target(case_run(case, zoo_dir), target)


def test_catalogue_is_well_formed() -> None:
    """Names are unique and file-safe, every xfail names its cause, dynamic cases test ranges."""
    names = [c.name for c in ZOO]
    assert len(names) == len(set(names))
    for c in ZOO:
        assert c.name.isidentifier(), c.name
        assert set(c.xfail) <= set(TARGETS), c.name
        for target, reason in c.xfail.items():
            assert len(reason) > 30, (c.name, target, reason)
        if c.dynamic_shapes is not None:
            # min, a middle value and max of each declared dim, beyond the example.
            assert len(c.all_input_sets()) >= 3, c.name
    assert sum(c.dynamic_shapes is not None for c in ZOO) >= 2


COVERAGE_MD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "coverage.md"


def _committed_rows() -> dict[tuple[str, str], dict[str, str]]:
    from zoo.coverage import parse

    return {(r.cells["case"], r.cells["target"]): dict(r.cells) for r in parse(COVERAGE_MD.read_text())}


def test_coverage_table_lists_the_catalogue() -> None:
    """docs/coverage.md has exactly one row per (case, target) of the zoo, the HF and the vision
    catalogues, with the status the catalogue expects and the subgraph count it declares."""
    from zoo.hf import HF_CASES
    from zoo.vision import VISION_CASES

    rows = _committed_rows()
    cases = ZOO + HF_CASES + VISION_CASES
    assert set(rows) == {(c.name, t) for c in cases for t in TARGETS}
    for c in cases:
        for t in TARGETS:
            row = rows[(c.name, t)]
            assert (row["group"], row["status"]) == (c.group, c.expected(t)), (c.name, t, row)
            if t == "xnnpack" and row["status"] == "pass" and c.xnnpack_subgraphs is not None:
                assert row["XNNPACK subgraphs"] == str(c.xnnpack_subgraphs), (c.name, row)


def test_coverage_table_matches_a_fresh_zoo_run(zoo_dir: pathlib.Path) -> None:
    """The stable columns (status, delegated/total nodes, subgraphs) of every zoo row are what
    this session's run produced; timing and error magnitudes are left out as noise."""
    from zoo.coverage import rows_for

    rows = _committed_rows()
    for case in (c for c in ZOO if not c.slow):  # the slow ones: scripts/gen_coverage.py --check
        for fresh in rows_for(case_run(case, zoo_dir)):
            committed = rows[(case.name, fresh.cells["target"])]
            assert fresh.stable() == tuple(committed[c] for c in _STABLE), (
                f"{case.name}/{fresh.cells['target']}: docs/coverage.md says "
                f"{[committed[c] for c in _STABLE]}, this run {list(fresh.stable())}; "
                "regenerate with scripts/gen_coverage.py --hf --vision"
            )


def test_input_above_a_dynamic_max_is_an_input_error(zoo_dir: pathlib.Path) -> None:
    """The mlp case declares batch in 2..8; batch 9 must be refused as bad input, clearly."""
    import torch

    import dualexport as dx

    run = case_run(next(c for c in ZOO if c.name == "mlp"), zoo_dir)
    with pytest.raises(dx.InputError, match=r"dim 0 is 9, outside the exported range \[2, 8\]"):
        dx.compare(run.result, inputs=[(torch.randn(9, 16),)])
    with pytest.raises(dx.InputError, match=r"is 1, outside the exported range \[2, 8\]"):
        dx.compare(run.result, inputs=[(torch.randn(1, 16),)])  # below the min: runtimes accept it

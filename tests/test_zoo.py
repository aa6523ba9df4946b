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

"""Common torchvision classifiers (random weights, realistic activations) on both targets,
through the same stages as the zoo, with ``make test-slow`` (the default run has the zoo's CNNs
and the Hugging Face ResNet)."""

from __future__ import annotations

import pathlib
import statistics

import pytest
import torch

from zoo import Case
from zoo.testing import case_params, case_run, check_target
from zoo.vision import VISION_CASES


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("vision")


@pytest.mark.parametrize(("case", "target"), case_params(VISION_CASES))
def test_vision_model(case: Case, target: str, vision_dir: pathlib.Path) -> None:
    run = case_run(case, vision_dir)
    check_target(run, target)
    # not vacuous: unit-variance logits that differ between inputs
    args, _ = case.inputs()
    ref = run.result.program.run_eager(*args)
    assert float(ref.std()) > 0.3, float(ref.std())


def test_catalogue_covers_the_issue_set() -> None:
    names = {c.name.removeprefix("tv_") for c in VISION_CASES}
    wanted = {
        "mobilenet_v2",
        "mobilenet_v3_small",
        "mobilenet_v3_large",
        "resnet18",
        "efficientnet_b0",
        "shufflenet_v2_x1_0",
        "regnet_y_400mf",
        "swin_t",
        "convnext_tiny",
        "vit_b_16",
    }
    assert wanted <= names


@pytest.mark.slow
def test_median_delegated_share_is_at_least_95_percent(vision_dir: pathlib.Path) -> None:
    """The default export delegates at least 95% of nodes to XNNPACK on the median classifier."""
    shares = {}
    for case in VISION_CASES:
        d = case_run(case, vision_dir).result.artifacts["xnnpack"].delegation
        shares[case.name] = d.delegated_share
    assert statistics.median(shares.values()) >= 0.95, shares
    assert torch.__version__.startswith("2.13")


@pytest.mark.slow
def test_coverage_table_matches_a_fresh_vision_run(vision_dir: pathlib.Path) -> None:
    """The vision rows of docs/coverage.md (status, delegated/total nodes, subgraphs) are what
    this session's run produced."""
    from zoo.coverage import STABLE_COLUMNS, parse, rows_for

    md = pathlib.Path(__file__).resolve().parents[1] / "docs" / "coverage.md"
    rows = {(r.cells["case"], r.cells["target"]): r.stable() for r in parse(md.read_text())}
    for case in VISION_CASES:
        for fresh in rows_for(case_run(case, vision_dir)):
            key = (case.name, fresh.cells["target"])
            assert rows.get(key) == fresh.stable(), (
                f"{key}: docs/coverage.md {rows.get(key)}, this run {fresh.stable()} "
                f"(columns {STABLE_COLUMNS}); regenerate with scripts/gen_coverage.py --hf --vision"
            )

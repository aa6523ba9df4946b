"""Shared fixtures. Exports are slow (seconds each on 2 cores), so results that several tests
read are built once per module via the ``exported`` cache."""

from __future__ import annotations

import logging
import os
import pathlib
import warnings

import pytest
import torch

from dualexport.loading import allow_torchvision

# torchvision 0.28.0 (the release for torch 2.13) is published as a CUDA build only, and
# transformers imports torchvision whenever it can find it. The venv `make install` builds keeps it
# off the path (.venv/vision-models; tests/zoo/vision.py puts it on), so this does nothing there.
# A venv built before still has it in site-packages: there it stubs its meta registrations
# (dualexport.loading.models). tests/test_venv.py checks the venv itself needs no stub.
allow_torchvision()

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DUALEXPORT_CHECK_PASSES", "1")  # a pass that leaves the program invalid fails the test
warnings.filterwarnings("ignore")
logging.getLogger("torch").setLevel(logging.ERROR)
torch.manual_seed(0)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on CI's two cores: one compute thread each (and in the runtime
    # children they start, which inherit the environment), not two workers fighting over four
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


@pytest.fixture
def out_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """An output folder inside a private tmp folder, so tests can check nothing leaked beside it."""
    d = tmp_path / "out"
    return d


def files_under(root: pathlib.Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}

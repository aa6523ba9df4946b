"""Shared fixtures. Exports are slow (seconds each on 2 cores), so results that several tests
read are built once per module via the ``exported`` cache."""

from __future__ import annotations

import logging
import os
import pathlib
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")
logging.getLogger("torch").setLevel(logging.ERROR)
torch.manual_seed(0)


@pytest.fixture
def out_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """An output folder inside a private tmp folder, so tests can check nothing leaked beside it."""
    d = tmp_path / "out"
    return d


def files_under(root: pathlib.Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}

"""Shared fixtures. Exports are slow (seconds each on 2 cores), so results that several tests
read are built once per module via the ``exported`` cache."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import types
import warnings

import pytest
import torch

# torchvision 0.28.0 (the release for torch 2.13) is published as a CUDA build only: its compiled
# ops do not load against the CPU torch, and ``import torchvision`` fails in its meta
# registrations ("operator torchvision::nms does not exist"), which breaks transformers too (it
# imports torchvision when present). The model definitions are pure Python and need none of it.
sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

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

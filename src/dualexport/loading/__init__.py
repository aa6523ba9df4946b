"""Models and example inputs from text: the CLI's and the batch manifest's one grammar."""

from __future__ import annotations

from .calibration import load_calibration, random_calibration
from .inputs import (
    DynamicDim,
    InputSpec,
    build_dynamic_shapes,
    make_input,
    parse_dynamic,
    parse_input,
    parse_input_spec,
)
from .models import (
    HFWrapper,
    allow_torchvision,
    hf_model,
    load_callable,
    load_model,
    load_object,
    outputs_constant,
    settle_batchnorm,
    vision_models_dir,
)
from .programs import is_program_ref, load_program

__all__ = [
    # models
    "load_model",
    "load_object",
    "load_callable",
    "hf_model",
    "HFWrapper",
    "settle_batchnorm",
    "outputs_constant",
    "allow_torchvision",
    "vision_models_dir",
    # programs (.pt2)
    "load_program",
    "is_program_ref",
    # calibration data
    "load_calibration",
    "random_calibration",
    # inputs
    "InputSpec",
    "DynamicDim",
    "parse_input",
    "parse_input_spec",
    "make_input",
    "parse_dynamic",
    "build_dynamic_shapes",
]

"""Generative decoders on both targets from one trace (issue 19): ``export_llm`` exports a
decoder's cache-aware program, ``generate`` runs either file greedily, ``generation_parity``
proves the files generate what the model does.

The cache travels as explicit inputs and outputs: each layer's keys and values in (their first
``P`` slots, ``P`` the position rounded up, for the rows program), and out either the
new rows (``new_k``/``new_v``, which ``generate`` writes at their positions: the default) or the
whole updated cache (``present_k``/``present_v``, for decoders the rows program does not serve);
the layout is recorded in each file (``layout.py``).
"""

from __future__ import annotations

from .export import export_llm
from .layout import LlmLayout, read_layout
from .loading import load_decoder
from .parity import GenerationReport, StepTolerance, generation_parity
from .session import DecoderSession, Generation, SequenceTooLongError, generate

__all__ = [
    "export_llm",
    "generate",
    "DecoderSession",
    "Generation",
    "LlmLayout",
    "read_layout",
    "load_decoder",
    "SequenceTooLongError",
    "generation_parity",
    "GenerationReport",
    "StepTolerance",
]

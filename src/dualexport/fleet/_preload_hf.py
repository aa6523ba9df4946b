"""Imported by the fork server when an entry is a Hugging Face model: transformers (with the
torchvision stub in place first, see ``dualexport.loading.models``)."""

from __future__ import annotations

from ..loading import allow_torchvision

allow_torchvision()

import transformers  # noqa: E402, F401

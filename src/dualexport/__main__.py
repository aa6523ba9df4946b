"""``python -m dualexport`` runs the CLI."""

from __future__ import annotations

from .cli import run

run()

"""The venv ``make install`` builds is one a user can work in (issue 20): a fresh interpreter
imports transformers' models with nothing stubbed (``make install`` itself ends with the same
import and ``pip check``).

Why a fresh interpreter: tests/conftest.py runs before every test and a stub put in place there
(or by ``dualexport.loading``) would hide exactly what a user's first line meets. ``-I`` also
drops PYTHONPATH, the user site and the current folder: what ``.venv/bin/python`` does on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys

_IMPORT = """
import sys
from transformers import BertModel, LlamaModel
print("stubbed" if "torchvision._meta_registrations" in sys.modules else "clean")
"""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600)


def test_transformers_models_import_in_a_fresh_interpreter() -> None:
    run = _run("-I", "-c", _IMPORT)
    hint = ""
    where = _run(
        "-I", "-c", "import importlib.util as u; s = u.find_spec('torchvision'); print(s and s.origin)"
    )
    if where.stdout.strip() not in ("", "None"):
        hint = (
            f"\ntorchvision is importable from {where.stdout.strip()}: its CUDA-only build breaks "
            "transformers; `make install` keeps it in .venv/vision-models instead (rebuild the venv)"
        )
    assert run.returncode == 0, run.stderr[-3000:] + hint
    assert run.stdout.strip().splitlines()[-1] == "clean"

"""Deploy folders (issue 50): from the one shared program of ``export_llm``, the .pte that
ExecuTorch's LLM runner loads, the .onnx and ``genai_config.json`` that onnxruntime-genai loads,
and the tokenizer beside them, each proven by generation walks before it is published; and the
runtimes' own runners driven from Python (``runners.py``: what ``dualexport generate`` uses)."""

from __future__ import annotations

from .folder import CACHE_FOLDER, DeployFolder, write_deploy_folder

__all__ = ["DeployFolder", "write_deploy_folder", "CACHE_FOLDER"]

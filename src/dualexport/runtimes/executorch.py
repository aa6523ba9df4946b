"""Run a .pte artifact from disk in the ExecuTorch runtime (XNNPACK delegate registered)."""

from __future__ import annotations

import pathlib

import torch

from ..errors import RuntimeExecutionError, RuntimeLoadError

__all__ = ["ExecuTorchRunner"]


class ExecuTorchRunner:
    name = "xnnpack"

    def __init__(self, path: pathlib.Path, method: str = "forward") -> None:
        from executorch.runtime import Runtime

        try:
            self.program = Runtime.get().load_program(str(path))
            self.method = self.program.load_method(method)
        except Exception as exc:
            raise RuntimeLoadError(
                f"ExecuTorch could not load {path.name} (method {method!r}): {exc}",
                target="xnnpack",
                hint="a non-delegated op may have no kernel in this runtime build, or the file is "
                "truncated; re-export, or check the delegation report for non-delegated ops",
            ) from exc

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            outs = self.method.execute([t.detach().contiguous() for t in inputs])
        except Exception as exc:
            raise RuntimeExecutionError(
                f"ExecuTorch failed to run: {exc}", target="xnnpack",
                hint="check input shapes and dtypes against the exported program",
            ) from exc
        return [o.clone() if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs]

"""Run a .pte artifact from disk in the ExecuTorch runtime (XNNPACK delegate registered)."""

from __future__ import annotations

import pathlib

import torch

from ..errors import InputError, RuntimeExecutionError, RuntimeLoadError
from ..shared_state.contract import RANGES_METHOD, decode_input_ranges

__all__ = ["ExecuTorchRunner"]


class ExecuTorchRunner:
    name = "xnnpack"

    def __init__(self, path: pathlib.Path, method: str = "forward") -> None:
        from executorch.runtime import Runtime

        try:
            self.program = Runtime.get().load_program(str(path))
            self.method = self.program.load_method(method)
            self.ranges: list[list[tuple[int, int | None]]] | None = None
            if RANGES_METHOD in set(self.program.method_names):
                encoded = self.program.load_method(RANGES_METHOD).execute([])
                self.ranges = decode_input_ranges([int(v) for v in encoded])
        except Exception as exc:
            raise RuntimeLoadError(
                f"ExecuTorch could not load {path.name} (method {method!r}): {exc}",
                target="xnnpack",
                hint="a non-delegated op may have no kernel in this runtime build, or the file is "
                "truncated; re-export, or check the delegation report for non-delegated ops",
            ) from exc

    def planned_sizes(self) -> list[list[int]] | None:
        """Per input, the sizes its memory plan holds (the largest the file accepts), or None
        where the runtime does not say."""
        out = []
        meta = self.method.metadata
        try:
            for i in range(meta.num_inputs()):
                out.append([int(s) for s in meta.input_tensor_meta(i).sizes()])
        except Exception:  # a non-tensor input, or metadata API differences
            return None
        return out

    def _check_upper_bounds(self, inputs: list[torch.Tensor]) -> None:
        """ExecuTorch memory-plans each input at its exported maximum and refuses anything larger
        with a bare error code, and runs inputs below the minimum; check both against the ranges
        the exporter stored in the program, naming the dim."""
        if self.ranges is not None:
            for i, (dims, t) in enumerate(zip(self.ranges, inputs, strict=False)):
                for d, ((lo, hi), actual) in enumerate(zip(dims, t.shape, strict=False)):
                    if actual < lo or (hi is not None and actual > hi):
                        raise InputError(
                            f"input {i} dim {d} is {actual}, outside the exported range "
                            f"[{lo}, {hi if hi is not None else 'inf'}]",
                            target="xnnpack",
                            hint="re-export with a wider Dim(min=..., max=...) or pass inputs inside the range",
                        )

        meta = self.method.metadata
        for i, t in enumerate(inputs):
            try:
                sizes = list(meta.input_tensor_meta(i).sizes())
            except Exception:  # metadata API differences: leave the check to the runtime
                return
            for d, (cap, actual) in enumerate(zip(sizes, t.shape, strict=False)):
                if actual > cap:
                    raise InputError(
                        f"input {i} dim {d} is {actual}, above the exported maximum {cap}",
                        target="xnnpack",
                        hint="re-export with a larger Dim(max=...) or pass a smaller input",
                    )

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        self._check_upper_bounds(inputs)
        try:
            outs = self.method.execute([t.detach().contiguous() for t in inputs])
        except Exception as exc:
            raise RuntimeExecutionError(
                f"ExecuTorch failed to run: {exc}",
                target="xnnpack",
                hint="check input shapes and dtypes against the exported program",
            ) from exc
        return [o.clone() if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs]

"""Run an ONNX artifact from disk in ONNX Runtime (CPU)."""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from ..errors import RuntimeExecutionError, RuntimeLoadError

__all__ = ["OrtRunner"]


class OrtRunner:
    """ONNX Runtime session over ``path``, with the full graph optimizations (it fuses Conv+BN
    at load time, which is why the exported file keeps weights unfused)."""

    name = "onnx"

    def __init__(self, path: pathlib.Path, *, intra_op_threads: int | None = None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise RuntimeLoadError(
                f"ONNX Runtime could not load {path.name}: {exc}",
                target="onnx",
                hint="check that the .onnx and its .onnx.data sit in the same folder and are complete",
            ) from exc
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(inputs) != len(self.input_names):
            raise RuntimeExecutionError(
                f"the ONNX model takes {len(self.input_names)} inputs {self.input_names}, got {len(inputs)}",
                target="onnx",
            )
        feed = {n: np.ascontiguousarray(t.detach().cpu().numpy()) for n, t in zip(self.input_names, inputs)}
        try:
            outs = self.session.run(None, feed)
        except Exception as exc:
            raise RuntimeExecutionError(
                f"ONNX Runtime failed to run: {exc}", target="onnx",
                hint="check input shapes against the exported dynamic_shapes ranges",
            ) from exc
        return [torch.from_numpy(np.asarray(o)) for o in outs]

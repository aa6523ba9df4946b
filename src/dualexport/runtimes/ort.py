"""Run an ONNX artifact from disk in ONNX Runtime (CPU)."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import numpy as np
import torch

from ..errors import RuntimeExecutionError, RuntimeLoadError
from ..shared_state.contract import RANGES_METADATA, check_against_specs

#: ONNX metadata key: session config entries (a JSON object) the file was proven with
#: (written by ``exporters/onnx_quant.py``; the same string, runtimes do not import exporters).
SESSION_CONFIG_KEY = "dualexport.ort_session_config"
#: ONNX Runtime's session config entry for MatMulNBits' accuracy level (as exporters.onnx_quant's).
ACCURACY_LEVEL_ENTRY = "session.qdq_matmulnbits_accuracy_level"

__all__ = ["OrtRunner"]


def _load_error(path: pathlib.Path, exc: BaseException) -> RuntimeLoadError:
    """A load failure that names its cause: an op ONNX Runtime has no kernel for (its message
    names the op and node) is not a damaged file."""
    text = str(exc)
    missing = re.search(r"implementation for (\w+)\((\d+)\) node with name '([^']*)'", text)
    if missing:
        op, version, node = missing.groups()
        return RuntimeLoadError(
            f"ONNX Runtime has no CPU kernel for {op} (opset {version}) at node '{node}' of {path.name} "
            "with the input types the file gives it",
            target="onnx",
            hint="cast the model and its inputs to float32 (bfloat16 and some float16 ops have no CPU "
            "kernels), or export target='xnnpack' alone",
        )
    return RuntimeLoadError(
        f"ONNX Runtime could not load {path.name}: {text}",
        target="onnx",
        hint="check that the .onnx and its .onnx.data sit in the same folder and are complete",
    )


def _prepacking_changes_numerics(config: dict[str, Any]) -> bool:
    """MatMulNBits above accuracy level 0 runs its int8 kernel only on prepacked weights; without
    prepacking it computes in float (measured: 40.8 dB apart on a 2-layer int4 Llama), so a proof
    run without it would prove other numerics than every user's session runs."""
    return str(config.get(ACCURACY_LEVEL_ENTRY, "0")) not in ("0", "")


class OrtRunner:
    """ONNX Runtime session over ``path``, with the full graph optimizations (it fuses Conv+BN
    at load time, which is why the exported file keeps weights unfused)."""

    name = "onnx"

    def __init__(
        self, path: pathlib.Path, *, intra_op_threads: int | None = None, lean: bool = False
    ) -> None:
        import onnxruntime as ort

        def options(prepack: bool) -> Any:
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if not prepack:
                # The export's smoke run only proves the file loads and runs: no weight prepacking
                # (a second copy of every GEMM weight), so it does not set the export's memory peak.
                opts.add_session_config_entry("session.disable_prepacking", "1")
            opts.log_severity_level = 3
            if intra_op_threads:
                opts.intra_op_num_threads = intra_op_threads
            return opts

        import json

        opts = options(prepack=not lean)
        self.session = self._load(ort, path, opts)
        meta = self.session.get_modelmeta().custom_metadata_map
        config = json.loads(meta.get(SESSION_CONFIG_KEY, "{}"))
        if config:
            # Session entries the file was proven with (a quantized file's MatMulNBits accuracy
            # level): known only once the file is read, so the session is made again with them.
            if lean and _prepacking_changes_numerics(config):
                opts = options(prepack=True)
            for key, value in config.items():
                opts.add_session_config_entry(str(key), str(value))
            self.session = self._load(ort, path, opts)
        self.session_config: dict[str, str] = {str(k): str(v) for k, v in config.items()}
        # Explicit state (mutated buffers), written by the exporter: fed back between calls.
        self.state_spec = json.loads(meta.get("dualexport.state", "[]"))
        self.state: dict[str, np.ndarray] = {}
        state_inputs = {s["input"] for s in self.state_spec}
        self.state_outputs = {s["output"]: s["input"] for s in self.state_spec}
        self.all_inputs = [i.name for i in self.session.get_inputs()]
        self.input_names = [n for n in self.all_inputs if n not in state_inputs]
        self.output_names = [o.name for o in self.session.get_outputs()]
        ranges = meta.get(RANGES_METADATA)
        self.input_specs = json.loads(ranges) if ranges else None

    @staticmethod
    def _load(ort: Any, path: pathlib.Path, opts: Any) -> Any:
        try:
            return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise _load_error(path, exc) from exc

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(inputs) != len(self.input_names):
            raise RuntimeExecutionError(
                f"the ONNX model takes {len(self.input_names)} inputs {self.input_names}, got {len(inputs)}",
                target="onnx",
            )
        if self.input_specs is not None:
            check_against_specs(self.input_specs, inputs, "onnx")
        feed = {
            n: np.ascontiguousarray(t.detach().cpu().numpy())
            for n, t in zip(self.input_names, inputs, strict=True)
        }
        feed.update(self.state)  # absent on the first call: the initializer default is used
        try:
            outs = self.session.run(None, feed)
        except Exception as exc:
            raise RuntimeExecutionError(
                f"ONNX Runtime failed to run: {exc}",
                target="onnx",
                hint="check input shapes against the exported dynamic_shapes ranges",
            ) from exc
        user = []
        for name, o in zip(self.output_names, outs, strict=True):
            if name in self.state_outputs:
                self.state[self.state_outputs[name]] = np.asarray(o)
            else:
                user.append(torch.from_numpy(np.asarray(o)))
        return user

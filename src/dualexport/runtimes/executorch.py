"""Run a .pte artifact from disk in the ExecuTorch runtime (XNNPACK delegate registered)."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import torch

from ..compat.executorch import load_for_executorch, load_llm_ops
from ..errors import InputError, RuntimeExecutionError, RuntimeLoadError
from ..outputs.paths import safe_child
from ..shared_state.contract import DATA_FILE_METHOD, DATA_SUFFIX, RANGES_METHOD, decode_input_ranges

__all__ = ["ExecuTorchRunner", "LLM_OPS_METHOD", "uses_llm_ops"]


#: The constant method an LLM runner .pte answers True when it calls ExecuTorch's LLM custom ops
#: (``llama::update_cache``, ``llama::custom_sdpa``), whose kernels are then loaded first.
LLM_OPS_METHOD = "use_sdpa_with_kv_cache"


def uses_llm_ops(path: pathlib.Path) -> bool:
    """Whether the .pte at ``path`` says it calls ExecuTorch's LLM custom ops."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(path))
    return LLM_OPS_METHOD in set(program.method_names) and _constant(program, LLM_OPS_METHOD) == [1]


def _constant(program: Any, method: str) -> list[int]:
    return [int(v) for v in program.load_method(method).execute([])]


#: ExecuTorch's runtime error codes (runtime/core/error.h) a failed method reports
_ERROR_CODES = {
    0x01: "Internal",
    0x02: "InvalidState",
    0x10: "NotSupported",
    0x11: "NotImplemented",
    0x12: "InvalidArgument",
    0x13: "InvalidType",
    0x14: "OperatorMissing",
    0x20: "NotFound",
    0x21: "MemoryAllocationFailed",
    0x22: "AccessFailed",
    0x23: "InvalidProgram",
    0x30: "DelegateInvalidCompatibility",
    0x31: "DelegateMemoryAllocationFailed",
    0x32: "DelegateInvalidHandle",
}


def portable_operators(path: pathlib.Path) -> list[str]:
    """The ops a .pte runs outside its delegates (the execution plans' operator table): where
    a run error that is not the input's comes from, since the delegate's ops were checked when
    it was lowered."""
    from ..compat.executorch import deserialize_pte

    try:
        program = deserialize_pte(memoryview(path.read_bytes()))
        names = {
            f"{op.name}.{op.overload}" if op.overload else op.name
            for plan in program.program.execution_plan
            for op in plan.operators
        }
    except Exception:  # a file the runtime loaded but the serializer cannot read: say nothing
        return []
    return sorted(names)


def _run_error(path: pathlib.Path, exc: BaseException) -> RuntimeExecutionError:
    """A method failure named by its error code and the ops outside the delegate."""
    text = str(exc)
    code = re.search(r"0x([0-9a-fA-F]+)", text)
    label = _ERROR_CODES.get(int(code.group(1), 16)) if code else None
    ops = portable_operators(path)
    outside = f"; the ops it runs outside the XNNPACK delegate: {', '.join(ops[:12])}" if ops else ""
    if len(ops) > 12:
        outside += f" (+{len(ops) - 12} more)"
    return RuntimeExecutionError(
        f"ExecuTorch failed to run {path.name}: {text}" + (f" ({label})" if label else "") + outside,
        target="xnnpack",
        hint="an op outside the delegate has no portable kernel for these dtypes or shapes: replace "
        "it in the model or export target='onnx' alone; if the inputs differ from the example's, "
        "check their shapes and dtypes against the exported ranges",
    )


class ExecuTorchRunner:
    """A .pte (and its ``.ptd`` when the program keeps its weights there) loaded in ExecuTorch's
    runtime. The program is read first with ``executorch.runtime`` (methods are loaded on demand,
    so reading the ranges and the data-file flag never touches the delegate); the forward method
    is then loaded with the weights file when there is one (``portable_lib._load_for_executorch``
    with ``data_path``: ``executorch.runtime`` takes no data file in 1.4.1)."""

    name = "xnnpack"

    def __init__(self, path: pathlib.Path, method: str = "forward") -> None:
        from executorch.runtime import Runtime

        path = pathlib.Path(path)
        self.path = path
        self.data_path = path.with_suffix(DATA_SUFFIX)
        self._method_name = method
        try:
            program = Runtime.get().load_program(str(path))
            names = set(program.method_names)
            self.ranges: list[list[tuple[int, int | None]]] | None = (
                decode_input_ranges(_constant(program, RANGES_METHOD)) if RANGES_METHOD in names else None
            )
            external = DATA_FILE_METHOD in names and _constant(program, DATA_FILE_METHOD) == [1]
            if LLM_OPS_METHOD in names and _constant(program, LLM_OPS_METHOD) == [1]:
                load_llm_ops()  # the kernels of the program's llama:: ops
        except Exception as exc:
            raise RuntimeLoadError(
                f"ExecuTorch could not load {path.name}: {exc}",
                target="xnnpack",
                hint="the file is truncated or not a .pte; re-export",
            ) from exc
        if external:
            # The data file is read like ONNX external data: a plain file of the program's own
            # folder, never a symlink that leaves it.
            safe_child(path.parent, self.data_path.name, what=f"the data file of {path.name}")
        if external and not self.data_path.is_file():
            # ExecuTorch 1.4.1 dereferences the missing data map and crashes the process.
            raise RuntimeLoadError(
                f"{path.name} keeps its weights in {self.data_path.name}, which is missing",
                target="xnnpack",
                hint=f"put {self.data_path.name} beside {path.name} (they ship together)",
            )
        try:
            if external:
                module = load_for_executorch(str(path), str(self.data_path))
                # run_method clones its outputs out of the planned memory (clone_outputs=True)
                self._run = lambda inputs: module.run_method(method, inputs, clone_outputs=True)
                self._meta = module.method_meta(method)
            else:
                loaded = program.load_method(method)
                self._run = loaded.execute
                self._meta = loaded.metadata
            self.external = external
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
        meta = self._meta
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

        meta = self._meta
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
            outs = self._run([t.detach().contiguous() for t in inputs])
        except Exception as exc:
            raise _run_error(self.path, exc) from exc
        # Method.execute's outputs alias the method's planned memory, which the next run
        # overwrites; run_method's are clones already (a decoder's cache: 23.6 MB a step on
        # SmolLM2-135M's shape, not copied twice).
        owned = self.external
        return [
            (o if owned else o.clone()) if isinstance(o, torch.Tensor) else torch.as_tensor(o) for o in outs
        ]

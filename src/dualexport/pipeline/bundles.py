"""Self-test bundles: each artifact with test inputs and eager's outputs, for the device to prove
it computes what eager computed.

Why: parity is proven on the export machine; the device runs other kernels. ExecuTorch's
BundledProgram (``<name>.bpte``: the program plus test cases, checked by the runtime's bundled-IO
API) and ONNX's test data sets (``<name>_onnx_tests/test_data_set_N/input_K.pb`` and
``output_K.pb``, serialized TensorProtos, with the model beside them: the layout ONNX Runtime's
``onnx_test_runner`` reads) carry the inputs (the example and generated sets) and eager's outputs.
``dualexport selftest DIR`` runs both from disk (parity/selftest.py).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import InputError
from ..parity.inputs import generate_input_sets
from ..parity.judge import output_tolerance
from ..runtimes.eager import EagerRunner
from ..shared_state import SharedProgram
from ..shared_state.contract import is_stateful
from .outcome import Published

__all__ = ["write_bundles", "ONNX_TESTS_SUFFIX", "BPTE_SUFFIX", "bundle_sets", "check_bundleable"]

BPTE_SUFFIX = ".bpte"
ONNX_TESTS_SUFFIX = "_onnx_tests"


def check_bundleable(shared: SharedProgram) -> None:
    """Refused before any lowering: a stateful program's bundled cases would depend on the order
    the device runs them in."""
    if is_stateful(shared.exported_program):
        raise InputError(
            "bundle=True needs a stateless program: each bundled test case runs from a fresh state "
            "in ONNX Runtime but not in ExecuTorch's bundled-IO runner",
            hint="export without bundle=True; check the stateful model with dx.compare(res, steps=N)",
        )


def bundle_sets(
    shared: SharedProgram, example: list[torch.Tensor], generate: int = 2
) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor]]]:
    """(label, flat inputs, eager's flat outputs): the example and ``generate`` random seeds."""
    program = shared.exported_program
    check_bundleable(shared)
    eager = EagerRunner(program, shared.example_args, shared.example_kwargs)
    sets = [("example", example)]
    sets += [
        (label, flat)
        for label, flat in generate_input_sets(example, seeds=generate)
        if label.startswith("seed")
    ]
    return [(label, flat, eager.run(flat)) for label, flat in sets]


def _sha(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tolerances(
    target: str, outputs: Sequence[torch.Tensor], quant_steps: Mapping[int, float | None]
) -> list[dict[str, Any]]:
    """The parity table's tolerance of each output: an int8 program's quantized outputs get
    ``quantized_tolerance`` (one step, or the SNR cap: no float model on the device), as
    ``dx.compare`` judges them; float outputs the runtime's default."""
    out = []
    for i, o in enumerate(outputs):
        tol = output_tolerance(target, i, o.dtype, quant_steps=quant_steps, noise={})
        out.append(
            {
                "rtol": tol.rtol,
                "atol": tol.atol,
                "scale": tol.scale,
                "min_snr_db": tol.min_snr_db,
                "or_snr_db": tol.or_snr_db,
                "elementwise": tol.elementwise,
                "source": tol.source,
            }
        )
    return out


def _write_bpte(pte: pathlib.Path, dest: pathlib.Path, cases: Sequence[tuple[str, list, list]]) -> None:
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    from ..outputs.atomic import atomic_write_bytes

    suite = MethodTestSuite(
        method_name="forward",
        test_cases=[MethodTestCase(inputs=list(ins), expected_outputs=list(outs)) for _, ins, outs in cases],
    )
    # The .pte from disk (the one published), not a re-lowered program.
    bundled = BundledProgram(None, [suite], pte_file_path=str(pte))
    atomic_write_bytes(dest, serialize_from_bundled_program_to_flatbuffer(bundled))


def _write_onnx_tests(
    onnx_files: Sequence[pathlib.Path], folder: pathlib.Path, cases: Sequence[tuple[str, list, list]]
) -> dict[str, str]:
    import onnx
    from onnx import numpy_helper

    folder.mkdir()
    model = onnx.load(str(onnx_files[0]), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    state = {p.key: p.value for p in model.metadata_props}.get("dualexport.state")
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    outputs = [o.name for o in model.graph.output]
    if state and state != "[]":
        raise InputError("bundle=True needs a stateless program", hint="export without bundle=True")
    for f in onnx_files:  # the model beside its test data, as onnx_test_runner reads it (hard links)
        try:
            os.link(f, folder / f.name)
        except OSError:
            import shutil

            shutil.copy2(f, folder / f.name)
    written = {}
    for n, (_, ins, outs) in enumerate(cases):
        d = folder / f"test_data_set_{n}"
        d.mkdir()
        for kind, names, tensors in (("input", inputs, ins), ("output", outputs, outs)):
            for k, (tname, t) in enumerate(zip(names, tensors, strict=True)):
                path = d / f"{kind}_{k}.pb"
                path.write_bytes(
                    numpy_helper.from_array(t.detach().contiguous().numpy(), tname).SerializeToString()
                )
                written[str(path.relative_to(folder.parent))] = _sha(path)
    return written


def write_bundles(
    shared: SharedProgram,
    published: Mapping[str, Published],
    set_dir: pathlib.Path,
    name: str,
    example: list[torch.Tensor],
) -> dict[str, Any]:
    """Write each published target's bundle into the set's folder; the manifest record."""
    from ..shared_state.quantize import quantized_outputs

    cases = bundle_sets(shared, example)
    steps = quantized_outputs(shared.exported_program)
    record: dict[str, Any] = {"sets": [label for label, _, _ in cases]}
    if "xnnpack" in published:
        bpte = set_dir / f"{name}{BPTE_SUFFIX}"
        _write_bpte(published["xnnpack"].path, bpte, cases)
        record["xnnpack"] = {
            "file": bpte.name,
            "sha256": _sha(bpte),
            "tolerances": _tolerances("xnnpack", cases[0][2], steps),
        }
    if "onnx" in published:
        folder = set_dir / f"{name}{ONNX_TESTS_SUFFIX}"
        files = _write_onnx_tests(published["onnx"].files, folder, cases)
        record["onnx"] = {
            "folder": folder.name,
            "files": files,
            "tolerances": _tolerances("onnx", cases[0][2], steps),
        }
    return record

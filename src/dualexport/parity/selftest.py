"""``dualexport selftest DIR``: run the self-test bundles an export wrote, from disk, with the
runtimes a device would use, and judge each output against eager's recorded output.

- ``<name>.bpte``: ExecuTorch's BundledProgram. Each test case runs through the runtime's own
  bundled-IO check (``BundledModule.verify_result_with_bundled_expected_output``, what a device's
  bundled-IO runner calls) with the case's tolerance, and its outputs are measured against the
  bundled expected outputs with dualexport's criterion for the parity table. A program whose
  weights are in a ``.ptd`` is run from the bundle with the data file (ExecuTorch 1.4.1's
  bundled-IO check takes no data file and crashes): the outputs are compared in Python.
- ``<name>_onnx_tests/``: ONNX test data sets (``test_data_set_N/input_K.pb``/``output_K.pb``
  beside the model), run with ONNX Runtime the way ``onnx_test_runner`` does.

Every runtime call runs in a forked child (a crash is the target's error). The bundles' hashes are
checked against the manifest first: an altered bundle is a failed check, naming the file.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._versions import library_versions
from ..compat.executorch import load_bundled_for_executorch, load_bundled_program
from ..errors import ArtifactFormatError, InputError
from ..outputs.paths import safe_child
from ..runtimes.isolated import call_isolated
from .folder import find_name, load_manifest
from .report import OutputParity, ParityReport
from .tolerances import Tolerance

__all__ = ["run_selftest"]


def _sha(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tolerance(record: Mapping[str, Any], index: int) -> Tolerance:
    tols = record.get("tolerances") or []
    t = tols[min(index, len(tols) - 1)] if tols else {}
    return Tolerance(
        float(t.get("rtol", 1e-3)),
        float(t.get("atol", 1e-3)),
        str(t.get("source", "bundle")),
        scale=float(t.get("scale", 0.0)),
        min_snr_db=t.get("min_snr_db"),
        or_snr_db=t.get("or_snr_db"),
        elementwise=bool(t.get("elementwise", True)),
    )


def _bundle_tensor(t: Any) -> torch.Tensor:
    from executorch.exir.scalar_type import ScalarType

    dtypes = {
        ScalarType.FLOAT: torch.float32,
        ScalarType.DOUBLE: torch.float64,
        ScalarType.HALF: torch.float16,
        ScalarType.BFLOAT16: torch.bfloat16,
        ScalarType.LONG: torch.int64,
        ScalarType.INT: torch.int32,
        ScalarType.SHORT: torch.int16,
        ScalarType.CHAR: torch.int8,
        ScalarType.BYTE: torch.uint8,
        ScalarType.BOOL: torch.bool,
    }
    dtype = dtypes[t.scalar_type]
    return torch.frombuffer(bytearray(t.data), dtype=dtype).reshape(list(t.sizes)).clone()


def _bpte_cases(bpte: bytes) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    program = deserialize_from_flatbuffer_to_bundled_program(bpte)
    suite = next(s for s in program.method_test_suites if s.method_name == "forward")
    return [
        ([_bundle_tensor(v.val) for v in tc.inputs], [_bundle_tensor(v.val) for v in tc.expected_outputs])
        for tc in suite.test_cases
    ]


def _run_bpte(
    bpte_path: str, data_path: str | None, cases: int, tolerances: list[tuple[float, float]]
) -> list[tuple[list[torch.Tensor], str | None]]:
    """In the child: each case's outputs, and the bundled-IO check's verdict (None: passed)."""
    buffer = pathlib.Path(bpte_path).read_bytes()
    bundle = load_bundled_program(buffer)
    out: list[tuple[list[torch.Tensor], str | None]] = []
    if data_path is not None:
        module = load_bundled_for_executorch(bundle, data_path)
        for ins, _ in _bpte_cases(buffer):
            out.append(([o.clone() for o in module.forward(tuple(ins))], None))
        return out
    for i in range(cases):
        rtol, atol = tolerances[i]
        try:
            outs = bundle.verify_result_with_bundled_expected_output("forward", i, rtol=rtol, atol=atol)
            out.append(([o.clone() for o in outs], None))
        except RuntimeError as exc:
            out.append(([], str(exc)))
    return out


def _pb(path: pathlib.Path) -> tuple[str, torch.Tensor]:
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return t.name, torch.from_numpy(numpy_helper.to_array(t).copy())


def _numbered(folder: pathlib.Path, kind: str) -> list[pathlib.Path]:
    files = [p for p in folder.iterdir() if re.fullmatch(rf"{kind}_\d+\.pb", p.name)]
    return sorted(files, key=lambda p: int(p.stem.split("_")[1]))


def _run_onnx_set(model: str, feeds: list[tuple[str, Any]], outputs: list[str]) -> list[torch.Tensor]:
    """In the child: one test data set in ONNX Runtime (inputs fed by name, as onnx_test_runner)."""
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    results = session.run(outputs, {n: t.numpy() for n, t in feeds})
    return [torch.from_numpy(r.copy()) for r in results]


def _rows(
    runtime: str,
    label: str,
    got: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    record: Mapping[str, Any],
    verdict: str | None = None,
) -> list[OutputParity]:
    rows = []
    for i, e in enumerate(expected):
        tol = _tolerance(record, i)
        if i < len(got):
            m = tol.judge(got[i].to(e.dtype) if got[i].dtype != e.dtype else got[i], e)
        else:  # the runtime's own check refused the case before returning outputs
            from .metrics import Metrics

            nan = float("nan")
            m = Metrics(nan, nan, nan, nan, 100.0, False, True, False)
        if verdict is not None:
            import dataclasses

            m = dataclasses.replace(m, ok=False)
        rows.append(
            OutputParity(
                i,
                f"{label}/out{i}",
                tuple(e.shape),
                str(e.dtype).replace("torch.", ""),
                {runtime: m},
                {runtime: tol},
            )
        )
    return rows


def _selftest_xnnpack(
    folder: pathlib.Path,
    info: Mapping[str, Any],
    record: dict[str, Any],
    sets: list[str],
    errors: dict[str, str],
) -> list[OutputParity]:
    """The rows of the ExecuTorch bundle (.bpte), run in a child by the runtime's own bundled-IO
    check; a missing, replaced or failing bundle is written to ``errors``."""
    target = "xnnpack"
    bpte = safe_child(folder, record["file"], what="the ExecuTorch bundle")
    if not bpte.is_file():
        errors[target] = f"{bpte.name} is missing"
        return []
    if _sha(bpte) != record.get("sha256"):  # still run: the table shows which output moved
        errors[target] = f"{bpte.name} is not the bundle the export wrote (sha256 differs)"
    cases = _bpte_cases(bpte.read_bytes())
    pte = safe_child(folder, info["file"], what="the manifest's xnnpack artifact")
    data = pte.with_suffix(".ptd")
    tolerances = []
    for _, expected in cases:
        t = _tolerance(record, 0)
        magnitude = max(
            (float(e.abs().max()) for e in expected if e.is_floating_point() and e.numel()),
            default=0.0,
        )
        # an output judged by SNR alone (int8, float after the last dequantize): the
        # runtime's elementwise check cannot state it; the table below judges it
        tolerances.append((t.rtol, t.atol + t.scale * magnitude if t.elementwise else float("inf")))
    results = call_isolated(
        _run_bpte,
        str(bpte),
        str(data) if data.is_file() else None,
        len(cases),
        tolerances,
        target=target,
        what=f"running {bpte.name}",
    )
    outputs: list[OutputParity] = []
    for label, (_, expected), (got, verdict) in zip(sets, cases, results, strict=False):
        outputs += _rows(target, f"bundle:{label}", got, expected, record, verdict)
        if verdict is not None:
            errors.setdefault(target, f"the runtime's bundled-IO check failed on {label}: {verdict}")
    return outputs


def _selftest_onnx(
    folder: pathlib.Path,
    target: str,
    info: Mapping[str, Any],
    record: dict[str, Any],
    sets: list[str],
    errors: dict[str, str],
) -> list[OutputParity]:
    """The rows of the ONNX test data (ONNX's own test_data_set layout), each set run in a child
    with ONNX Runtime; missing or replaced files are written to ``errors``."""
    tests = safe_child(folder, record["folder"], what="the ONNX test data")
    for rel, sha in (record.get("files") or {}).items():
        path = folder / rel
        if not path.resolve().is_relative_to(folder) or not path.is_file():
            errors[target] = f"{rel} is missing"
        elif _sha(path) != sha:  # still run: the table shows which output moved
            errors.setdefault(target, f"{rel} is not the test data the export wrote (sha256 differs)")
    if errors.get(target, "").endswith("missing"):
        return []
    model = safe_child(tests, info["file"], what="the ONNX test model")
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    out_names = [o.name for o in graph.output]
    outputs: list[OutputParity] = []
    for n, label in enumerate(sets):
        d = tests / f"test_data_set_{n}"
        feeds = [_pb(p) for p in _numbered(d, "input")]
        expected = [t for _, t in (_pb(p) for p in _numbered(d, "output"))]
        got = call_isolated(
            _run_onnx_set, str(model), feeds, out_names, target=target, what=f"running {d.name}"
        )
        outputs += _rows(target, f"bundle:{label}", got, expected, record)
    return outputs


def run_selftest(folder: pathlib.Path, *, name: str | None = None) -> tuple[ParityReport, str]:
    """Run every bundle of the export in ``folder``; the report (one row per set, output and
    runtime against eager's recorded output) and the export's name."""
    folder = pathlib.Path(folder).resolve()
    name = find_name(folder, name)
    manifest = load_manifest(folder, name)
    outputs: list[OutputParity] = []
    errors: dict[str, str] = {}
    labels: list[str] = []
    found = False
    for target, info in manifest.artifacts.items():
        record = info.get("bundle")
        if not record:
            continue
        found = True
        sets = list(record.get("sets", []))
        labels = labels or [f"bundle:{s}" for s in sets]
        if target == "xnnpack":
            outputs += _selftest_xnnpack(folder, info, record, sets, errors)
        else:
            outputs += _selftest_onnx(folder, target, info, record, sets, errors)
    if not found:
        raise InputError(
            f"the export {name!r} in {str(folder)!r} has no self-test bundles",
            hint="re-export with bundle=True (CLI: dualexport export ... --bundle)",
        )
    runtimes = tuple(t for t in manifest.artifacts if manifest.artifacts[t].get("bundle"))
    report = ParityReport(
        tuple(outputs),
        runtimes,
        {t: None for t in runtimes},
        {t: None for t in runtimes},
        tuple(labels),
        1,
        library_versions(),
        errors,
    )
    if not outputs and not errors:
        raise ArtifactFormatError(
            f"the bundles of {name!r} hold no test case", hint="re-export with bundle=True"
        )
    return report, name

"""The CLI covers the API (issue 20): a ``.pt2`` as the source, int8 with either form of
calibration data, transforms, ``--no-cache``, ``--option``; and a quiet terminal.

The README's ``.pt2`` example runs as written, the CLI in a subprocess with Python's warnings
left on: its stderr may hold dualexport's own log lines and nothing else. The int8 exports run
in-process with ``dualexport.api.export`` wrapped, to see what the flags became.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pathlib
import re
import shlex
import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch
from torch.export import Dim

import dualexport
import dualexport.api
from dualexport.cli import main
from models import MLP

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = pathlib.Path(dualexport.__file__).resolve().parents[1]
#: a stderr line dualexport itself wrote (its loggers, the CLI's "error:" lines)
OURS = re.compile(
    r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) dualexport[.:]|^(error|check failed|internal error):"
)


def _readme_example(marker: str) -> tuple[str, list[str]]:
    """The README's example after ``<!-- example:MARKER``: the Python heredoc and the commands."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(f"<!-- example:{marker}") :].split("```bash\n", 1)[1].split("```", 1)[0]
    head, _, rest = block.partition("python - <<'EOF'\n")
    assert not head.strip(), head
    python, _, commands = rest.partition("EOF\n")
    return python, [c for c in commands.splitlines() if c.strip()]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS",)}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


@pytest.mark.slow
def test_readme_pt2_example_runs_and_the_terminal_holds_only_dualexport_lines(tmp_path: pathlib.Path) -> None:
    python, commands = _readme_example("pt2")
    made = subprocess.run(
        [sys.executable, "-"],
        input=python,
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    assert commands == ["dualexport export tinymlp.pt2 --out out_pt2 --compare"]
    argv = shlex.split(commands[0])
    run = subprocess.run(
        [sys.executable, "-m", "dualexport", *argv[1:]],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    foreign = [line for line in run.stderr.splitlines() if line.strip() and not OURS.match(line)]
    assert not foreign, "\n".join(foreign[:20])
    out = tmp_path / "out_pt2"
    assert {"model.onnx", "model.pte", "model.weights.json", "model.parity.json"} <= {
        p.name for p in out.iterdir()
    }
    parity = json.loads((out / "model.parity.json").read_text())
    assert parity["ok"] and {"edge:min", "edge:max-1", "edge:max"} <= set(parity["inputs"])
    assert "weight check passed" in run.stdout
    assert "compute ops delegated (100%)" in run.stdout
    # the libraries did speak (ExecuTorch imports torchao): the CLI says it hid them
    assert re.search(r"\d+ message\(s\) from other libraries hidden: -v shows them", run.stdout)


# --------------------------------------------------------------------------- int8 and flags
@pytest.fixture
def export_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the CLI passed to ``dualexport.api.export`` (which still runs)."""
    calls: list[dict[str, Any]] = []
    real = dualexport.api.export

    def spy(model: Any, args: Any = None, kwargs: Any = None, **kw: Any) -> Any:
        kw["calibration"] = None if kw.get("calibration") is None else list(kw["calibration"])
        calls.append({"model": model, "args": args, **kw})
        return real(model, args, kwargs, **kw)

    monkeypatch.setattr(dualexport.api, "export", spy)
    return calls


def test_int8_from_a_calibration_file_on_a_pt2(
    tmp_path: pathlib.Path, export_calls: list[dict[str, Any]]
) -> None:
    torch.manual_seed(0)
    program = torch.export.export(
        MLP().eval(), (torch.randn(4, 16),), dynamic_shapes=({0: Dim("batch", min=1, max=32)},)
    )
    torch.export.save(program, tmp_path / "mlp.pt2")
    g = torch.Generator().manual_seed(7)
    sets = [(torch.randn(4, 16, generator=g),) for _ in range(3)] + [torch.randn(6, 16, generator=g)]
    torch.save(sets, tmp_path / "calib.pt")
    out = tmp_path / "q"
    argv = [
        "export",
        str(tmp_path / "mlp.pt2"),
        "--quantize",
        "int8",
        "--calibration",
        str(tmp_path / "calib.pt"),
    ]
    # One target and no --compare, to stay fast: int8 parity of both targets is
    # tests/test_quantize.py's; what the CLI owes is that the data and the program arrive.
    code = main([*argv, "--target", "onnx", "--out", str(out)])
    assert code == 0
    (call,) = export_calls
    assert isinstance(call["model"], torch.export.ExportedProgram) and call["args"] is None
    assert call["quantize"] == "int8" and len(call["calibration"]) == 4
    for given, saved_set in zip(call["calibration"], sets, strict=True):
        assert torch.equal(given[0], saved_set[0] if isinstance(saved_set, tuple) else saved_set)
    from dualexport.shared_state.quantize import is_quantized

    importlib.import_module("torch.ao.quantization.fx._decomposed")  # the quantized ops, to load it

    saved = torch.export.load(out / "model.pt2")
    assert is_quantized(saved) and (out / "model.float.pt2").is_file()
    (rng,) = saved.range_constraints.values()  # the program's own range survived quantization
    assert (int(rng.lower), int(rng.upper)) == (1, 32)
    import onnx

    assert "QuantizeLinear" in {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}


def test_int8_random_calibration_transform_options_and_no_cache(
    tmp_path: pathlib.Path, export_calls: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "clipasses.py").write_text(
        "import torch\n\n"
        "def gelu_to_relu(gm: torch.fx.GraphModule) -> None:\n"
        "    for n in gm.graph.nodes:\n"
        "        if n.op == 'call_function' and n.target == torch.ops.aten.gelu.default:\n"
        "            n.target, n.args, n.kwargs = torch.ops.aten.relu.default, (n.args[0],), {}\n"
        "    gm.recompile()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "q"
    code = main(
        [
            "export",
            "dualexport.examples:TinyMLP",
            "--input",
            "2x16",
            "--quantize",
            "int8",
            "--calibration-random",
            "3",
            "--transform",
            "clipasses:gelu_to_relu",
            "--target",
            "onnx",
            "--no-cache",
            "--option",
            "onnx_external_data=false",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    (call,) = export_calls
    assert call["cache"] is False and call["quantize"] == "int8"
    assert call["options"].onnx_external_data is False
    assert [t.__name__ for t in call["transforms"]] == ["gelu_to_relu"]
    example = call["args"][0]
    calibration = [c[0] for c in call["calibration"]]
    assert len(calibration) == 3 and all(c.shape == example.shape for c in calibration)
    assert not any(torch.equal(c, example) for c in calibration)
    assert not torch.equal(calibration[0], calibration[1])
    import onnx

    assert not (out / "model.onnx.data").exists()  # the option reached the exporter
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert {
        "QuantizeLinear",
        "DequantizeLinear",
        "Relu",
    } <= ops and "Gelu" not in ops  # both reached the file


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--calibration-random", "2"], "without --quantize"),
        (["--quantize", "int8"], "needs calibration data"),
        (["--quantize", "int8", "--calibration", "missing.pt", "--calibration-random", "2"], "both given"),
        (["--quantize", "int8-dynamic", "--calibration-random", "2"], "takes no calibration"),
        (["--option", "frobnicate=1"], "ExportOptions' fields"),
        (["--option", "parallel=maybe"], "parallel takes"),
    ],
)
def test_bad_flags_exit_2(tmp_path: pathlib.Path, capsys: Any, argv: list[str], message: str) -> None:
    code = main(["export", "dualexport.examples:TinyMLP", "--input", "2x16", "--out", str(tmp_path), *argv])
    assert code == 2
    assert message in " ".join(capsys.readouterr().out.split())


def test_bad_sources_exit_2(tmp_path: pathlib.Path, capsys: Any) -> None:
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    torch.export.save(torch.export.export(MLP().eval(), (torch.randn(2, 16),)), tmp_path / "m.pt2")
    (tmp_path / "calib.pt").write_text("not a torch file")
    cases = [
        ([str(tmp_path / "model.onnx")], "is not a .pt2 file"),
        ([str(tmp_path / "m.pt2"), "--dynamic", "0.0=1..8"], "--dynamic was given with a .pt2"),
        (
            [str(tmp_path / "m.pt2"), "--quantize", "int8", "--calibration", str(tmp_path / "calib.pt")],
            "could not be loaded with weights_only=True",
        ),
    ]
    for argv, message in cases:
        assert main(["export", *argv, "--out", str(tmp_path / "o")]) == 2, argv
        assert message in " ".join(capsys.readouterr().out.split()), argv


# ------------------------------------------------------------------------ library output
def test_library_output_is_captured_unless_shown(capfd: Any) -> None:
    from dualexport._quiet import library_output

    handler = logging.StreamHandler(sys.stderr)  # as the CLI's logging.basicConfig installs
    logging.root.addHandler(handler)
    lib, ours = logging.getLogger("somelib.kernels"), logging.getLogger("dualexport.test")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            with library_output(show=False) as lines:
                lib.warning("Failed to load _C_mxfp8")
                ours.warning("our own line")
                warnings.warn_explicit("LeafSpec is deprecated", FutureWarning, "copyreg.py", 105)
                warnings.warn_explicit("LeafSpec is deprecated", FutureWarning, "copyreg.py", 105)
                with library_output(show=True) as inner:  # nested: the outer capture decides
                    lib.warning("Detected no triton")
            err = capfd.readouterr().err
            assert "our own line" in err
            assert "_C_mxfp8" not in err and "triton" not in err and "LeafSpec" not in err
            assert inner is lines
            assert lines == [
                "WARNING somelib.kernels: Failed to load _C_mxfp8",
                "FutureWarning (copyreg.py:105): LeafSpec is deprecated",
                "WARNING somelib.kernels: Detected no triton",
            ]
            with library_output(show=True) as shown:
                lib.warning("Detected no triton")
            assert "Detected no triton" in capfd.readouterr().err
            assert shown == ["WARNING somelib.kernels: Detected no triton"]
        lib.warning("after")  # the filters are gone
        assert "after" in capfd.readouterr().err
    finally:
        logging.root.removeHandler(handler)

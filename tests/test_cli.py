"""The CLI end to end: export with --compare, then compare DIR; exit codes per DESIGN.md."""

from __future__ import annotations

import json
import pathlib

import pytest

from dualexport.cli import main, parse_input_spec


def test_parse_input_spec() -> None:
    assert parse_input_spec("1x3x224x224:float32") == ((1, 3, 224, 224), "float32")
    assert parse_input_spec("2x7:int64") == ((2, 7), "int64")


def test_export_and_compare_dir(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "export",
            "dualexport.examples:TinyMLP",
            "--input",
            "2x16:float32",
            "--out",
            str(out),
            "--name",
            "mlp",
            "--compare",
        ]
    )
    assert code == 0
    # issue 51: each stage is said as it ends (a log, not a terminal: one line each)
    printed = capsys.readouterr().out
    for line in ("  capture: ", "  onnx: value proof: ", "  xnnpack: value proof: ", "  weight manifest: "):
        assert line in printed, printed
    assert {"mlp.onnx", "mlp.pte", "mlp.weights.json", "mlp.parity.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "mlp.parity.json").read_text())["ok"] is True
    assert main(["compare", str(out), "--html", "--generate", "1"]) == 0
    assert (out / "mlp.parity.html").is_file()
    saved = json.loads((out / "mlp.parity.json").read_text())
    assert saved["inputs"] == ["example", "seed0", "large", "zeros"]


def test_bad_usage_exits_2(tmp_path: pathlib.Path) -> None:
    assert main(["export", "no_such_module_xyz:Thing", "--input", "2x3", "--out", str(tmp_path)]) == 2
    assert (
        main(["export", "dualexport.examples:TinyMLP", "--input", "2xq:float32", "--out", str(tmp_path)]) == 2
    )
    assert main(["frobnicate"]) == 2


def test_target_failure_exits_3(tmp_path: pathlib.Path) -> None:
    mod = tmp_path / "cdistmod.py"
    mod.write_text(
        "import torch\nclass M(torch.nn.Module):\n"
        "    def forward(self, x):\n        return torch.cdist(x, x)\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["export", "cdistmod:M", "--input", "5x4:float32", "--out", str(tmp_path / "o")])
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 3
    assert (tmp_path / "o" / "model.pte").is_file()


# ------------------------------------------------------------------------- exit codes, -v, help
def test_help_lists_every_exit_code(capsys) -> None:  # type: ignore[no-untyped-def]
    for argv in (["--help"], ["export", "--help"], ["compare", "--help"]):
        assert main(argv) == 0
        text = capsys.readouterr().out
        for code in (
            "0  all good",
            "1  a parity or weight check failed",
            "2  bad usage",
            "3  a target failed",
            "4  an internal error",
        ):
            assert code in text, (argv, code)


def test_verbose_is_accepted_after_the_subcommand(tmp_path: pathlib.Path) -> None:
    assert (
        main(
            [
                "export",
                "dualexport.examples:TinyMLP",
                "--input",
                "2x16:float32",
                "--out",
                str(tmp_path / "o"),
                "-v",
                "--target",
                "onnx",
            ]
        )
        == 0
    )
    assert main(["-v", "compare", str(tmp_path / "o")]) == 0
    assert main(["compare", str(tmp_path / "o"), "--verbose"]) == 0


def test_internal_error_has_its_own_exit_code(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import dualexport.api as api
    from dualexport.cli import EXIT_INTERNAL
    from dualexport.errors import InternalError

    def broken(*a: object, **k: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(api, "export", broken)
    argv = ["export", "dualexport.examples:TinyMLP", "--input", "2x16:float32", "--out", str(tmp_path)]
    assert main(argv) == EXIT_INTERNAL == 4
    assert "internal error" in capsys.readouterr().out

    def ours(*a: object, **k: object) -> None:
        try:
            raise ValueError("the root cause")
        except ValueError as exc:
            raise InternalError("lowering broke an invariant") from exc

    monkeypatch.setattr(api, "export", ours)
    assert main(argv) == 4
    assert "the root cause" not in capsys.readouterr().out  # causes only with -v
    assert main([*argv, "-v"]) == 4
    out = capsys.readouterr().out
    assert "internal error" in out and "caused by ValueError: the root cause" in out


def test_capture_error_keeps_torch_exports_suggested_fixes(tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import torch

    import dualexport as dx

    class Specializes(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.ones(4, 3)  # forces the "dynamic" batch to 4

    with pytest.raises(dx.CaptureError) as info:
        dx.export(
            Specializes(),
            (torch.randn(4, 3),),
            out_dir=tmp_path,
            dynamic_shapes=({0: torch.export.Dim("b", min=1, max=8)},),
        )
    assert "Suggested fixes" in str(info.value), str(info.value)


def test_every_error_class_is_importable_from_the_package() -> None:
    import dualexport as dx
    from dualexport import errors

    for name in errors.__all__:
        assert getattr(dx, name) is getattr(errors, name), name
        assert name in dx.__all__, name

"""The CLI end to end: export with --compare, then compare DIR; exit codes per DESIGN.md."""

from __future__ import annotations

import json
import pathlib

from dualexport.cli import main, parse_input_spec


def test_parse_input_spec() -> None:
    assert parse_input_spec("1x3x224x224:float32") == ((1, 3, 224, 224), "float32")
    assert parse_input_spec("2x7:int64") == ((2, 7), "int64")


def test_export_and_compare_dir(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    code = main(["export", "dualexport.examples:TinyMLP", "--input", "2x16:float32",
                 "--out", str(out), "--name", "mlp", "--compare"])
    assert code == 0
    assert {"mlp.onnx", "mlp.pte", "mlp.weights.json", "mlp.parity.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "mlp.parity.json").read_text())["ok"] is True
    assert main(["compare", str(out), "--html", "--generate", "1"]) == 0
    assert (out / "mlp.parity.html").is_file()
    saved = json.loads((out / "mlp.parity.json").read_text())
    assert saved["inputs"] == ["example", "seed0", "large", "zeros"]


def test_bad_usage_exits_2(tmp_path: pathlib.Path) -> None:
    assert main(["export", "no_such_module_xyz:Thing", "--input", "2x3", "--out", str(tmp_path)]) == 2
    assert main(["export", "dualexport.examples:TinyMLP", "--input", "2xq:float32", "--out", str(tmp_path)]) == 2
    assert main(["frobnicate"]) == 2


def test_target_failure_exits_3(tmp_path: pathlib.Path) -> None:
    mod = tmp_path / "cdistmod.py"
    mod.write_text("import torch\nclass M(torch.nn.Module):\n"
                   "    def forward(self, x):\n        return torch.cdist(x, x)\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        code = main(["export", "cdistmod:M", "--input", "5x4:float32", "--out", str(tmp_path / "o")])
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 3
    assert (tmp_path / "o" / "model.pte").is_file()

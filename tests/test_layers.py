"""Every module of the package sits in a layer of the import contract (pyproject.toml): a new
module cannot escape the arrows-go-down rule by being left out of the list. And every function
stays readable in one screen (at most 80 lines)."""

from __future__ import annotations

import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_top_level_module_is_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    package = ROOT / "src" / "dualexport"
    modules = {
        f"dualexport.{p.stem}"
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert modules - placed == set(), f"not in any layer of pyproject.toml: {sorted(modules - placed)}"
    assert placed - modules == set(), f"layers name modules that do not exist: {sorted(placed - modules)}"


MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for path in sorted((ROOT / "src" / "dualexport").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "split into well-named helpers:\n" + "\n".join(long)

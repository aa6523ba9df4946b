"""The library behaviours dualexport relies on or repairs. If a torch upgrade changes one of
them, these fail first and say which assumption broke.

Every private library symbol dualexport reaches is listed in a ``SEAMS`` table of
``dualexport.compat``; each is resolved here against the installed library (the failure names the
symbol, the installed and the pinned version and the compat function that reaches it), and the source outside
``dualexport/compat`` is scanned for private names of those libraries."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import pathlib
import re
import tomllib
import types
from typing import Any

import pytest
import torch

from dualexport.compat import Seam
from models import MLP

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "dualexport"
COMPAT_MODULES = ("torch", "executorch", "onnx", "transformers")
#: the libraries whose private names only dualexport.compat may reach
LIBRARIES = frozenset(
    {
        "torch",
        "torchao",
        "torchvision",
        "executorch",
        "onnx",
        "onnxruntime",
        "onnxscript",
        "onnx_ir",
        "transformers",
    }
)


def _compat(name: str) -> types.ModuleType:
    return importlib.import_module(f"dualexport.compat.{name}")


def _seams() -> list[tuple[str, Seam]]:
    return [(m, seam) for m in COMPAT_MODULES for seam in _compat(m).SEAMS]


def _pins() -> dict[str, str]:
    """distribution name (normalized) -> the version pyproject.toml pins it to (``==``)."""
    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    specs = [
        *project["dependencies"],
        *(s for extra in project["optional-dependencies"].values() for s in extra),
    ]
    out = {}
    for spec in specs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+).*", spec)
        if m:
            out[_normalize(m.group(1))] = m.group(2)
    return out


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _version(symbol: str) -> str:
    """``torch 2.13.0 (pinned 2.13.0)``: which library moved, as installed and as the project pins it."""
    top = symbol.split(".")[0]
    dist = (importlib.metadata.packages_distributions().get(top) or [top])[0]
    pinned = _pins().get(_normalize(dist))
    pin = f"pinned {pinned}" if pinned else "not pinned by pyproject.toml"
    try:
        return f"{dist} {importlib.metadata.version(dist)} ({pin})"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} (not installed; {pin})"


def _class_sets(cls: type, attr: str) -> bool:
    """An attribute the class (or a base) sets on its instances, read from the class's source."""
    pattern = re.compile(rf"\b{re.escape(attr)}\b")
    for klass in cls.__mro__:
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def _resolve(symbol: str) -> None:
    """Import the longest importable module prefix of ``symbol`` and walk the rest as
    attributes; raise LookupError naming what is missing."""
    parts = symbol.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        break
    else:
        raise LookupError(f"no module of {symbol} imports")
    rest = parts[i:]
    for j, attr in enumerate(rest):
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif j == len(rest) - 1 and isinstance(obj, type) and _class_sets(obj, attr):
            return
        else:
            raise LookupError(f"{'.'.join(parts[: i + j])} has no {attr}")


@pytest.mark.parametrize(("module", "seam"), _seams(), ids=lambda v: v.symbol if isinstance(v, Seam) else v)
def test_every_private_symbol_we_reach_still_exists(module: str, seam: Seam) -> None:
    compat = _compat(module)
    assert hasattr(compat, seam.via), (
        f"dualexport.compat.{module} lists {seam.symbol} via {seam.via}, which it lacks"
    )
    problem = _missing(module, seam)
    if problem is not None:
        pytest.fail(problem)


def _missing(module: str, seam: Seam) -> str | None:
    """Why ``seam`` no longer resolves against the installed library, or None when it does."""
    try:
        _resolve(seam.symbol)
    except LookupError as exc:
        return (
            f"{_version(seam.symbol)}: {seam.symbol} is gone ({exc}); dualexport.compat.{module}.{seam.via} "
            f"reaches it ({seam.use})"
        )
    return None


def test_a_symbol_that_moved_is_named_with_both_versions() -> None:
    """The message a library upgrade would produce: the symbol, the installed version, the pin."""
    gone = Seam("torch.export.exported_program._no_such_slot", "a slot torch never had", "set_weight_dicts")
    message = _missing("torch", gone)
    assert message is not None
    assert "torch.export.exported_program._no_such_slot is gone" in message
    assert (
        f"torch {torch.__version__} (pinned 2.13.0)" in message and "compat.torch.set_weight_dicts" in message
    )
    assert _missing("torch", _seams()[0][1]) is None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.expr) -> tuple[str | None, list[str]]:
    """The name an attribute chain starts from and the attributes after it."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), chain[::-1]


def _instance_attributes() -> frozenset[str]:
    """The private attributes of library classes the seams name (``ExportedProgram._state_dict``):
    reaching one on any object outside compat is a reach around it."""
    out = set()
    for _, seam in _seams():
        *head, attr = seam.symbol.split(".")
        if _private(attr) and head and head[-1].lstrip("_")[:1].isupper():
            out.add(attr)
    return frozenset(out)


def _library_reaches(tree: ast.AST, instance_attrs: frozenset[str]) -> list[tuple[int, str]]:
    bound: set[str] = set()  # local names bound by an import from one of the libraries
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in LIBRARIES:
                continue
            bound.update(a.asname or a.name for a in node.names)
            names = [a.name for a in node.names]
            if any(_private(p) for p in node.module.split(".")) or any(_private(n) for n in names):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root, chain = _root(node)
            # torch.ops.<namespace>.<op>: ATen operator names (_to_copy, _softmax) are the export
            # IR's opset, not private Python symbols
            if root in bound and "ops" not in chain[:-1]:
                found.append((node.lineno, f"{root}.{'.'.join(chain)}"))
            elif node.attr in instance_attrs and root not in ("self", "cls"):
                found.append((node.lineno, f".{node.attr}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in instance_attrs
        ):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return found


def test_no_module_outside_compat_reaches_a_private_library_name() -> None:
    instance_attrs = _instance_attributes()
    assert {"_state_dict", "_schema", "_attn_implementation"} <= instance_attrs
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if "compat" in path.relative_to(SRC).parts:
            continue
        for line, what in _library_reaches(ast.parse(path.read_text(), str(path)), instance_attrs):
            offenders.append(f"{path.relative_to(SRC.parent)}:{line}: {what}")
    assert not offenders, "private library names outside dualexport.compat:\n" + "\n".join(offenders)


def test_the_scan_sees_each_kind_of_reach() -> None:
    source = (
        "import torch\nfrom torch.utils import _pytree\nfrom torch._ops import OpOverload\n"
        "import torch._dynamo\nx = torch._C._foo\nep._state_dict = 1\ngetattr(n.target, '_schema', None)\n"
        "ok = torch.ops.aten._to_copy.default\nself._state_dict = 2\n"
    )
    found = _library_reaches(ast.parse(source), _instance_attributes())
    # lines 2-7 each reach a private name; line 8 (an ATen op) and line 9 (an own attribute) do not
    assert {line for line, _ in found} == {2, 3, 4, 5, 6, 7}, found


@pytest.mark.parametrize("module", COMPAT_MODULES)
def test_each_compat_module_lists_every_private_name_it_reaches(module: str) -> None:
    """A private name in a compat module's source that its SEAMS does not name would go
    unchecked by the resolution test above."""
    path = SRC / "compat" / f"{module}.py"
    named = {part for seam in _compat(module).SEAMS for part in seam.symbol.split(".")}
    reached = {
        what.rsplit(".", 1)[-1].split(" import ")[-1]
        for _, what in _library_reaches(ast.parse(path.read_text()), frozenset())
    }
    private = set()
    for item in reached:
        private.update(p.strip() for p in re.split(r"[ ,.]", item) if _private(p.strip()))
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            private.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module:
            private.update(p for p in [*node.module.split("."), *(a.name for a in node.names)] if _private(p))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"_[a-z]\w*", node.value)
        ):
            private.add(node.value)
    assert private <= named, (
        f"dualexport.compat.{module} reaches {sorted(private - named)} without a SEAMS entry"
    )


def _ep() -> torch.export.ExportedProgram:
    return torch.export.export(MLP().eval(), (torch.randn(2, 16),))


def test_run_decompositions_copies_the_state_dict_dict() -> None:
    # The public bug behind the project: a new dict holding the same tensors.
    ep = _ep()
    dec = ep.run_decompositions()
    assert dec.state_dict is not ep.state_dict
    assert all(dec.state_dict[k] is v for k, v in ep.state_dict.items())


def test_state_dict_is_kept_in_private_slot_we_link() -> None:
    # links.py assigns _state_dict/_constants: the property must read them back.
    ep = _ep()
    dec = ep.run_decompositions()
    dec._state_dict = ep.state_dict
    dec._constants = ep.constants
    assert dec.state_dict is ep.state_dict and dec.constants is ep.constants


def test_range_constraints_are_put_back_through_their_slot() -> None:
    # shared_state/program.py's pin puts back the ranges a target narrowed
    from dualexport.compat.torch import set_range_constraints

    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(torch.nn.Linear(3, 3), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    saved = dict(ep.range_constraints)
    (symbol,) = saved
    set_range_constraints(ep, {})
    assert ep.range_constraints == {}
    set_range_constraints(ep, saved)
    assert ep.range_constraints[symbol].lower == 2 and ep.range_constraints[symbol].upper == 8


def test_torch_onnx_prepare_step_exists_and_copies() -> None:
    from torch.onnx._internal.exporter import _core, _registration

    ep = _ep()
    reg = _registration.ONNXRegistry.from_torchlib()
    dec = _core._prepare_exported_program_for_export(ep, registry=reg)
    assert dec is not ep and dec.state_dict is not ep.state_dict
    assert callable(_core._exported_program_to_onnx_program)


def test_the_cia_walk_still_sees_an_op_registered_after_it() -> None:
    """dualexport skips torch's per-namespace walk of the CompositeImplicitAutograd registrations
    while they are unchanged (shared_state/dispatch_walk.py); an op registered afterwards must
    still be collected as preservable, and the walk must be the one torch calls."""
    from torch._export import utils

    from dualexport.shared_state.dispatch_walk import walk_cia_ops_once_per_change

    with walk_cia_ops_once_per_change():
        assert getattr(utils._materialize_cpp_cia_ops, "dualexport_walk_once", False)
        before = utils._collect_all_valid_cia_ops()
        lib = torch.library.Library("dxseam", "DEF")  # noqa: TOR901
        lib.define("twice(Tensor x) -> Tensor")
        lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
        after = utils._collect_all_valid_cia_ops()
    assert torch.ops.dxseam.twice.default in after and torch.ops.dxseam.twice.default not in before
    assert before <= after


def test_the_cia_walk_skip_is_scoped_and_reentrant() -> None:
    """Importing dualexport patches nothing in torch; the skip is installed by the outermost
    block only, and torch's own function is back when that block closes."""
    import subprocess
    import sys

    from torch._export import utils

    from dualexport.shared_state.dispatch_walk import walk_cia_ops_once_per_change

    code = (
        "import dualexport.shared_state.program, dualexport.exporters.xnnpack, dualexport.exporters.onnx; "
        "from torch._export import utils; "
        "assert not getattr(utils._materialize_cpp_cia_ops, 'dualexport_walk_once', False)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    original = utils._materialize_cpp_cia_ops
    with walk_cia_ops_once_per_change():
        installed = utils._materialize_cpp_cia_ops
        assert installed is not original
        with walk_cia_ops_once_per_change():
            assert utils._materialize_cpp_cia_ops is installed  # not wrapped twice
        assert utils._materialize_cpp_cia_ops is installed  # the inner block restored nothing
    assert utils._materialize_cpp_cia_ops is original

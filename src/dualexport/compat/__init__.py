"""Every private symbol of torch, ExecuTorch, ONNX (onnxscript) and transformers that dualexport
reaches, in one place.

Why: the project leans on a few dozen private names (the ExportedProgram's state_dict slot the
weight link writes, XNNPACK's pass manager, torch.onnx's two internal export steps, the
ExecuTorch loader that takes a weights file, ...). Spread over the packages, a library upgrade
that moved one broke an export somewhere in the middle; here each is wrapped by one small
function, listed in its module's ``SEAMS``, and ``tests/test_library_seams.py`` resolves every
entry against the installed library and names the symbol and the pinned version that moved.
Nothing outside this package may reach a private name of those libraries (the same test scans
the source). The modules import their library lazily where it is heavy (ExecuTorch, onnxscript,
transformers), so ``import dualexport`` stays light; this package imports no other dualexport
package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Seam"]


@dataclass(frozen=True)
class Seam:
    """One private library symbol: its qualified name, what dualexport uses it for, and the
    function of the compat module that reaches it.

    ``symbol`` is ``package.module.attribute[.attribute...]``; an attribute that a class sets on
    its instances (``ExportedProgram._state_dict``) is named on the class, and is checked against
    the class's source when the class itself does not carry it."""

    symbol: str
    use: str
    via: str

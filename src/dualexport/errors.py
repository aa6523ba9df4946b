"""The DualExportError tree: one class per phase, user errors apart from internal ones.

Why: a release pipeline has to tell "your input is wrong, do X" from "we broke"; and a caller that
catches one phase (say lowering for one target) must not swallow another. Every message names the
problem and what to try next; where there is a node, it names the op, the node and the line of the
user's model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "DualExportError",
    "UserError",
    "InternalError",
    "InputError",
    "CaptureError",
    "TransformError",
    "DecompositionError",
    "LoweringError",
    "OnnxLoweringError",
    "XnnpackLoweringError",
    "RuntimeLoadError",
    "RuntimeExecutionError",
    "ParityError",
    "WeightMismatchError",
    "ArtifactIOError",
    "ArtifactFormatError",
    "UnsafeArtifactError",
    "ExportLockedError",
    "DiskSpaceError",
    "DelegationError",
    "ProgramMutatedError",
    "RangeNarrowedError",
]


class DualExportError(Exception):
    """Base of every error this package raises on purpose.

    ``target`` names the export target ("onnx", "xnnpack") when the error belongs to one;
    ``hint`` is the "what to try" sentence, kept separate so reports can show it on its own.
    """

    phase: str = "dualexport"

    def __init__(self, message: str, *, target: str | None = None, hint: str | None = None, node: Any = None):
        if node is not None:
            message = f"{message} at {_describe(node)}"
        self.message = message
        self.target = target
        self.hint = hint
        self.node = node if node is None or isinstance(node, str) else getattr(node, "name", str(node))
        text = message
        if target is not None and not message.startswith(f"[{target}]"):
            text = f"[{target}] {text}"
        if hint:
            text = f"{text}\nWhat to try: {hint}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt as it is (class, text, fields): it crosses a process boundary intact (a
        runtime in a child process, a forked lowering), whatever the subclass's constructor."""
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))

    @property
    def internal(self) -> bool:
        """True when dualexport (or a library it drives) is at fault, not the user's input."""
        return isinstance(self, InternalError)


def _rebuild(cls: type[DualExportError], args: tuple[Any, ...], state: dict[str, Any]) -> DualExportError:
    obj = cls.__new__(cls)
    Exception.__init__(obj, *args)
    obj.__dict__.update(state)
    return obj


def _describe(node: Any) -> str:
    """A node as the caller described it (``shared_state.nodes.describe_node`` gives 'op X at
    node 'n' (model line: ...)'), or its name. This module imports nothing of ours: every other
    package imports it."""
    return node if isinstance(node, str) else repr(getattr(node, "name", node))


class UserError(DualExportError):
    """The input (model, arguments, options, files) is the cause; the user can fix it."""


class InternalError(DualExportError):
    """A bug in dualexport or in a library it drives; the message says so."""

    def __init__(self, message: str, *, target: str | None = None, hint: str | None = None, node: Any = None):
        super().__init__(
            f"internal error (a bug in dualexport or the library it drives, not in your input): {message}",
            target=target,
            hint=hint or "report it with the model and the command that raised it",
            node=node,
        )


class InputError(UserError):
    """Bad arguments to export/compare or to the CLI, found before any work was done."""

    phase = "input"


class CaptureError(UserError):
    """torch.export could not trace the model."""

    phase = "capture"


class TransformError(UserError):
    """A user transform raised, or left the shared program invalid."""

    phase = "transform"


class DecompositionError(DualExportError):
    """A target's decomposition of the shared program failed."""

    phase = "decomposition"


class LoweringError(DualExportError):
    """A target could not turn its decomposed program into an artifact."""

    phase = "lowering"


class OnnxLoweringError(LoweringError):
    """torch.onnx could not translate (or save) the program."""


class XnnpackLoweringError(LoweringError):
    """ExecuTorch could not lower, delegate or serialize the program."""


class DelegationError(XnnpackLoweringError):
    """``require_full_delegation=True`` and some ops stayed outside the XNNPACK delegate.

    ``ops`` names each op that was not delegated, so a caller can act on it without parsing text.
    """

    def __init__(
        self,
        message: str,
        *,
        ops: Sequence[str] = (),
        target: str | None = "xnnpack",
        hint: str | None = None,
        node: Any = None,
    ):
        self.ops = tuple(ops)
        super().__init__(message, target=target, hint=hint, node=node)


class RuntimeLoadError(DualExportError):
    """An artifact on disk could not be loaded by its runtime (ORT, ExecuTorch)."""

    phase = "runtime-load"


class RuntimeExecutionError(DualExportError):
    """An artifact loaded but failed when run."""

    phase = "runtime-execution"


class ProofMismatchError(RuntimeExecutionError):
    """A file ran but did not compute the shared program's outputs within its target's tolerance
    when the export proved it (lowered, reused or patched alike): it was not published."""


class ParityError(DualExportError):
    """The parity check itself could not run (mismatched outputs, bad inputs)."""

    phase = "parity"


class WeightMismatchError(DualExportError):
    """An artifact on disk or the holder no longer carries the weights the manifest records."""

    phase = "weights"

    def __init__(
        self,
        message: str,
        *,
        problems: tuple[str, ...] = (),
        target: str | None = None,
        hint: str | None = None,
    ):
        self.problems = problems
        super().__init__(message, target=target, hint=hint)


class ArtifactIOError(UserError):
    """Reading or writing files failed: unwritable folder, truncated or foreign artifact, escape."""

    phase = "io"


class ArtifactFormatError(ArtifactIOError):
    """A file is truncated, or is not the kind of artifact its name says (foreign bytes)."""


class UnsafeArtifactError(ArtifactIOError):
    """An artifact asks to read outside its folder, or to unpickle code: refused, never loaded."""


class ExportLockedError(ArtifactIOError):
    """Another export holds the lock for the same ``out_dir``/``name``."""


class DiskSpaceError(ArtifactIOError):
    """The output folder's file system has less free space than the artifacts need."""

    def __init__(
        self,
        message: str,
        *,
        need: int = 0,
        free: int = 0,
        target: str | None = None,
        hint: str | None = None,
    ):
        self.need = need
        self.free = free
        super().__init__(message, target=target, hint=hint)


class ProgramMutatedError(InternalError):
    """Lowering changed the shared program and it could not be repaired."""

    phase = "lowering"


class RangeNarrowedError(LoweringError):
    """A target could not honour a declared dynamic range: its lowering narrowed the program's
    shape environment, or its file records or accepts less than was declared. The target is
    refused before any of its files is published."""


@contextlib.contextmanager
def typed_errors(stage: str, *, target: str | None = None) -> Iterator[None]:
    """Nothing raw escapes a public entry point: an exception that is not a ``DualExportError``
    becomes an ``InternalError`` naming ``stage``, the original chained. Why: a caller (and the
    CLI's exit code) must be able to tell "your input" from "we broke" by class alone. Works as a
    ``with`` block or a decorator; an interrupt passes through untouched."""
    try:
        yield
    except DualExportError:
        raise
    except MemoryError as exc:
        raise InternalError(
            f"{stage} ran out of memory",
            target=target,
            hint="free memory, export one target at a time (target='onnx' or 'xnnpack'), or use a "
            "machine with more memory",
        ) from exc
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise InternalError(
            f"{stage} raised {type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": "), target=target
        ) from exc

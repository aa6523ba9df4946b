"""SharedProgram: the one ExportedProgram every target is fed from, and its one state_dict."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch.export import ExportedProgram

from ..compat.torch import non_persistent_buffers, repair_user_links, set_range_constraints
from ..errors import (
    CaptureError,
    DecompositionError,
    InputError,
    ProgramMutatedError,
    RangeNarrowedError,
    TransformError,
)
from .contract import InputSpec, input_specs
from .dispatch_walk import walk_cia_ops_once_per_change
from .fingerprint import (
    ProgramFingerprint,
    ShapeEnvSnapshot,
    fingerprint,
    graph_digest,
    narrowed_ranges,
    restore_shape_env,
    snapshot_shape_env,
    weight_digests,
)
from .hf_trace import traced_as_deployed
from .links import LinkReport, link_state_dict
from .passes.base import PassRecord, ProgramPass
from .range_guards import range_guards
from .transforms import TransformRecord, run_transform, transform_kind, transform_name

__all__ = ["SharedProgram", "Pin", "reference_module", "narrowed_error"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pin:
    """The shared program as one target's job found it: the input contract every file of the
    target must accept (``specs``), and the shape environment to hold it to."""

    target: str
    specs: tuple[InputSpec, ...]
    shapes: ShapeEnvSnapshot


def narrowed_error(target: str, narrowed: Sequence[str]) -> RangeNarrowedError:
    return RangeNarrowedError(
        f"lowering narrowed the declared dynamic range(s): {'; '.join(narrowed)}; a file made under "
        "them would refuse or miscompute sizes the export promised",
        target=target,
        hint="declare a range the target can honour (a smaller Dim max), export the other target "
        "alone, or report the model: the ranges were restored and nothing of this target was written",
    )


def reference_module(program: ExportedProgram) -> torch.nn.Module:
    """``program.module()`` with its own copy of every buffer: the graph may update buffers in
    place (add_/copy_), and the holder's tensors must not change when the reference runs."""
    module = program.module()
    for fqn, buf in list(module.named_buffers()):
        owner_name, _, leaf = fqn.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        persistent = leaf not in non_persistent_buffers(owner)
        owner.register_buffer(leaf, buf.clone(), persistent=persistent)
    return module


def _run_transform(fn: Any, program: ExportedProgram) -> ExportedProgram:
    return run_transform(program, fn)


def _run_pass(p: ProgramPass, records: list[PassRecord], program: ExportedProgram) -> ExportedProgram:
    out, rec = p.run(program)
    records.append(rec)
    return out


def _first_line_of_user_code(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _suggested_fixes(exc: BaseException) -> str | None:
    """torch.export's own "Suggested fixes:" block (e.g. the Dim ranges it inferred), verbatim."""
    lines = str(exc).splitlines()
    for i, line in enumerate(lines):
        if line.strip().lower().startswith("suggested fixes"):
            block = [line.strip()]
            for nxt in lines[i + 1 :]:
                if not nxt.strip():
                    break
                block.append(nxt.rstrip())
            return "\n".join(block)
    return None


def _check_outputs(program: ExportedProgram, what: str) -> None:
    """Every output a tensor (or None): a Python number or string that forward returns is baked
    into the trace as a constant, which neither file can return as an output (torch.onnx fails
    on it, ExecuTorch returns it without computing it), so it is refused where it enters."""
    from torch.export.graph_signature import ConstantArgument, OutputKind

    user = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    for i, spec in enumerate(user):
        if isinstance(spec.arg, ConstantArgument) and spec.arg.value is not None:
            raise InputError(
                f"{what}'s forward returns a non-tensor value as output {i}: "
                f"{type(spec.arg.value).__name__} {spec.arg.value!r}; the trace keeps it as a constant "
                "that neither artifact can return",
                hint="return tensors only (e.g. torch.tensor(value)), or drop the value from the outputs",
            )


class SharedProgram:
    """Holds the single source of truth: one ExportedProgram, one state_dict.

    Each target's decomposed program is produced here and linked back to the holder's dict, so
    ``decomposed[t].state_dict is self.state_dict``; ``guard`` proves a target left the program
    as it found it.
    """

    def __init__(
        self,
        exported_program: ExportedProgram,
        *,
        example_args: tuple[Any, ...] = (),
        example_kwargs: Mapping[str, Any] | None = None,
        capture_seconds: float = 0.0,
        notes: Sequence[str] = (),
    ) -> None:
        repaired = repair_user_links(exported_program.graph)
        if repaired:
            logger.debug("repaired %d reader link(s) missing from torch.export's graph", repaired)
        self._ep = exported_program
        self._decomposed: dict[str, ExportedProgram] = {}
        self._deferred: dict[str, Callable[[ExportedProgram], ExportedProgram]] = {}
        self._links: dict[str, LinkReport] = {}
        self._transforms: list[TransformRecord] = []
        self._passes: list[PassRecord] = []
        self._notes: list[str] = list(notes)
        self.example_args = tuple(example_args)
        self.example_kwargs = dict(example_kwargs or {})
        self.capture_seconds = capture_seconds
        self._weights: dict[str, str] | None = None
        self.dynamic_shapes: Any = None
        self.quantization: dict[str, Any] | None = None
        #: for an int8 export, the float program it was quantized from (the model's own tensors,
        #: no copy): parity measures the reference's own quantization noise against it
        self.float_program: ExportedProgram | None = None

    # ------------------------------------------------------------------ capture
    @classmethod
    def capture(
        cls,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
        dynamic_shapes: Any = None,
        *,
        strict: bool = False,
    ) -> SharedProgram:
        """Trace ``model`` once with torch.export, in eval mode (its mode is restored after)."""
        if not isinstance(model, torch.nn.Module):
            raise InputError(
                f"model must be a torch.nn.Module, got {type(model).__name__}",
                hint="wrap functions in an nn.Module whose forward calls them",
            )
        notes: list[str] = []
        modes = {name: m.training for name, m in model.named_modules()}
        if any(modes.values()):
            notes.append(
                "model was in training mode: exported in eval mode (dropout off, "
                "BatchNorm uses running stats); its mode was restored afterwards"
            )
            logger.warning("%s", notes[-1])
        model.eval()
        start = time.perf_counter()
        try:
            with walk_cia_ops_once_per_change(), traced_as_deployed(model, kwargs):
                ep = torch.export.export(
                    model,
                    tuple(args),
                    dict(kwargs) if kwargs else None,
                    dynamic_shapes=dynamic_shapes,
                    strict=strict,
                )
        except Exception as exc:
            fixes = _suggested_fixes(exc)
            guards = range_guards(str(exc), dynamic_shapes)
            if guards:
                raise CaptureError(
                    f"torch.export could not trace {type(model).__name__} over the declared dynamic "
                    "range: some sizes in it make the model take another path\n"
                    + "\n".join(f"  {g.describe()}" for g in guards),
                    hint="declare the range that satisfies the model's guard (above) in dynamic_shapes; "
                    "see the chained exception (-v) for torch.export's message",
                ) from exc
            raise CaptureError(
                f"torch.export could not trace {type(model).__name__}: {_first_line_of_user_code(exc)}"
                + (f"\n{fixes}" if fixes else ""),
                hint=(
                    "apply torch.export's suggested fixes above to dynamic_shapes"
                    if fixes
                    else "make forward traceable (no data-dependent Python control flow, no .item() "
                    "on traced values) or mark dynamic dims with torch.export.Dim"
                )
                + "; see the chained exception (-v) for the traceback",
            ) from exc
        finally:
            for name, m in model.named_modules():
                m.train(modes.get(name, False))
        _check_outputs(ep, type(model).__name__)
        shared = cls(
            ep,
            example_args=tuple(args),
            example_kwargs=kwargs,
            capture_seconds=time.perf_counter() - start,
            notes=notes,
        )
        shared.dynamic_shapes = dynamic_shapes
        return shared

    @classmethod
    def from_program(
        cls,
        program: ExportedProgram,
        args: tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> SharedProgram:
        """Take ``program`` itself as the shared program: no trace, and its own ``state_dict``
        is the holder's dict from here on. Its example inputs default to the program's
        ``example_inputs``; its dynamic ranges are its ``range_constraints``. A program no target
        can serve from (training mode, an edge program, inputs that do not fit) is refused.

        The program is the holder's from then on: transforms and dualexport's own passes edit it
        as they edit a traced module's program (dualexport's passes keep its numbers)."""
        from .given import align_shape_env, check_program, program_dynamic_shapes, program_inputs

        check_program(program)
        _check_outputs(program, "the program")
        args, kwargs = program_inputs(program, args, kwargs)
        notes = ["taken from a given ExportedProgram (no trace)"]
        aligned = align_shape_env(program)
        if aligned:
            notes.append("shape environment aligned with a trace's: " + "; ".join(aligned))
        shared = cls(program, example_args=args, example_kwargs=kwargs, notes=notes)
        shared.dynamic_shapes = program_dynamic_shapes(program, args, kwargs)
        return shared

    # --------------------------------------------------------------- the holder
    @property
    def exported_program(self) -> ExportedProgram:
        return self._ep

    @property
    def state_dict(self) -> dict[str, Any]:
        """The one dict: ``is self.exported_program.state_dict``."""
        return self._ep.state_dict

    @property
    def constants(self) -> dict[str, Any]:
        return self._ep.constants

    @property
    def decomposed(self) -> Mapping[str, ExportedProgram]:
        """Every target's decomposed program; a deferred one is computed (and linked) on first
        access."""
        return _Decompositions(self)

    @property
    def links(self) -> Mapping[str, LinkReport]:
        for target in list(self._deferred):
            self._resolve(target)
        return MappingProxyType(self._links)

    @property
    def transforms(self) -> tuple[TransformRecord, ...]:
        return tuple(self._transforms)

    @property
    def passes(self) -> tuple[PassRecord, ...]:
        """dualexport's own shared-program passes, as they ran (``apply_passes``)."""
        return tuple(self._passes)

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    def note(self, text: str) -> None:
        self._notes.append(text)

    # --------------------------------------------------------------- transforms
    def apply_transforms(self, transforms: Sequence[Callable[..., Any]]) -> tuple[TransformRecord, ...]:
        """Apply user transforms to the shared program itself, in order (invariant 3)."""
        records = []
        for fn in transforms:
            name, kind = transform_name(fn), transform_kind(fn)
            before = graph_digest(self._ep)
            start = time.perf_counter()
            self._replace(name, "transform", functools.partial(_run_transform, fn))
            rec = TransformRecord(name, kind, graph_digest(self._ep) != before, time.perf_counter() - start)
            records.append(rec)
            logger.info(
                "transform %s (%s): %s",
                name,
                kind,
                "changed the graph" if rec.changed else "left the graph unchanged",
            )
        self._transforms.extend(records)
        return tuple(records)

    def apply_passes(self, passes: Sequence[ProgramPass]) -> tuple[PassRecord, ...]:
        """Run dualexport's own shared-program passes (canonicalizations, constant folding):
        declared passes that serve both targets, recorded apart from the user's transforms."""
        records = []
        for p in passes:
            if p.serves != "shared":
                raise TransformError(
                    f"pass {p.name} serves {p.serves}, not the shared program",
                    hint="run a target's pass on that target's decomposed program",
                )
            box: list[PassRecord] = []
            self._replace(p.name, "pass", functools.partial(_run_pass, p, box))
            records.extend(box)
            logger.info("pass %s: %s", p.name, "changed the graph" if box[0].modified else "nothing to do")
        self._passes.extend(records)
        return tuple(records)

    def _replace(self, name: str, what: str, fn: Callable[[ExportedProgram], ExportedProgram]) -> None:
        """Run ``fn`` on the shared program and make its result the shared program: refused if
        it raised, left the program invalid or narrowed a declared range; the one dict is kept
        when the weights are the same objects."""
        if self._decomposed or self._deferred:
            raise TransformError(
                f"{what}s must run before any target is decomposed",
                hint="pass all transforms to dx.export(transforms=...)",
            )
        shapes = snapshot_shape_env(self._ep)
        try:
            with walk_cia_ops_once_per_change():
                new_ep = fn(self._ep)
        except TransformError:
            raise
        except Exception as exc:
            raise TransformError(
                f"{what} {name} raised {type(exc).__name__}: {exc}",
                hint="run it on a copy of res.program.exported_program to debug it",
            ) from exc
        narrowed = narrowed_ranges(new_ep, shapes)
        if narrowed:
            restore_shape_env(new_ep, shapes)
            raise TransformError(
                f"{what} {name} narrowed the declared dynamic range(s): {'; '.join(narrowed)}",
                hint="a transform must hold for every size dynamic_shapes declares; make it "
                "size-generic (torch._check / guard_or_false instead of guarding on the example's "
                "sizes) or declare the narrower range in dynamic_shapes",
            )
        if new_ep is not self._ep:
            # A new program: keep the one dict when weights are the same objects, exactly as for
            # decompositions.
            report = link_state_dict(new_ep, self._ep)
            if not report.linked:
                self.note(
                    f"{what} {name} changed weights: "
                    + ", ".join(f"{k} ({why})" for k, why in report.changes)
                )
            self._ep = new_ep
        self._weights = None

    # ----------------------------------------------------------- decompositions
    def decompose(self, target: str, fn: Callable[[ExportedProgram], ExportedProgram]) -> ExportedProgram:
        """Run a target's decomposition on the shared program and link its state_dict back."""
        try:
            with walk_cia_ops_once_per_change():
                dec = fn(self._ep)
        except Exception as exc:
            raise DecompositionError(
                f"decomposition for {target} failed: {type(exc).__name__}: {_first_line_of_user_code(exc)}",
                target=target,
                hint="an op in the model has no decomposition for this target; see the chained "
                "exception for the op, or export the other target alone",
            ) from exc
        report = link_state_dict(dec, self._ep)
        if not report.linked:
            logger.warning("%s decomposition changed the weights: %s", target, report.changes)
        self._decomposed[target] = dec
        self._links[target] = report
        self._deferred.pop(target, None)
        return dec

    def defer_decomposition(self, target: str, fn: Callable[[ExportedProgram], ExportedProgram]) -> None:
        """Register ``target``'s decomposition without running it: a cache hit needs none to
        reuse its files, and only localization or an explicit look ever reads it."""
        if target not in self._decomposed:
            self._deferred[target] = fn

    def _resolve(self, target: str) -> ExportedProgram:
        fn = self._deferred.pop(target)
        with self.pinned(target):
            return self.decompose(target, fn)

    # -------------------------------------------------------------- fingerprint
    def weight_digests(self) -> dict[str, str]:
        """sha256 of every weight, computed once after the transforms (the baseline)."""
        if self._weights is None:
            self._weights = weight_digests(self._ep)
        return dict(self._weights)

    def fingerprint(self, *, rehash: bool = True) -> ProgramFingerprint:
        return fingerprint(self._ep, None if rehash else self.weight_digests())

    @contextlib.contextmanager
    def pinned(self, target: str) -> Iterator[Pin]:
        """Pin the shared program for one target's whole job (invariant 4).

        The pin holds the fingerprint and the shape environment as they are on entry, and the
        input contract they give (``Pin.specs``: what every file must accept). On exit a change
        of the graph or of a weight is refused (``ProgramMutatedError``: it cannot be undone
        without a copy we refuse to keep); a narrowed range is put back for the next target and
        the target refused (``RangeNarrowedError``): its file was made under ranges the user did
        not declare. When the job itself failed, its own error is kept and the environment is
        still put back.
        """
        before = self.fingerprint(rehash=False)
        snap = snapshot_shape_env(self._ep)
        range_constraints = dict(self._ep.range_constraints)
        pin = Pin(target, tuple(input_specs(self._ep)), snap)
        failed = False
        try:
            yield pin
        except BaseException:
            failed = True
            raise
        finally:
            narrowed = narrowed_ranges(self._ep, snap)
            if snapshot_shape_env(self._ep).digest != snap.digest:
                restore_shape_env(self._ep, snap)
                set_range_constraints(self._ep, range_constraints)
            if not failed:
                changed = [
                    c for c in before.diff(self.fingerprint(rehash=True)) if c != "symbolic shape ranges"
                ]
                if changed:
                    raise ProgramMutatedError(
                        f"{target} changed the shared program: {', '.join(changed)}", target=target
                    )
                if narrowed:
                    raise narrowed_error(target, narrowed)

    @contextlib.contextmanager
    def watch_ranges(self, target: str) -> Iterator[None]:
        """Refuse (``RangeNarrowedError``) work that narrows a declared range, and put the range
        back; usable wherever the work runs (in a forked worker the parent's pin sees nothing)."""
        snap = snapshot_shape_env(self._ep)
        try:
            yield
        finally:
            narrowed = narrowed_ranges(self._ep, snap)
            if narrowed:
                restore_shape_env(self._ep, snap)
        if narrowed:
            raise narrowed_error(target, narrowed)

    @contextlib.contextmanager
    def watch_program(self, target: str) -> Iterator[None]:
        """Refuse (``ProgramMutatedError``) work that changed the graph or a weight of the shared
        program: the pin's check, for work whose changes the pin cannot see (a forked worker
        mutates its own copy of the program, and its file is made from that copy)."""
        before = self.fingerprint(rehash=False)
        yield
        changed = [c for c in before.diff(self.fingerprint(rehash=True)) if c != "symbolic shape ranges"]
        if changed:
            raise ProgramMutatedError(
                f"{target} changed the shared program: {', '.join(changed)}", target=target
            )

    # ------------------------------------------------------------------ running
    def run_eager(self, *args: Any, **kwargs: Any) -> Any:
        """Run the shared program eagerly (the reference every runtime is compared with)."""
        with torch.no_grad():
            return reference_module(self._ep)(*args, **kwargs)

    def save(self, path: str) -> None:
        """torch.export.save: loadable later without pickle by torch.export.load."""
        torch.export.save(self._ep, path)


class _Decompositions(Mapping[str, ExportedProgram]):
    """Read-only view of a SharedProgram's decompositions that resolves deferred ones on access
    (a target is in ``_decomposed`` or in ``_deferred``, never both)."""

    def __init__(self, owner: SharedProgram) -> None:
        self._owner = owner

    def __getitem__(self, target: str) -> ExportedProgram:
        owner = self._owner
        if target in owner._deferred:
            return owner._resolve(target)
        return owner._decomposed[target]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._owner._decomposed, *self._owner._deferred])

    def __len__(self) -> int:
        return len(self._owner._decomposed) + len(self._owner._deferred)

    def __contains__(self, target: object) -> bool:
        return target in self._owner._decomposed or target in self._owner._deferred

"""One target's job, in one fixed order:

1. **pin** the shared program (fingerprint and shape environment; ``SharedProgram.pinned``);
2. **reuse** the previous set's files when the cache key matches, else **patch** copies of them
   when only weights changed, else **decompose** and **lower** (in a forked worker when asked),
   watching the shape environment wherever the lowering runs;
3. **prove** the file from disk: the ranges it records, then its outputs on the example and at
   the edges of every declared range against the shared program's, within the target's
   tolerance (``prove.prove_file``); a reused or patched file that fails is dropped and the
   target lowered, a lowered one is refused;
4. **unpin**: a graph or weight change, or a narrowed range, refuses the target here;
5. only then **stage** the files into the set's folder for its commit.

A target refused at any step stages nothing (its files die with the job's private staging
folder), so the set never publishes a file without a manifest entry. Reuse, patch and the forked
worker are strategies of this one sequence, not copies of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._memory import release_memory
from .._stages import stage
from ..errors import DualExportError, InternalError, OnnxLoweringError, XnnpackLoweringError
from ..exporters import DelegationReport, ExportOptions, LoweredTarget, get_exporter
from ..exporters.base import unsupported_dtype_node
from ..exporters.cache import link_previous_files
from ..exporters.delegation import check_full_delegation
from ..exporters.forked import ForkedCall
from ..outputs import commit_files, staging_dir
from ..shared_state import SharedProgram
from ..shared_state.nodes import describe_node
from ..shared_state.passes.graph_edit import OWN_CONSTANT_PREFIXES
from ..shared_state.request import weight_bytes
from ..weights import WeightManifest, verify_manifest
from ..weights.locate import holder_tensors
from .forced_proof import forced_stage
from .outcome import Failed, Lowered, Outcome, Patched, Proof, Published, Reused
from .prove import prove_file
from .reference import Reference, approximated

__all__ = ["JobKeys", "Previous", "TargetJob", "RELEASE_MEMORY_ABOVE"]

logger = logging.getLogger(__name__)

_LOWERING_ERRORS = {"onnx": OnnxLoweringError, "xnnpack": XnnpackLoweringError}

#: Below this many weight bytes a full garbage collection (~0.5 s on a transformer) costs more
#: than the memory it returns.
RELEASE_MEMORY_ABOVE = 64 << 20


@dataclass(frozen=True)
class JobKeys:
    """The cache key (everything that makes the file) and the structure key (the same without
    weight values: a previous file with this key can be patched)."""

    cache: str
    structure: str


@dataclass(frozen=True)
class Previous:
    """The set already in the output folder, read from its manifest."""

    folder: pathlib.Path
    manifest: WeightManifest


@dataclass(frozen=True)
class _Lowering:
    """A lowering's result, small enough to cross from a forked worker: the tensors the lowered
    program keeps are reduced to a count and the names that are not the holder's objects."""

    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    delegation: DelegationReport | None
    weight_notes: Mapping[str, str]
    derived_copies: Mapping[str, tuple[str, ...]]
    kept_tensors: int
    kept_not_shared: tuple[str, ...]
    backend_passes: Any = None
    opset: int | None = None


@dataclass(frozen=True)
class _Staged:
    """Files in the job's staging folder that came from the previous set."""

    strategy: str  # "reused" or "patched"
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    delegation: DelegationReport | None
    weight_notes: Mapping[str, str] = field(default_factory=dict)
    derived_copies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    patched: int = 0
    copies: int = 0


def _previous_derived(info: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    return {k: tuple(v) for k, v in (info.get("derived") or {}).items()}


def _previous_delegation(info: Mapping[str, Any]) -> DelegationReport | None:
    return DelegationReport.from_dict(info["delegation"]) if info.get("delegation") else None


class TargetJob:
    """Run one target through the fixed order above; ``run()`` in one go, or ``prepare()``,
    ``start(fork=...)`` and ``finish()`` to lower in a forked worker meanwhile."""

    def __init__(
        self,
        shared: SharedProgram,
        target: str,
        *,
        set_dir: pathlib.Path,
        name: str,
        options: ExportOptions,
        keys: JobKeys,
        previous: Previous | None,
        reference: Reference,
        require_full_delegation: bool = False,
    ) -> None:
        self.shared, self.target, self.set_dir, self.name = shared, target, set_dir, name
        self.options, self.keys, self.previous = options, keys, previous
        self.reference = reference
        self.require_full_delegation = require_full_delegation
        self.exporter = get_exporter(target)
        self._staging_ctx = contextlib.ExitStack()
        self._pin_ctx = contextlib.ExitStack()
        self._staging: pathlib.Path | None = None
        self._specs: tuple[Any, ...] = ()
        self._staged: _Staged | None = None
        self._lower: Callable[[], _Lowering] | None = None
        self._forked: ForkedCall[_Lowering] | None = None
        #: the forked lowering's stage, open from the fork to its result
        self._lowering = contextlib.ExitStack()
        self._approximated: Reference | None = None
        #: the program ``_approximated`` is of, when not the shared program
        self._approximation: Any = None
        self._decomposed: Any = None
        self._error: BaseException | None = None
        #: why this job lowers although a previous set was there (Lowered.because)
        self._because: str | None = None
        self._done = False
        self._t0 = time.perf_counter()

    # --------------------------------------------------------------------------- the steps
    def prepare(self) -> bool:
        """Pin, then try reuse and patch. True when the target still needs lowering."""
        self._t0 = time.perf_counter()
        try:
            self._staging = self._staging_ctx.enter_context(staging_dir(self.set_dir))
            self._specs = self._pin_ctx.enter_context(self.shared.pinned(self.target)).specs
            self._staged = self._reuse() or self._patch()
        except Exception as exc:  # an interrupt is not the target's failure: it stops the export
            self._error = exc
            return False
        return self._staged is None

    def start(self, *, fork: bool = False) -> None:
        """Decompose (linked to the one state_dict) and begin lowering; in a forked worker when
        ``fork`` (the parent meanwhile runs the other target's job)."""
        if self._error is not None or self._staged is not None:
            return
        try:
            self._refuse_dtypes()
            with stage(f"{self.target}: decompose"):
                decomposed = self.shared.decompose(self.target, self._decompose)
            self._decomposed = decomposed
            holder_ids = {id(t) for t in holder_tensors(self.shared.exported_program).values()}
            exporter, staging, target = self.exporter, self._staging, self.target
            assert staging is not None

            parent = os.getpid()

            def lower() -> _Lowering:
                # In a forked worker the parent's pin sees neither the ranges nor the weights the
                # child's lowering may change: the child checks both before its file counts.
                in_child = os.getpid() != parent
                watch = self.shared.watch_program(target) if in_child else contextlib.nullcontext()
                with watch, self.shared.watch_ranges(target):
                    try:
                        lowered = exporter.lower(decomposed, staging, self.name, self.options)
                    except DualExportError:
                        raise
                    except Exception as exc:
                        raise _LOWERING_ERRORS[target](
                            f"lowering failed: {type(exc).__name__}: {exc}",
                            target=target,
                            hint="see the chained exception",
                        ) from exc
                return _summarize(lowered, holder_ids)

            self._lower = lower
            if fork:  # the stage runs from the fork to its result, beside the other target's work
                self._lowering.enter_context(stage(f"{target}: lower (forked)"))
            self._forked = ForkedCall(lower, label=target) if fork else None
        except Exception as exc:  # an interrupt propagates (see prepare)
            self._error = exc

    def finish(self) -> Outcome:
        """Complete and prove the file, unpin, then stage it for the set's commit."""
        self._done = True
        try:
            try:
                # leaving the pin checks it (a refusal stages nothing); a job that failed before
                # lowering leaves it too, so the pin puts the shape environment back now and not
                # in a generator collected at interpreter exit
                with self._pin_ctx:
                    if self._error is not None:
                        raise self._error
                    outcome = self._complete()
                return self._stage(outcome)
            finally:
                self._lowering.close()
                self._staging_ctx.close()
        except DualExportError as exc:
            logger.error("%s", exc)
            return Failed(self.target, exc, time.perf_counter() - self._t0)
        except Exception as exc:  # a library failure nobody anticipated
            err = InternalError(f"{self.target}: {type(exc).__name__}: {exc}", target=self.target)
            err.__cause__ = exc
            logger.error("%s", err)
            return Failed(self.target, err, time.perf_counter() - self._t0)

    def run(self) -> Outcome:
        if self.prepare():
            self.start()
        return self.finish()

    def cancel(self) -> None:
        """Give up on an unfinished job (an exception or an interrupt between start and finish):
        kill its worker, unpin, drop its staging folder."""
        if self._done:
            return
        self._done = True
        if self._forked is not None:
            self._forked.cancel()
        self._lowering.close()
        with contextlib.suppress(Exception):
            self._pin_ctx.close()
        self._staging_ctx.close()

    def _refuse_dtypes(self) -> None:
        """A program that computes in a dtype the target's runtime has no kernels for is refused
        before lowering, naming the first op (rather than a file that fails to load or run)."""
        found = unsupported_dtype_node(self.shared.exported_program, self.exporter.refused_dtypes)
        if found is None:
            return
        node, dtype = found
        why, hint = self.exporter.refused_dtypes[dtype]
        raise _LOWERING_ERRORS[self.target](
            f"the program computes in {str(dtype).removeprefix('torch.')}, first at "
            f"{describe_node(node)}: {why}",
            target=self.target,
            hint=hint,
        )

    def _decompose(self, program: Any) -> Any:
        """The target's decomposition with its own pass pipeline (as ``options`` says)."""
        return self.exporter.decompose(program, self.options)

    # ----------------------------------------------------------------------- strategies
    def _info(self) -> Mapping[str, Any] | None:
        prev = self.previous
        return prev.manifest.artifacts.get(self.target) if prev is not None else None

    def _reuse(self) -> _Staged | None:
        """A cache hit: the previous files linked in and proven against the previous manifest
        from disk; the decomposition is deferred (``program.decomposed[target]`` computes it)."""
        info, prev, staging = self._info(), self.previous, self._staging
        if not info or info.get("cache_key") != self.keys.cache or prev is None or staging is None:
            return None
        files = link_previous_files(prev.folder, staging, list(info["files"]))
        if files is None:
            return None
        m = prev.manifest
        try:  # the key covers every weight's digest: only the linked files are re-read
            verify_manifest(
                WeightManifest(m.entries, {self.target: info}, m.versions, m.program), staging, None
            )
        except DualExportError as exc:
            self._because = f"the cached file does not verify: {exc.message}"
            logger.warning("%s: %s; lowering again", self.target, self._because)
            _remove(files)
            return None
        self.shared.defer_decomposition(self.target, self._decompose)
        main = staging / info["file"]
        logger.info("%s: reusing %s (cache key %s...)", self.target, info["file"], self.keys.cache[:12])
        return _Staged(
            "reused",
            (main, *[f for f in files if f != main]),
            tuple(info.get("ops", ())),
            _previous_delegation(info),
            derived_copies=_previous_derived(info),
        )

    def _patch(self) -> _Staged | None:
        """A weights-only change: copies of the previous files with the new bytes written at
        every place the previous manifest recorded for each changed weight, or none (the job
        then lowers, ``Lowered.because`` saying why)."""
        from ..exporters.patch import patch_files, plan_patch

        info, prev, staging = self._info(), self.previous, self._staging
        if not info or prev is None or staging is None:
            return None
        if info.get("structure_key") != self.keys.structure:
            quantized = self.shared.quantization is not None
            self._because = "weights-only patch impossible: the program changed beyond its weights" + (
                " (an int8 program's activation scales and the weights it quantizes are part of "
                "its graph: new weights quantize to a new graph)"
                if quantized
                else " (graph, ranges or options)"
            )
            return None
        program = self.shared.exported_program
        plan = plan_patch(
            self.target, prev.manifest.entries, self.shared.weight_digests(), holder_tensors(program)
        )
        if plan.refusal is not None:
            self._because = f"weights-only patch impossible: {plan.refusal}"
            logger.info("%s: %s; lowering again", self.target, self._because)
            return None
        if not plan.changes:
            return None
        try:
            files = tuple(
                patch_files(self.target, prev.folder, staging, list(info["files"]), list(plan.changes))
            )
        except Exception as exc:  # any library or file error of the patch: lower instead
            self._because = f"weights-only patch failed: {type(exc).__name__}: {exc}"
            logger.warning("%s: %s; lowering again", self.target, self._because)
            _remove(staging.iterdir())
            return None
        self.shared.defer_decomposition(self.target, self._decompose)
        # Same graph, so the same reasons for weights the target does not store as-is, and the
        # same constants folded from weights.
        notes = {
            n: loc.reason
            for e in prev.manifest.entries
            for loc in e.copies.get(self.target, ())
            if loc.status in ("not_stored", "transformed") and loc.reason
            for n in e.names
        }
        logger.info(
            "%s: weights-only change, %d weight(s) patched at %d place(s)",
            self.target,
            plan.weights,
            len(plan.changes),
        )
        return _Staged(
            "patched",
            files,
            tuple(info.get("ops", ())),
            _previous_delegation(info),
            notes,
            _previous_derived(info),
            plan.weights,
            len(plan.changes),
        )

    # ------------------------------------------------------------------- complete, stage
    def _prove(self, path: pathlib.Path) -> Proof:
        with stage(f"{self.target}: value proof"):
            reference = self._proof_reference()
            # a quantized program's file is judged linear by linear against what it computes:
            # the shared program, or the target's approximation of it (a kernel's quantization)
            shared = self.shared.exported_program
            program = shared if self._approximation is None else self._approximation
            forced = forced_stage(self.target, program, self._decomposed, shared)
            return prove_file(self.target, path, self._specs, reference, forced)

    def _proof_reference(self) -> Reference:
        """The shared program's outputs, or those of the approximation the options ask this
        target to compute (``Exporter.proof_program``), computed once per job."""
        if self._approximated is None:
            approx = self.exporter.proof_program(self.shared.exported_program, self.options)
            self._approximation = None if approx is None else approx[0]
            self._approximated = (
                self.reference if approx is None else approximated(self.reference, self.shared, *approx)
            )
        return self._approximated

    def _complete(self) -> Published:
        seconds = lambda: time.perf_counter() - self._t0  # noqa: E731
        staged = self._staged
        if staged is not None:
            try:
                proof = self._prove(staged.files[0])
            except DualExportError as exc:  # a previous file that does not compute this program
                self._because = f"the {staged.strategy} file failed its proof: {exc.message}"
                logger.warning("%s: %s; lowering again", self.target, self._because)
                _remove(staged.files)
                self._staged = None
                self.start()
                if self._error is not None:
                    raise self._error from None
                return self._complete()
            if staged.strategy == "reused":
                return Reused(
                    self.target,
                    staged.files,
                    staged.ops,
                    staged.delegation,
                    seconds(),
                    proof,
                    derived_copies=staged.derived_copies,
                    cache_key=self.keys.cache,
                )
            return Patched(
                self.target,
                staged.files,
                staged.ops,
                staged.delegation,
                seconds(),
                proof,
                weight_notes=staged.weight_notes,
                derived_copies=staged.derived_copies,
                patched=staged.patched,
                copies=staged.copies,
            )
        assert self._lower is not None
        forked = self._forked
        if forked is not None:
            with self._lowering:
                lowered = forked.result() or self._lower()
        else:
            with stage(f"{self.target}: lower"):
                lowered = self._lower()
        if weight_bytes(self.shared.exported_program) >= RELEASE_MEMORY_ABOVE:
            release_memory()  # the lowering's garbage must not stack under the smoke runs
        if lowered.kept_not_shared:
            # the constants dualexport's own passes made for this target (folded masks and
            # position tables, XNNPACK layouts) are expected; anything else is worth a warning
            ours = all(
                n.removeprefix("c_").startswith(OWN_CONSTANT_PREFIXES) for n in lowered.kept_not_shared
            )
            logger.log(
                logging.DEBUG if ours else logging.WARNING,
                "%s keeps tensors that are not the holder's objects: %s",
                self.target,
                list(lowered.kept_not_shared),
            )
        if self.require_full_delegation and self.target == "xnnpack":
            check_full_delegation(lowered.delegation, self._decomposed)
        proof = self._prove(lowered.files[0])
        return Lowered(
            self.target,
            lowered.files,
            lowered.ops,
            lowered.delegation,
            seconds(),
            proof,
            weight_notes=lowered.weight_notes,
            derived_copies=lowered.derived_copies,
            because=self._because,
            kept_tensors=lowered.kept_tensors,
            kept_not_shared=lowered.kept_not_shared,
            forked=forked is not None,
            backend_passes=lowered.backend_passes,
            opset=lowered.opset,
        )

    def _stage(self, outcome: Published) -> Published:
        """Move the proven files into the set's folder (the set commits them all at once)."""
        return outcome.with_files(commit_files(outcome.files, self.set_dir))


def _summarize(lowered: LoweredTarget, holder_ids: set[int]) -> _Lowering:
    kept = lowered.kept_tensors
    return _Lowering(
        files=lowered.files,
        ops=lowered.ops,
        delegation=lowered.delegation,
        weight_notes=dict(lowered.weight_notes),
        derived_copies=dict(lowered.derived_copies),
        kept_tensors=len(kept),
        kept_not_shared=tuple(sorted(k for k, v in kept.items() if id(v) not in holder_ids and v.dim() > 0)),
        backend_passes=lowered.backend_passes,
        opset=lowered.opset,
    )


def _remove(files: Any) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            pathlib.Path(f).unlink()

"""``dx.export`` and ``dx.compare``: the glue between the shared program, the targets, the
weight manifest and the parity check."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from ._memory import release_memory
from ._versions import library_versions
from .errors import (
    DualExportError,
    InputError,
    InternalError,
    LoweringError,
    OnnxLoweringError,
    RuntimeExecutionError,
    XnnpackLoweringError,
)
from .exporters import DelegationReport, ExportOptions, LoweredTarget, get_exporter, normalize_targets
from .exporters.cache import link_previous_files, previous_manifest, target_cache_key
from .exporters.forked import ForkedCall, parallel_worthwhile
from .outputs import atomic_write_text, check_name, commit_files, prepare_out_dir, staging_dir
from .outputs.commit import ArtifactSet, artifact_set
from .validation import check_full_delegation, estimate_export_bytes, validate_export_request
from .parity.compare import run_parity
from .parity.report import ParityReport
from .shared_state import ProgramFingerprint, SharedProgram
from .weights import WeightCheck, WeightManifest, verify_manifest
from .weights.locate import build_entries, holder_tensors, locate_onnx, locate_pte
from .weights.readers import read_onnx, read_pte

__all__ = ["Artifact", "ExportResult", "export", "compare"]

logger = logging.getLogger(__name__)

_LOWERING_ERRORS = {"onnx": OnnxLoweringError, "xnnpack": XnnpackLoweringError}


@dataclass(frozen=True)
class Artifact:
    """One target's files on disk, and what lowering learned about it."""

    target: str
    path: pathlib.Path
    files: tuple[pathlib.Path, ...]
    ops: tuple[str, ...]
    seconds: float
    delegation: DelegationReport | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportResult:
    program: SharedProgram
    artifacts: Mapping[str, Artifact]
    errors: Mapping[str, DualExportError]
    manifest: WeightManifest
    out_dir: pathlib.Path
    name: str
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors

    def verify_weights(self) -> WeightCheck:
        """Re-read every artifact from disk; raise WeightMismatchError naming each entry that a
        file or the holder no longer matches."""
        return verify_manifest(self.manifest, self.out_dir, holder_tensors(self.program.exported_program))


def _lower_target(shared: SharedProgram, target: str, out_dir: pathlib.Path, name: str,
                  options: ExportOptions, *, require_full_delegation: bool = False
                  ) -> tuple[Artifact, LoweredTarget]:
    """Decompose, lower into a staging folder, smoke-run from disk, then commit the files."""
    stages = _target_stages(shared, target, out_dir, name, options,
                            require_full_delegation=require_full_delegation, fork=False)
    next(stages)
    return _finish(stages)


def _finish(stages: Generator[None, None, tuple[Artifact, LoweredTarget]]) -> tuple[Artifact, LoweredTarget]:
    try:
        next(stages)
    except StopIteration as done:
        return done.value
    raise AssertionError("target stages yield once")


def _target_stages(shared: SharedProgram, target: str, out_dir: pathlib.Path, name: str,
                   options: ExportOptions, *, require_full_delegation: bool, fork: bool
                   ) -> Generator[None, None, tuple[Artifact, LoweredTarget]]:
    """One target's export as stages: it yields once the lowering has started (in a forked
    child when ``fork``), so the caller can do the other target's work meanwhile."""
    exporter = get_exporter(target)
    start = time.perf_counter()
    with shared.guard(target):
        decomposed = shared.decompose(target, exporter.decompose)
        with staging_dir(out_dir) as staging:
            holder_ids = {id(t) for t in holder_tensors(shared.exported_program).values()}

            def lower() -> LoweredTarget:
                try:
                    lowered = exporter.lower(decomposed, staging, name, options)
                except DualExportError:
                    raise
                except Exception as exc:
                    raise _LOWERING_ERRORS[target](
                        f"lowering failed: {type(exc).__name__}: {exc}", target=target,
                        hint="see the chained exception") from exc
                return _summarize_kept(lowered, holder_ids)

            forked = ForkedCall(lower, label=target) if fork else None
            try:
                yield
            except GeneratorExit:  # abandoned (the other target raised past us): no orphan
                if forked is not None:
                    forked.cancel()
                raise
            lowered = (forked.result() if forked is not None else None) or lower()
            if _weight_bytes(shared) >= _RELEASE_MEMORY_ABOVE:
                release_memory()  # the lowering's garbage must not stack under the smoke run
            if require_full_delegation and target == "xnnpack":
                check_full_delegation(lowered.delegation, decomposed)
            _smoke_run(shared, target, lowered.files[0])
            files = commit_files(lowered.files, out_dir)
    not_shared = lowered.details["kept_not_shared"]
    if not_shared:
        logger.warning("%s keeps tensors that are not the holder's objects: %s", target, list(not_shared))
    art = Artifact(target=target, path=files[0], files=files, ops=lowered.ops,
                   seconds=time.perf_counter() - start, delegation=lowered.delegation,
                   details={**lowered.details, "forked": forked is not None})
    return art, lowered


def _start(shared: SharedProgram, target: str, out_dir: pathlib.Path, name: str, options: ExportOptions,
           require_full_delegation: bool) -> Generator[None, None, tuple[Artifact, LoweredTarget]]:
    stages = _target_stages(shared, target, out_dir, name, options,
                            require_full_delegation=require_full_delegation, fork=True)
    next(stages)
    return stages


def _guarded(errors: dict[str, DualExportError], target: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``None`` with the target's error recorded: one target's failure never stops
    the other."""
    try:
        return fn()
    except DualExportError as exc:
        logger.error("%s", exc)
        errors[target] = exc
    except Exception as exc:  # a library failure we did not anticipate
        errors[target] = InternalError(f"{target}: {type(exc).__name__}: {exc}", target=target)
        errors[target].__cause__ = exc
        logger.error("%s", errors[target])
    return None


def _summarize_kept(lowered: LoweredTarget, holder_ids: set[int]) -> LoweredTarget:
    """Replace the tensors the lowered program keeps by their count and the names that are not
    the holder's own objects (invariant 2), so the result is small and crosses a process."""
    kept = lowered.details.get("kept_tensors", {})
    not_shared = tuple(sorted(k for k, v in kept.items() if id(v) not in holder_ids))
    details = {**lowered.details, "kept_tensors": len(kept), "kept_not_shared": not_shared}
    return dataclasses.replace(lowered, details=details)


#: Below this many weight bytes a full garbage collection (~0.5 s on a transformer) costs more
#: than the memory it returns.
_RELEASE_MEMORY_ABOVE = 64 << 20


def _weight_bytes(shared: SharedProgram) -> int:
    return sum(t.numel() * t.element_size() for t in holder_tensors(shared.exported_program).values())


def _reuse_target(shared: SharedProgram, target: str, key: str, prev: WeightManifest,
                  previous: pathlib.Path, out: pathlib.Path, name: str) -> Artifact | None:
    """A cache hit: the previous set holds this target's artifact for the very same program.

    The files are linked into the new set and proven from disk against the previous manifest;
    the target's decomposition is deferred: ``program.decomposed[target]`` computes and links it
    on first access (about 60% of a hit's time went to decompositions nothing read).
    """
    info = prev.artifacts.get(target)
    if not info or info.get("cache_key") != key:
        return None
    start = time.perf_counter()
    files = link_previous_files(previous, out, list(info["files"]))
    if files is None:
        return None
    # The key already covers every weight's digest, so the holder needs no rehash: only the
    # linked files are re-read and checked against the previous manifest.
    single = WeightManifest(prev.entries, {target: info}, prev.versions, prev.program)
    try:
        verify_manifest(single, out, None)
    except DualExportError as exc:
        logger.warning("cached %s artifact does not verify, lowering again: %s", target, exc)
        for f in files:
            f.unlink(missing_ok=True)
        return None
    shared.defer_decomposition(target, get_exporter(target).decompose)
    delegation = _previous_delegation(info)
    main = out / info["file"]
    logger.info("%s: reused %s (cache key %s...)", target, info["file"], key[:12])
    return Artifact(target=target, path=main, files=(main, *[f for f in files if f != main]),
                    ops=tuple(info.get("ops", ())), seconds=time.perf_counter() - start,
                    delegation=delegation, details={"cached": True, "cache_key": key})


def _previous_delegation(info: Mapping[str, Any]) -> DelegationReport | None:
    return DelegationReport.from_dict(info["delegation"]) if info.get("delegation") else None


def _patch_target(shared: SharedProgram, target: str, structure_key: str, prev: WeightManifest,
                  previous: pathlib.Path, out: pathlib.Path, name: str
                  ) -> tuple[Artifact, LoweredTarget] | None:
    """A weights-only change: the previous file patched with the new bytes, or None (lower).

    Only when the previous artifact was made for the same graph, shapes, options and versions
    (its structure key) and every changed weight is stored there exactly; the patched copy is then
    smoke-run and, like any lowering, proven by the manifest re-read from disk.
    """
    from .exporters.patch import patch_files, plan_patch

    info = prev.artifacts.get(target)
    if not info or info.get("structure_key") != structure_key:
        return None
    changes = plan_patch(target, prev.entries, shared.weight_digests(),
                         holder_tensors(shared.exported_program))
    if not changes:
        return None
    start = time.perf_counter()
    try:
        with shared.guard(target):
            with staging_dir(out) as staging:
                files = patch_files(target, previous, staging, list(info["files"]), changes)
                _smoke_run(shared, target, files[0])
                files = tuple(commit_files(files, out))
    except (ValueError, OSError, DualExportError) as exc:
        logger.warning("%s: weights-only patch not applied (%s); lowering again", target, exc)
        return None
    # Same graph, so the same reasons for weights the target does not store as-is; the
    # decomposition is deferred as on a cache hit.
    shared.defer_decomposition(target, get_exporter(target).decompose)
    notes = {n: loc.reason for e in prev.entries for loc in [e.locations.get(target)]
             if loc is not None and loc.status == "not_stored" and loc.reason for n in e.names}
    delegation = _previous_delegation(info)
    lowered = LoweredTarget(target=target, files=files, ops=tuple(info.get("ops", ())),
                            delegation=delegation, weight_notes=notes,
                            details={"patched": len(changes)})
    logger.info("%s: weights-only change, %d weight(s) patched into %s", target, len(changes), files[0].name)
    return Artifact(target=target, path=files[0], files=files, ops=lowered.ops,
                    seconds=time.perf_counter() - start, delegation=delegation,
                    details={"patched": len(changes), "structure_key": structure_key}), lowered


def _smoke_run(shared: SharedProgram, target: str, path: pathlib.Path) -> None:
    """Load the artifact from disk in its runtime and run it once on the example inputs."""
    from .runtimes import open_runner
    from .runtimes.eager import flatten_inputs

    runner = open_runner(target, path, lean=True)
    flat = flatten_inputs(shared.exported_program, shared.example_args, shared.example_kwargs)
    outs = runner.run(flat)
    if not outs:
        raise RuntimeExecutionError(f"{path.name} ran but returned no outputs", target=target)


def _manifest(shared: SharedProgram, artifacts: Mapping[str, Artifact],
              lowered: Mapping[str, LoweredTarget], name: str, keys: Mapping[str, str],
              structure: Mapping[str, str], reused: Mapping[str, WeightManifest],
              fp: ProgramFingerprint) -> WeightManifest:
    program = shared.exported_program
    digests = shared.weight_digests()
    entries = build_entries(program, digests)
    tensors = holder_tensors(program)
    stores: dict[str, Any] = {}
    for target, art in artifacts.items():
        if target not in reused:
            stores[target] = read_onnx(art.path) if target == "onnx" else read_pte(art.path)
    located = []
    for e in entries:
        locs = {}
        for target, store in stores.items():
            notes = lowered[target].weight_notes
            if target == "onnx":
                locs[target] = locate_onnx(e, store, notes)
            else:
                locs[target] = locate_pte(e, tensors.get(e.name), store, notes)
        for target, prev in reused.items():  # same program, same key: the same locations
            locs[target] = prev.entry(e.name).locations[target]
        located.append(type(e)(**{**e.__dict__, "locations": {t: locs[t] for t in artifacts}}))
    return WeightManifest(
        entries=tuple(located),
        artifacts={t: {"file": a.path.name, "files": [f.name for f in a.files], "cache_key": keys.get(t),
                       "structure_key": structure.get(t),
                       "ops": list(a.ops),
                       "delegation": a.delegation.to_dict() if a.delegation is not None else None}
                   for t, a in artifacts.items()},
        versions=library_versions(),
        program={"graph_sha256": fp.graph, "shapes_sha256": fp.shapes, "file": f"{name}.pt2"},
    )


def export(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    target: str | Sequence[str] = ("onnx", "xnnpack"),
    out_dir: str | os.PathLike = "dualexport_out",
    name: str = "model",
    dynamic_shapes: Any = None,
    transforms: Sequence[Callable[..., Any]] = (),
    quantize: str | None = None,
    calibration: Iterable[tuple[Any, ...]] | None = None,
    strict: bool = False,
    require_full_delegation: bool = False,
    optimize: bool = False,
    cache: bool = True,
    options: ExportOptions | None = None,
) -> ExportResult:
    """Trace once, transform once, lower to each target from the one shared program, write
    ``<name>.onnx`` / ``<name>.pte`` / ``<name>.weights.json`` into ``out_dir``.

    A failing target does not stop the others (its error is in ``res.errors``) unless
    ``strict=True``, which raises the first target error.
    """
    targets = normalize_targets(target)
    validate_export_request(model, args, kwargs, quantize=quantize, calibration=calibration,
                            dynamic_shapes=dynamic_shapes)
    name = check_name(name)
    out = prepare_out_dir(out_dir)
    # One set: everything is staged in tx.dir and committed together on a clean exit; an
    # exception (strict=True included) or a kill leaves the previous set as it was.
    with artifact_set(out, name, need_bytes=estimate_export_bytes(model, targets)) as tx:
        res = _export_locked(model, args, kwargs, targets=targets, out=tx.dir, name=name,
                             dynamic_shapes=dynamic_shapes, transforms=transforms,
                             quantize=quantize, calibration=calibration, strict=strict,
                             options=options or ExportOptions(),
                             require_full_delegation=require_full_delegation, optimize=optimize,
                             previous=tx.out_dir if cache else None)
    return _committed(res, tx)


def _committed(res: ExportResult, tx: ArtifactSet) -> ExportResult:
    """The result as committed: built while its files sat in the staging folder."""
    arts = {t: dataclasses.replace(a, path=tx.final(a.path), files=tuple(tx.final(f) for f in a.files))
            for t, a in res.artifacts.items()}
    return dataclasses.replace(res, artifacts=MappingProxyType(arts), out_dir=tx.out_dir)


def _export_locked(model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None, *,
                   targets: tuple[str, ...], out: pathlib.Path, name: str, dynamic_shapes: Any,
                   transforms: Sequence[Callable[..., Any]], quantize: str | None,
                   calibration: Iterable[tuple[Any, ...]] | None, strict: bool,
                   options: ExportOptions, require_full_delegation: bool = False,
                   optimize: bool = False, previous: pathlib.Path | None = None) -> ExportResult:
    t0 = time.perf_counter()
    shared = SharedProgram.capture(model, args, kwargs, dynamic_shapes)
    if optimize:
        # Shared-program passes (constant folding, XNNPACK-friendly rewrites): applied once,
        # before the user's transforms, so both targets get them.
        from .shared_state.passes import DEFAULT_PASSES

        transforms = (*DEFAULT_PASSES, *transforms)
    if transforms:
        shared.apply_transforms(transforms)
    if quantize is not None:
        from .shared_state.quantize import quantize_shared

        quantize_shared(shared, quantize, calibration)
    shared.weight_digests()
    seconds: dict[str, float] = {"capture": shared.capture_seconds}
    artifacts: dict[str, Artifact] = {}
    lowered: dict[str, LoweredTarget] = {}
    errors: dict[str, DualExportError] = {}
    fp = shared.fingerprint(rehash=False)
    extra = {"require_full_delegation": require_full_delegation}
    keys = {t: target_cache_key(fp, t, options, extra) for t in targets}
    structure = {t: target_cache_key(fp, t, options, extra, weights=False) for t in targets}
    prev = previous_manifest(previous, name) if previous is not None else None
    reused: dict[str, WeightManifest] = {}
    todo = []
    for t in targets:
        hit = _reuse_target(shared, t, keys[t], prev, previous, out, name) if prev is not None else None
        if hit is None and prev is not None:
            patched = _patch_target(shared, t, structure[t], prev, previous, out, name)
            if patched is not None:
                artifacts[t], lowered[t] = patched
                seconds[t] = artifacts[t].seconds
                continue
        if hit is None:
            todo.append(t)
            continue
        artifacts[t] = hit
        reused[t] = prev
        seconds[t] = hit.seconds
    parallel = options.parallel if options.parallel is not None else \
        parallel_worthwhile(_weight_bytes(shared))
    # With two targets to lower and a free core, XNNPACK (the long one) lowers in a forked
    # child while this process exports ONNX; the child lowers the holder's own tensors.
    background = "xnnpack" if parallel and set(todo) == {"onnx", "xnnpack"} else None
    pending = None
    if background is not None:
        pending = _guarded(errors, background, lambda: _start(
            shared, background, out, name, options, require_full_delegation))
    for t in todo:
        if t == background:
            continue
        done = _guarded(errors, t, lambda: _lower_target(
            shared, t, out, name, options, require_full_delegation=require_full_delegation))
        if done is not None:
            artifacts[t], lowered[t] = done
            seconds[t] = artifacts[t].seconds
    if pending is not None:
        done = _guarded(errors, background, lambda: _finish(pending))
        if done is not None:
            artifacts[background], lowered[background] = done
            seconds[background] = artifacts[background].seconds
    artifacts = {t: artifacts[t] for t in targets if t in artifacts}  # the order asked for
    manifest = _manifest(shared, artifacts, lowered, name, keys, structure, reused, fp)
    if artifacts:
        atomic_write_text(out / f"{name}.weights.json", manifest.to_json())
        shared.save(str(out / f"{name}.pt2"))  # ``out`` is the set's staging folder
        from .parity.inputs import save_inputs
        from .runtimes.eager import flatten_inputs

        save_inputs(out / f"{name}.inputs.npz",
                    flatten_inputs(shared.exported_program, shared.example_args, shared.example_kwargs))
    if "xnnpack" in artifacts and artifacts["xnnpack"].delegation is not None:
        d = artifacts["xnnpack"].delegation
        atomic_write_text(out / f"{name}.delegation.json", json.dumps(d.to_dict(), indent=2) + "\n")
        atomic_write_text(out / f"{name}.delegation.md", d.to_markdown())
    for problem in manifest.problems():
        logger.warning("weight manifest: %s", problem)
    seconds["total"] = time.perf_counter() - t0
    res = ExportResult(shared, MappingProxyType(artifacts), MappingProxyType(errors), manifest, out,
                       name, MappingProxyType(seconds))
    if strict and errors:
        raise next(iter(errors.values()))
    return res


def compare(res: ExportResult, inputs: Iterable[Any] | str | os.PathLike | None = None, *,
            rtol: float | None = None, atol: float | None = None, steps: int = 1,
            tolerances: Mapping[int, tuple[float, float]] | None = None,
            generate: int = 0) -> ParityReport:
    """Eager (the shared program) vs ONNX Runtime vs ExecuTorch, from the files on disk.

    ``inputs``: extra argument tuples, or a .npz/.pt file of them. ``tolerances``: per output
    index ``(rtol, atol)``, over the table's defaults. ``generate``: that many extra random seeds,
    plus large-magnitude and all-zero sets shaped like the example (integer inputs stay in range).
    """
    from .parity.inputs import extra_input_sets
    from .runtimes.eager import flatten_inputs

    shared = res.program
    example_flat = flatten_inputs(shared.exported_program, shared.example_args, shared.example_kwargs)
    sets = [("example", shared.example_args, shared.example_kwargs)]
    sets += extra_input_sets(shared.exported_program, example_flat, inputs, generate)
    paths = {t: a.path for t, a in res.artifacts.items()}
    if not paths:
        raise InputError("no artifact to compare: every target failed",
                         hint="look at res.errors for why each target failed")
    return run_parity(shared.exported_program, paths, sets, rtol=rtol, atol=atol, steps=steps,
                      decomposed=shared.decomposed, tolerance_overrides=tolerances)

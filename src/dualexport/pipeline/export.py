"""One export as a set: trace once, transform once, run one job per target from the shared
program, then write the manifest and the side files into the set's staging folder (the caller
commits the folder as a whole)."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from .._stages import stage
from ..errors import typed_errors
from ..exporters import ExportOptions, get_exporter
from ..exporters.cache import link_previous_files, previous_manifest, target_cache_key
from ..exporters.forked import parallel_worthwhile
from ..outputs import atomic_write_text, raise_if_interrupted
from ..parity.inputs import save_inputs
from ..shared_state import SharedProgram
from ..shared_state.contract import edge_sizes, flatten_inputs
from ..shared_state.passes import ProgramPass
from ..shared_state.request import weight_bytes
from ..weights import WeightManifest
from .job import JobKeys, Previous, TargetJob
from .manifest import build_manifest
from .outcome import Failed, Outcome, Published, Reused
from .reference import reference_sets

__all__ = ["SetResult", "export_set", "cache_keys", "shared_passes", "pass_lists"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SetResult:
    """The shared program, each target's outcome (in the order asked for) and the manifest."""

    program: SharedProgram
    outcomes: Mapping[str, Outcome]
    manifest: WeightManifest
    seconds: Mapping[str, float]


def shared_passes(options: ExportOptions) -> tuple[ProgramPass, ...]:
    """dualexport's own passes on the shared program that ``options`` turns on, in order."""
    from ..shared_state.passes import AFTER_FOLDING, CANONICALIZATIONS, FoldConstants

    return (
        *(CANONICALIZATIONS if options.canonicalize else ()),
        *((FoldConstants(),) if options.fold_constants else ()),
        *(AFTER_FOLDING if options.canonicalize else ()),
    )


def pass_lists(targets: Sequence[str], options: ExportOptions) -> dict[str, tuple[str, ...]]:
    """The passes each program gets: the shared program's, then each target's own."""
    out = {"shared": tuple(p.name for p in shared_passes(options))}
    out.update({t: get_exporter(t).passes(options) for t in targets})
    return out


def _capture(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] | None,
    kwargs: Mapping[str, Any] | None,
    dynamic_shapes: Any,
    transforms: Sequence[Callable[..., Any]],
    quantize: str | None,
    calibration: Iterable[tuple[Any, ...]] | None,
    options: ExportOptions,
    targets: Sequence[str],
) -> SharedProgram:
    """Trace once; then the user's transforms, quantization, and dualexport's shared passes
    (canonicalizations and constant folding run last, on the program both targets get). A given
    ExportedProgram is taken as the shared program, not traced again."""
    with stage("capture"):
        if isinstance(model, torch.export.ExportedProgram):
            shared = SharedProgram.from_program(model, args, kwargs)
        else:
            assert args is not None  # validate_export_request refuses a module without args
            shared = SharedProgram.capture(model, args, kwargs, dynamic_shapes)
    if transforms:
        with stage("transforms"):
            shared.apply_transforms(transforms)
    if quantize is not None:
        from ..shared_state.quantize import quantize_shared

        with stage("quantization"):
            quantize_shared(shared, quantize, calibration, targets=targets)
    passes = shared_passes(options)
    if passes:
        with stage("shared passes"):
            shared.apply_passes(passes)
    shared.weight_digests()  # the baseline every pin compares with
    return shared


def cache_keys(
    shared: SharedProgram,
    targets: Sequence[str],
    options: ExportOptions,
    *,
    require_full_delegation: bool = False,
    quantize: str | None = None,
) -> dict[str, JobKeys]:
    """Each target's cache and structure keys: the program's fingerprint (graph text without
    stack traces, weight digests, shape environment), the target, its options, the library
    versions and dualexport's own source digest, and everything else asked of the export."""
    fp = shared.fingerprint(rehash=False)
    extra = {
        "require_full_delegation": require_full_delegation,
        "quantize": quantize,
        "transforms": [r.name for r in shared.transforms],
    }
    return {
        t: JobKeys(
            target_cache_key(fp, t, options, extra), target_cache_key(fp, t, options, extra, weights=False)
        )
        for t in targets
    }


def export_set(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    targets: tuple[str, ...],
    set_dir: pathlib.Path,
    previous_dir: pathlib.Path | None,
    name: str,
    dynamic_shapes: Any,
    transforms: Sequence[Callable[..., Any]],
    quantize: str | None,
    calibration: Iterable[tuple[Any, ...]] | None,
    options: ExportOptions,
    require_full_delegation: bool,
    bundle: bool = False,
) -> SetResult:
    t0 = time.perf_counter()
    shared = _capture(
        model, args, kwargs, dynamic_shapes, transforms, quantize, calibration, options, targets
    )
    if bundle:
        from .bundles import check_bundleable

        check_bundleable(shared)
    for which, names in pass_lists(targets, options).items():
        logger.info("passes for %s: %s", which, ", ".join(names) or "none")
    fp = shared.fingerprint(rehash=False)
    keys = cache_keys(
        shared, targets, options, require_full_delegation=require_full_delegation, quantize=quantize
    )
    prev_manifest = previous_manifest(previous_dir, name) if previous_dir is not None else None
    previous = Previous(previous_dir, prev_manifest) if previous_dir and prev_manifest else None
    program = shared.exported_program
    example = flatten_inputs(program, shared.example_args, shared.example_kwargs)
    with stage("reference outputs"):
        reference = reference_sets(shared, example, edge_sizes(program))
    jobs = {
        t: TargetJob(
            shared,
            t,
            set_dir=set_dir,
            name=name,
            options=options,
            keys=keys[t],
            previous=previous,
            reference=reference,
            require_full_delegation=require_full_delegation,
        )
        for t in targets
    }
    outcomes = _run_jobs(shared, jobs, options)
    outcomes = {t: outcomes[t] for t in targets}
    published: dict[str, Published] = {t: o for t, o in outcomes.items() if not isinstance(o, Failed)}
    bundles = {}
    if bundle and published:
        from .bundles import write_bundles

        bundles = write_bundles(shared, published, set_dir, name, example)
    with stage("weight manifest"):
        manifest = build_manifest(shared, published, keys, previous, name, fp, options, bundles)
    if published:
        reused = _link_previous_program(shared, previous, published, fp, set_dir, name)
        with stage("re-export cache"), typed_errors("writing the re-export cache and side files"):
            _write_side_files(shared, manifest, published, set_dir, name, example, program_linked=reused)
    for problem in manifest.problems():
        logger.warning("weight manifest: %s", problem)
    seconds = {
        "capture": shared.capture_seconds,
        "reference": reference.seconds,
        **{t: o.seconds for t, o in outcomes.items()},
        "total": time.perf_counter() - t0,
    }
    return SetResult(shared, MappingProxyType(outcomes), manifest, MappingProxyType(seconds))


def _run_jobs(
    shared: SharedProgram, jobs: dict[str, TargetJob], options: ExportOptions
) -> dict[str, Outcome]:
    """Every target's outcome: each job is prepared (a cache hit needs no lowering), then
    lowered; with two targets to lower and a free core, XNNPACK (the long one) lowers in a
    forked worker while this process runs the ONNX job (the worker lowers the holder's tensors).
    An unfinished job (an interrupt) is cancelled."""
    outcomes: dict[str, Outcome] = {}
    try:
        lowering = [t for t, job in jobs.items() if job.prepare()]
        parallel = (
            options.parallel
            if options.parallel is not None
            else parallel_worthwhile(weight_bytes(shared.exported_program))
        )
        background = "xnnpack" if parallel and set(lowering) == {"onnx", "xnnpack"} else None
        if background is not None:
            jobs[background].start(fork=True)
        for t, job in jobs.items():
            if t != background:
                if t in lowering:
                    job.start()
                outcomes[t] = job.finish()
                raise_if_interrupted()  # a Ctrl-C a library swallowed stops here, not at the commit
        if background is not None:
            outcomes[background] = jobs[background].finish()
    finally:
        for job in jobs.values():
            job.cancel()  # only an unfinished job (an interrupt) has anything to undo
    return outcomes


def _write_side_files(
    shared: SharedProgram,
    manifest: WeightManifest,
    published: Mapping[str, Published],
    set_dir: pathlib.Path,
    name: str,
    example: list[torch.Tensor],
    *,
    program_linked: bool = False,
) -> None:
    atomic_write_text(set_dir / f"{name}.weights.json", manifest.to_json())
    if not program_linked:
        shared.save(str(set_dir / f"{name}.pt2"))
        if shared.float_program is not None:  # int8: the float model its noise is measured against
            torch.export.save(shared.float_program, str(set_dir / f"{name}.float.pt2"))
    save_inputs(set_dir / f"{name}.inputs.npz", example)
    xnn = published.get("xnnpack")
    if xnn is not None and xnn.delegation is not None:
        d = xnn.delegation
        atomic_write_text(set_dir / f"{name}.delegation.json", json.dumps(d.to_dict(), indent=2) + "\n")
        atomic_write_text(set_dir / f"{name}.delegation.md", d.to_markdown())


def _link_previous_program(
    shared: SharedProgram,
    previous: Previous | None,
    published: Mapping[str, Published],
    fp: Any,
    set_dir: pathlib.Path,
    name: str,
) -> bool:
    """On a full hit, link the previous set's ``.pt2`` (and ``.float.pt2``) instead of
    serializing the program again: every target's key matched, and the keys cover the graph,
    each weight's digest, the ranges and the quantization, so the saved program is this one.
    Why: serializing was half of a hit (1.2 s of 2.3 s re-exporting tiny GPT-2), which a fleet
    re-run pays per entry."""
    if previous is None or not published or not all(isinstance(o, Reused) for o in published.values()):
        return False
    program = previous.manifest.program or {}
    if program.get("graph_sha256") != fp.graph or program.get("shapes_sha256") != fp.shapes:
        return False
    files = [f"{name}.pt2"] + ([f"{name}.float.pt2"] if shared.float_program is not None else [])
    if link_previous_files(previous.folder, set_dir, files) is not None:
        logger.info("program unchanged: %s linked from the previous set", ", ".join(files))
        return True
    for f in files:  # a half-linked pair: unlink before writing, never through the shared inode
        (set_dir / f).unlink(missing_ok=True)
    return False

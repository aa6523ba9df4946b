"""One entry of a batch, run in the current process: build the model, export it to both targets
into the entry's folder, verify the weights from disk, check parity, write the export's page and
return an ``EntryRecord``.

Why a rerun is cheap: the export's own cache reuses (or patches) each target whose key is
unchanged, and when every target is reused, the program and the files are byte for byte those the
previous run checked, so its weight and parity results are carried over (the record says so)
instead of running both runtimes again. Anything else (a patched or lowered target, different
check settings) runs the checks in full.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import resource
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import DualExportError, UserError, WeightMismatchError
from ..outputs import atomic_write_text
from ..outputs.atomic import atomic_write_bytes
from .manifest import Entry, entry_digest
from .record import EntryRecord, FileRecord, ParitySummary, TargetRecord

__all__ = ["run_entry", "build_model", "entry_files", "file_record", "ENTRY_SUFFIX", "peak_rss_mb"]

logger = logging.getLogger(__name__)

#: The entry's own record, beside its artifacts: what the next run compares its keys with.
ENTRY_SUFFIX = ".entry.json"

Phase = Callable[[str], None]


def peak_rss_mb() -> float:
    """This process's peak RSS plus the largest of its children's (forked exporters, isolated
    runtimes): an upper bound of what the entry needed at once."""
    own = 0.0
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                own = int(line.split()[1]) / 1024
    if not own:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return own + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def instantiate(entry: Entry) -> Any:
    """The entry's model as its factory or Hugging Face config makes it (on whatever device is
    the default: the estimate builds it on the meta device)."""
    from ..loading import hf_model, load_model

    if entry.hf is not None:
        return hf_model(
            entry.hf,
            entry.config,
            model_class=entry.model_class,
            task=entry.task,
            input_names=entry.input_names,
            outputs=entry.outputs,
            attention=entry.attention,
            seed=entry.seed,
        )
    assert entry.model is not None
    return load_model(entry.model, search_path=entry.search_path)


def build_model(entry: Entry) -> tuple[Any, tuple[Any, ...], Any]:
    """The entry's model (seeded, eval mode, BatchNorm statistics settled when asked), its
    example arguments and its dynamic shapes spec."""
    import torch

    from ..loading import build_dynamic_shapes, settle_batchnorm

    torch.manual_seed(entry.seed)
    model = instantiate(entry).eval()
    args = tuple(spec.make(seed=entry.seed + i) for i, spec in enumerate(entry.inputs))
    if entry.bn_batches:
        batches = [
            tuple(spec.make(seed=1000 + 31 * b + i) for i, spec in enumerate(entry.inputs))
            for b in range(entry.bn_batches)
        ]
        settle_batchnorm(model, batches)
    dynamic = build_dynamic_shapes(entry.dynamic, entry.inputs, model=model)
    return model, args, dynamic


def file_record(path: pathlib.Path, folder: pathlib.Path) -> FileRecord:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return FileRecord(path.relative_to(folder).as_posix(), path.stat().st_size, h.hexdigest())


def entry_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every published file of an entry's folder (the set, its records, the page), without
    locks, staging folders or temp files: what travels back from a remote worker."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file() or p.is_symlink():
            continue
        if any(part.startswith(".dualexport-staging-") for part in rel.parts):
            continue
        if p.name.endswith((".tmp", ".lock")):
            continue
        out.append(p)
    return out


def _summary(report: Any, runtime: str) -> ParitySummary:
    ms = [o.metrics[runtime] for o in report.outputs if runtime in o.metrics]
    if runtime in report.errors or not ms:
        nan = float("nan")
        return ParitySummary(False, nan, nan, nan, 100.0)
    return ParitySummary(
        ok=all(m.ok for m in ms),
        max_abs=max(m.max_abs for m in ms),
        snr_db=min(m.snr_db for m in ms),
        cosine=min(m.cosine for m in ms),
        mismatch_pct=max(m.mismatch_pct for m in ms),
    )


def _previous(folder: pathlib.Path, name: str) -> EntryRecord | None:
    try:
        return EntryRecord.from_dict(json.loads((folder / f"{name}{ENTRY_SUFFIX}").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str, phase: Phase | None) -> Iterator[None]:
    if phase is not None:
        phase(name)
    t = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, DualExportError) else f"{type(exc).__name__}: {exc}"


def run_entry(
    entry: Entry, out_dir: pathlib.Path, *, phase: Phase | None = None, attempts: int = 1
) -> EntryRecord:
    """Export ``entry`` into ``out_dir/<name>/`` and check it; never raises for the entry's own
    problems (they are the record's status and reason)."""
    from .. import api
    from ..pipeline import Reused

    t0 = time.perf_counter()
    folder = out_dir / entry.name
    digest = entry_digest(entry)
    phases: dict[str, float] = {}
    base = EntryRecord(
        entry.name,
        "error",
        line=entry.line,
        folder=entry.name,
        attempts=attempts,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        digest=digest,
        started=round(time.time(), 3),
    )

    def done(rec: EntryRecord) -> EntryRecord:
        rec = rec.with_(seconds=time.perf_counter() - t0, phases=dict(phases), peak_rss_mb=peak_rss_mb())
        with contextlib.suppress(DualExportError, OSError):
            if folder.is_dir():
                atomic_write_text(folder / f"{entry.name}{ENTRY_SUFFIX}", json.dumps(rec.to_dict(), indent=2))
        return rec

    try:
        with _timed(phases, "load", phase):
            model, args, dynamic = build_model(entry)
            import torch

            from ..loading import outputs_constant
            from ..shared_state.request import weight_bytes

            with torch.no_grad():
                eager_out = model(*args)
            vacuous = outputs_constant(eager_out)
            wbytes = weight_bytes(model)
        calibration = None
        if entry.quantize:
            calibration = [
                tuple(spec.make(seed=2000 + 17 * b + i) for i, spec in enumerate(entry.inputs))
                for b in range(max(entry.calibration, 1))
            ]
    except Exception as exc:
        logger.info("entry %s could not load", entry.name, exc_info=True)
        return done(base.with_(status="error", reason=_reason(exc)))
    previous = _previous(folder, entry.name)
    parity_file = folder / f"{entry.name}.parity.json"
    page = folder / f"{entry.name}.report.html"
    # The commit drops the previous set's parity report and page with it (outputs/commit.py); a
    # carried check writes them back.
    previous_parity = parity_file.read_text() if parity_file.is_file() else None
    previous_page = page.read_bytes() if page.is_file() else None
    base = base.with_(vacuous=vacuous, weight_bytes=wbytes)
    try:
        with _timed(phases, "export", phase):
            res = api.export(
                model,
                args,
                target=entry.targets,
                out_dir=folder,
                name=entry.name,
                dynamic_shapes=dynamic,
                quantize=entry.quantize,
                calibration=calibration,
                optimize=entry.optimize,
                bundle=entry.bundle,
            )
    except UserError as exc:
        return done(base.with_(status="error", reason=_reason(exc)))
    except Exception as exc:
        logger.info("entry %s failed to export", entry.name, exc_info=True)
        return done(base.with_(status="failed", reason=_reason(exc)))
    keys = {t: str(res.manifest.artifacts.get(t, {}).get("cache_key", "")) for t in res.artifacts}
    targets: dict[str, TargetRecord] = {}
    for t in entry.targets:
        if t in res.errors:
            err = res.errors[t]
            targets[t] = TargetRecord(t, False, error=str(err), error_type=type(err).__name__)
            continue
        art = res.artifacts[t]
        d = art.delegation
        targets[t] = TargetRecord(
            t,
            True,
            outcome=type(art.outcome).__name__.lower() if art.outcome is not None else None,
            seconds=art.seconds,
            files=tuple(file_record(f, folder) for f in art.files),
            delegated_share=None if d is None else round(d.delegated_share, 4),
            subgraphs=None if d is None else d.subgraphs,
        )
    carried = (
        previous is not None
        and previous.digest == digest
        and previous.status in ("passed", "check_failed")
        and dict(previous.keys) == keys
        and bool(res.artifacts)
        and not res.errors
        and all(isinstance(a.outcome, Reused) for a in res.artifacts.values())
    )
    weights_ok: bool | None = None
    parity_ok: bool | None = None
    reasons: list[str] = []
    report = None
    if carried:
        assert previous is not None
        weights_ok, parity_ok = previous.weights_ok, previous.parity_ok
        targets = {
            t: r if t not in previous.targets else r.with_(parity=previous.targets[t].parity)
            for t, r in targets.items()
        }
        if previous.reason:
            reasons.append(previous.reason)
        if previous_parity is not None and not parity_file.exists():  # the commit dropped it
            atomic_write_text(parity_file, previous_parity)
        if previous_page is not None and not page.exists():
            atomic_write_bytes(page, previous_page)
    elif res.artifacts:
        with _timed(phases, "verify", phase):
            try:
                res.verify_weights()
                weights_ok = True
            except WeightMismatchError as exc:
                weights_ok = False
                reasons.append(str(exc))
        if entry.compare:
            with _timed(phases, "compare", phase):
                try:
                    report = api.compare(
                        res, rtol=entry.rtol, atol=entry.atol, generate=entry.generate, edges=entry.edges
                    )
                except DualExportError as exc:
                    parity_ok = False
                    reasons.append(f"parity check could not run: {exc}")
            if report is not None:
                parity_ok = report.ok
                for t in list(targets):
                    if targets[t].ok and t in report.runtimes:
                        targets[t] = targets[t].with_(parity=_summary(report, t))
                atomic_write_text(parity_file, report.to_json())
                if not report.ok:
                    bad = [rt for rt in report.runtimes if not _summary(report, rt).ok]
                    reasons.append("parity failed for " + ", ".join(bad))
    if not carried:
        with _timed(phases, "report", phase):
            from ..reporting import write_export_page

            extra = {k: v for k, v in phases.items() if k in ("verify", "compare")}
            write_export_page(page, res, report, seconds=extra)
    if res.errors:
        status = "failed"
        reasons.insert(0, "; ".join(f"{t}: {str(e).splitlines()[0]}" for t, e in res.errors.items()))
    elif weights_ok is False or parity_ok is False:
        status = "check_failed"
    else:
        status = "passed"
    if vacuous:
        reasons.append("eager outputs are constant: parity proves nothing (set bn_batches, check the head)")
    return done(
        base.with_(
            status=status,
            reason="; ".join(reasons) or None,
            targets=targets,
            weights_ok=weights_ok,
            parity_ok=parity_ok,
            keys=keys,
            carried=carried,
            report=f"{entry.name}/{page.name}" if page.exists() else None,
        )
    )

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
from dataclasses import dataclass
from typing import Any

from ..errors import DualExportError, UserError
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
    return _EntryRun(entry, out_dir, phase, attempts).run()


@dataclass(frozen=True)
class _Loaded:
    """The entry's model and inputs, and what its eager outputs say."""

    model: Any
    args: tuple[Any, ...]
    dynamic: Any
    calibration: list[tuple[Any, ...]] | None
    vacuous: bool
    weight_bytes: int


@dataclass(frozen=True)
class _Previous:
    """What the entry's folder held before this run: its record and, for a carried check, the
    parity report and the page (the commit drops them with the set they describe)."""

    record: EntryRecord | None
    parity: str | None
    page: bytes | None


class _EntryRun:
    """One entry in stages: load, export, targets, checks (or carry the previous run's), record."""

    def __init__(self, entry: Entry, out_dir: pathlib.Path, phase: Phase | None, attempts: int) -> None:
        self.entry, self.phase = entry, phase
        self.t0 = time.perf_counter()
        self.folder = out_dir / entry.name
        self.digest = entry_digest(entry)
        self.phases: dict[str, float] = {}
        self.base = EntryRecord(
            entry.name,
            "error",
            line=entry.line,
            folder=entry.name,
            attempts=attempts,
            worker=f"{socket.gethostname()}:{os.getpid()}",
            digest=self.digest,
            started=round(time.time(), 3),
        )

    @property
    def parity_file(self) -> pathlib.Path:
        return self.folder / f"{self.entry.name}.parity.json"

    @property
    def page(self) -> pathlib.Path:
        return self.folder / f"{self.entry.name}.report.html"

    def done(self, rec: EntryRecord) -> EntryRecord:
        rec = rec.with_(
            seconds=time.perf_counter() - self.t0, phases=dict(self.phases), peak_rss_mb=peak_rss_mb()
        )
        with contextlib.suppress(DualExportError, OSError):
            if self.folder.is_dir():
                atomic_write_text(
                    self.folder / f"{self.entry.name}{ENTRY_SUFFIX}", json.dumps(rec.to_dict(), indent=2)
                )
        return rec

    def run(self) -> EntryRecord:
        try:
            loaded = self.load()
        except Exception as exc:
            logger.info("entry %s could not load", self.entry.name, exc_info=True)
            return self.done(self.base.with_(status="error", reason=_reason(exc)))
        previous = _Previous(
            _previous(self.folder, self.entry.name),
            self.parity_file.read_text() if self.parity_file.is_file() else None,
            self.page.read_bytes() if self.page.is_file() else None,
        )
        self.base = self.base.with_(vacuous=loaded.vacuous, weight_bytes=loaded.weight_bytes)
        try:
            res = self.export(loaded)
        except UserError as exc:
            return self.done(self.base.with_(status="error", reason=_reason(exc)))
        except Exception as exc:
            logger.info("entry %s failed to export", self.entry.name, exc_info=True)
            return self.done(self.base.with_(status="failed", reason=_reason(exc)))
        return self.done(self.checked(res, previous, loaded.vacuous))

    # ------------------------------------------------------------------------------ stages
    def load(self) -> _Loaded:
        entry = self.entry
        with _timed(self.phases, "load", self.phase):
            model, args, dynamic = build_model(entry)
            import torch

            from ..loading import outputs_constant
            from ..shared_state.request import weight_bytes

            with torch.no_grad():
                eager_out = model(*args)
            vacuous, wbytes = outputs_constant(eager_out), weight_bytes(model)
        calibration = None
        if entry.quantize:
            calibration = [
                tuple(spec.make(seed=2000 + 17 * b + i) for i, spec in enumerate(entry.inputs))
                for b in range(max(entry.calibration, 1))
            ]
        return _Loaded(model, args, dynamic, calibration, vacuous, wbytes)

    def export(self, loaded: _Loaded) -> Any:
        from .. import api

        entry = self.entry
        with _timed(self.phases, "export", self.phase):
            return api.export(
                loaded.model,
                loaded.args,
                target=entry.targets,
                out_dir=self.folder,
                name=entry.name,
                dynamic_shapes=loaded.dynamic,
                quantize=entry.quantize,
                calibration=loaded.calibration,
                optimize=entry.optimize,
                bundle=entry.bundle,
            )

    def targets(self, res: Any) -> dict[str, TargetRecord]:
        out: dict[str, TargetRecord] = {}
        for t in self.entry.targets:
            if t in res.errors:
                err = res.errors[t]
                out[t] = TargetRecord(t, False, error=str(err), error_type=type(err).__name__)
                continue
            art = res.artifacts[t]
            d = art.delegation
            out[t] = TargetRecord(
                t,
                True,
                outcome=type(art.outcome).__name__.lower() if art.outcome is not None else None,
                seconds=art.seconds,
                files=tuple(file_record(f, self.folder) for f in art.files),
                delegated_share=None if d is None else round(d.delegated_share, 4),
                subgraphs=None if d is None else d.subgraphs,
            )
        return out

    def carried(self, res: Any, previous: _Previous, keys: dict[str, str]) -> bool:
        """Every target reused for the same entry and keys: the previous checks still hold."""
        from ..pipeline import Reused

        rec = previous.record
        return (
            rec is not None
            and rec.digest == self.digest
            and rec.status in ("passed", "check_failed")
            and dict(rec.keys) == keys
            and bool(res.artifacts)
            and not res.errors
            and all(isinstance(a.outcome, Reused) for a in res.artifacts.values())
        )

    def checked(self, res: Any, previous: _Previous, vacuous: bool) -> EntryRecord:
        from ..reporting import CompareSettings, check_export

        entry = self.entry
        keys = {t: str(res.manifest.artifacts.get(t, {}).get("cache_key", "")) for t in res.artifacts}
        targets = self.targets(res)
        reasons: list[str] = []
        carried = self.carried(res, previous, keys)
        if carried:
            rec = previous.record
            assert rec is not None
            weights_ok, parity_ok = rec.weights_ok, rec.parity_ok
            targets = {
                t: r if t not in rec.targets else r.with_(parity=rec.targets[t].parity)
                for t, r in targets.items()
            }
            if rec.reason:
                reasons.append(rec.reason)
            if previous.parity is not None and not self.parity_file.exists():  # the commit dropped it
                atomic_write_text(self.parity_file, previous.parity)
            if previous.page is not None and not self.page.exists():
                atomic_write_bytes(self.page, previous.page)
        else:
            compare = (
                CompareSettings(entry.rtol, entry.atol, entry.generate, entry.edges)
                if entry.compare
                else None
            )
            checks = check_export(res, compare=compare, phase=self.phase, extra_seconds=None)
            self.phases.update(checks.seconds)
            weights_ok, parity_ok = checks.weights_ok, checks.parity_ok
            if checks.weight_error is not None:
                reasons.append(str(checks.weight_error))
            if checks.parity_error is not None:
                reasons.append(f"parity check could not run: {checks.parity_error}")
            report = checks.report
            if report is not None:
                for t in list(targets):
                    if targets[t].ok and t in report.runtimes:
                        targets[t] = targets[t].with_(parity=_summary(report, t))
                if not report.ok:
                    bad = [rt for rt in report.runtimes if not _summary(report, rt).ok]
                    reasons.append("parity failed for " + ", ".join(bad))
        if res.errors:
            status = "failed"
            reasons.insert(0, "; ".join(f"{t}: {str(e).splitlines()[0]}" for t, e in res.errors.items()))
        elif weights_ok is False or parity_ok is False:
            status = "check_failed"
        else:
            status = "passed"
        if vacuous:
            reasons.append(
                "eager outputs are constant: parity proves nothing (set bn_batches, check the head)"
            )
        return self.base.with_(
            status=status,
            reason="; ".join(reasons) or None,
            targets=targets,
            weights_ok=weights_ok,
            parity_ok=parity_ok,
            keys=keys,
            carried=carried,
            report=f"{entry.name}/{self.page.name}" if self.page.exists() else None,
        )

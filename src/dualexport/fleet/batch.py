"""``dx.batch``: a manifest's entries exported to both targets, each into its own folder of the
output folder, with one ``batch.json`` and one ``batch.html`` for the whole run.

Why re-running is the way to resume: every entry's export is cached by its key (the traced
program, weights, options and versions), so an interrupted batch run again reuses each entry that
finished and redoes only the rest; a changed entry is patched (weights only) or lowered again.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import time
from collections.abc import Sequence

from .._versions import library_versions
from ..errors import InputError
from ..outputs import atomic_write_text, export_lock, prepare_out_dir
from .diff import diff_batches, load_batch
from .estimate import Estimate, available_mb, estimate_entries
from .manifest import Entry, Malformed, Manifest, names_unique, read_manifest
from .memory import tree_pss_mb
from .progress import ProgressCallback
from .record import BatchRecord, EntryRecord
from .worker import ENTRY_SUFFIX

__all__ = ["batch", "BATCH_JSON", "BATCH_HTML", "ENGINES"]

logger = logging.getLogger(__name__)

BATCH_JSON, BATCH_HTML = "batch.json", "batch.html"
ENGINES = ("local", "ray")
#: Share of the machine's available memory the local engine admits entries into by default.
BUDGET_SHARE = 0.8


def _previous_record(out_dir: pathlib.Path, name: str) -> EntryRecord | None:
    try:
        return EntryRecord.from_dict(json.loads((out_dir / name / f"{name}{ENTRY_SUFFIX}").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _manifest(entries: str | os.PathLike[str] | Manifest | Sequence[Entry]) -> Manifest:
    if isinstance(entries, Manifest):
        return entries
    if isinstance(entries, (str, os.PathLike)):
        return read_manifest(entries)
    listed = tuple(entries)
    if not all(isinstance(e, Entry) for e in listed):
        raise InputError(
            "entries must be a manifest path or a sequence of dx.fleet.Entry",
            hint="write a TOML manifest (examples/zoo.toml) and pass its path",
        )
    names_unique(listed)
    return Manifest(None, listed, (), "")


def batch(
    entries: str | os.PathLike[str] | Manifest | Sequence[Entry],
    out_dir: str | os.PathLike[str],
    workers: int | None = None,
    engine: str = "local",
    address: str | None = None,
    *,
    memory_budget_mb: float | None = None,
    compare_to: str | os.PathLike[str] | None = None,
    shared_dir: str | os.PathLike[str] | None = None,
    retries: int = 2,
    only: Sequence[str] | None = None,
    start_method: str = "forkserver",
    progress: ProgressCallback | None = None,
) -> BatchRecord:
    """Export every entry of ``entries`` (a TOML manifest's path, or parsed entries) into
    ``out_dir/<name>/``; write ``out_dir/batch.json`` and ``out_dir/batch.html``; return the record.

    ``engine="local"`` runs a child process per entry, at most ``workers`` at once (default: the
    cores), admitted while the whole batch fits ``memory_budget_mb``: this process, the fork
    server and each running entry (at the larger of its estimated peak and its measured PSS),
    plus the next entry's estimate (default budget: what the batch holds now plus 80% of the
    memory available). ``engine="ray"`` runs Ray tasks on the cluster at ``address`` (None:
    a local Ray instance), retried ``retries`` times when a worker dies; ``shared_dir`` names a
    folder every node sees, to return files through it instead of the object store.
    ``compare_to``: an earlier run's ``batch.json`` (or its folder): the record's ``diff`` lists
    what regressed first. ``only``: run just these entries (the others keep their last record).
    A malformed entry is recorded ``invalid`` with its line; the others run.
    """
    engine = _engine(engine, address, workers)
    manifest = _manifest(entries)
    old = load_batch(compare_to) if compare_to is not None else None
    out = prepare_out_dir(out_dir)
    run = _selected(manifest, only)
    t0 = time.monotonic()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with export_lock(out, "batch"):
        if engine == "local":  # the fork server imports the stack while this process goes on
            from .processes import context

            context(start_method, [e.hf for e in run if e.hf is not None])
        previous = {e.name: _previous_record(out, e.name) for e in manifest.entries}
        estimates: dict[str, Estimate] = estimate_entries(run, previous, method=start_method)
        budget = memory_budget_mb or tree_pss_mb(os.getpid()) + available_mb() * BUDGET_SHARE
        if engine == "local":
            from .local import run_local

            n = workers or max(1, min(os.cpu_count() or 1, len(run)))
            records = run_local(
                run,
                out,
                workers=n,
                budget_mb=budget,
                estimates=estimates,
                on_event=progress,
                start_method=start_method,
            )
        else:
            records, n = _run_on_ray(run, out, address, estimates, retries, shared_dir, progress)
        record = BatchRecord(
            entries=_all_records(manifest, records, previous),
            manifest=str(manifest.path) if manifest.path else "<entries>",
            manifest_sha256=manifest.sha256,
            engine=engine,
            workers=n,
            started=started,
            seconds=time.monotonic() - t0,
            versions=library_versions(),
            address=address,
            memory_budget_mb=round(budget, 1) if engine == "local" else None,
        )
        if old is not None:
            record = record.with_diff(diff_batches(old, record, against=str(compare_to)))
        atomic_write_text(out / BATCH_JSON, record.to_json())
        from ..reporting import write_batch_page

        write_batch_page(out / BATCH_HTML, record)
    return record


def _engine(engine: str, address: str | None, workers: int | None) -> str:
    """The engine to run on (an address means Ray), after checking the arguments."""
    if engine not in ENGINES:
        raise InputError(f"engine {engine!r} is not one of {ENGINES}")
    if workers is not None and workers < 1:
        raise InputError(f"workers must be at least 1, not {workers}")
    return "ray" if address is not None else engine


def _selected(manifest: Manifest, only: Sequence[str] | None) -> list[Entry]:
    """The entries to run: all, or those ``only`` names (each must be in the manifest)."""
    if only is not None:
        unknown = sorted(set(only) - set(manifest.names))
        if unknown:
            raise InputError(f"no entries named {unknown} in the manifest")
    return [e for e in manifest.entries if only is None or e.name in only]


def _run_on_ray(
    run: list[Entry],
    out: pathlib.Path,
    address: str | None,
    estimates: dict[str, Estimate],
    retries: int,
    shared_dir: str | os.PathLike[str] | None,
    progress: ProgressCallback | None,
) -> tuple[dict[str, EntryRecord], int]:
    """The entries' records from Ray tasks, and the workers the cluster offered."""
    from .ray_engine import run_ray

    return run_ray(
        run,
        out,
        address=address,
        estimates=estimates,
        retries=retries,
        shared_dir=pathlib.Path(shared_dir).resolve() if shared_dir else None,
        on_event=progress,
    )


def _all_records(
    manifest: Manifest, records: dict[str, EntryRecord], previous: dict[str, EntryRecord | None]
) -> tuple[EntryRecord, ...]:
    """One record per manifest line, in the manifest's order: an entry not run this time keeps
    its last record, a malformed one is recorded invalid."""
    for e in manifest.entries:
        if e.name not in records:
            prev = previous.get(e.name)
            records[e.name] = prev or EntryRecord(e.name, "error", line=e.line, reason="not run yet")
    for m in manifest.malformed:
        records[m.name] = _invalid(m)
    order = [e.name for e in manifest.entries] + [m.name for m in manifest.malformed]
    return tuple(records[n_] for n_ in order)


def _invalid(m: Malformed) -> EntryRecord:
    where = f" (line {m.line})" if m.line else ""
    return EntryRecord(m.name, "invalid", line=m.line, reason=f"manifest entry {m.name!r}{where}: {m.reason}")

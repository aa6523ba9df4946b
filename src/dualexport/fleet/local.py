"""The local engine: one child process per entry, at most ``workers`` at once, admitted by memory.

Why a fresh child per entry: an export that crashes, leaks or is killed takes only its own entry
with it, and no entry sees another's imports or global torch state. The children come from a
fork server (``processes.py``): as clean as spawned ones, but started in ~0.1 s instead of the
imports' seconds, which is what makes a re-run of an unchanged zoo cheap.
``start_method="spawn"`` gives plain spawned children.

Each child leads its own process group, so a timeout or a kill takes its forked helpers (the
XNNPACK lowering worker, the isolated runtime) with it; the entry's folder is then recovered (an
interrupted commit rolled forward, dead writers' staging folders and temp files removed), so no
partial file survives.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pathlib
import signal
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..outputs import export_lock, recover
from .estimate import Estimate
from .manifest import Entry
from .memory import tree_pss_mb
from .processes import context as _context
from .processes import kill_group as _kill_group
from .progress import ProgressCallback, Tally
from .record import EntryRecord

__all__ = ["run_local", "worker_threads", "LOG_DIR"]

#: Each entry's log (its worker's stdout, stderr and log records): ``<out>/.logs/<name>.log`` (a dot name: no entry can take it).
LOG_DIR = ".logs"

logger = logging.getLogger(__name__)


def worker_threads(workers: int) -> int:
    """Intra-op threads per child, so that ``workers`` children share the cores without
    oversubscribing them."""
    return max(1, (os.cpu_count() or 1) // max(workers, 1))


def _log_to(path: pathlib.Path) -> None:
    """The child's stdout, stderr and log records go to its entry's log file (the parent's
    terminal shows the progress display, not the libraries' chatter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    for noisy in ("torch", "executorch", "onnxscript", "root", "torchao"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _child(conn: Any, entry: dict[str, Any], out_dir: str, threads: int) -> None:
    """A worker: run one entry, send phases and the record back, exit."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches it
    try:
        _log_to(pathlib.Path(out_dir) / LOG_DIR / f"{entry['name']}.log")
        import torch

        from .worker import run_entry

        torch.set_num_threads(threads)
        e = Entry.from_dict(entry)
        rec = run_entry(e, pathlib.Path(out_dir), phase=lambda p: conn.send(("phase", p)))
        conn.send(("record", rec.to_dict()))
    except BaseException as exc:  # an error in dualexport itself: reported, never silent
        with contextlib.suppress(Exception):
            conn.send(("crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:
        conn.close()


@dataclass
class _Run:
    entry: Entry
    proc: Any
    conn: Any
    started: float
    estimate: Estimate
    phase: str = "starting"
    record: EntryRecord | None = None
    crash: str | None = None
    timed_out: bool = False
    #: a phase message arrived since the progress display last showed this entry
    phase_changed: bool = False


def _clean_after(folder: pathlib.Path, name: str) -> None:
    """A dead worker's entry folder made whole: its commit finished or its staging removed."""
    if not folder.is_dir():
        return
    for _ in range(20):  # its helpers, killed with the group, may not be reaped yet
        try:
            with export_lock(folder, name):
                recover(folder, name)
            return
        except Exception as exc:  # a helper still holding the lock: give it a moment
            logger.debug("recovering %s: %s", folder, exc)
            time.sleep(0.25)
    logger.warning("could not recover %s after its worker died", folder)


def _drain(run: _Run) -> None:
    try:
        while run.conn.poll():
            kind, payload = run.conn.recv()
            if kind == "phase":
                run.phase = payload
                run.phase_changed = True
            elif kind == "record":
                run.record = EntryRecord.from_dict(payload)
            elif kind == "crash":
                run.crash = payload
    except (EOFError, OSError):
        pass


def _ended(run: _Run, out_dir: pathlib.Path) -> EntryRecord:
    """The record of a child that exited: its own, or one that says how it died."""
    code = run.proc.exitcode
    _kill_group(run.proc.pid)
    elapsed = time.monotonic() - run.started
    base = EntryRecord(
        run.entry.name,
        "killed",
        line=run.entry.line,
        folder=run.entry.name,
        seconds=elapsed,
        estimate_mb=run.estimate.mb,
        worker=f"pid {run.proc.pid}",
    )
    if run.record is not None and not run.timed_out:
        return run.record.with_(estimate_mb=run.estimate.mb)
    _clean_after(out_dir / run.entry.name, run.entry.name)
    if run.timed_out:
        return base.with_(
            status="timeout",
            reason=f"no result after {run.entry.timeout:.0f} s (in phase {run.phase!r}); the worker and "
            "its helpers were killed, and the entry's folder keeps its last whole set",
        )
    if run.crash is not None:
        return base.with_(status="failed", reason=f"internal error in the worker: {run.crash}")
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return base.with_(
            reason=f"the worker died ({sig}) in phase {run.phase!r}; nothing of this run was "
            "committed and its partial files were removed"
        )
    return base.with_(reason=f"the worker exited with code {code} in phase {run.phase!r} without a result")


def _charged(running: Mapping[str, _Run]) -> float:
    """What the batch holds now: this process and the fork server (measured), plus each
    running entry at the larger of its estimate and its measured tree (an estimate that was too
    low is corrected as soon as the child grows past it)."""
    pids = frozenset(r.proc.pid for r in running.values() if r.proc.pid is not None)
    held = tree_pss_mb(os.getpid(), exclude=pids)
    return held + sum(max(r.estimate.mb, tree_pss_mb(r.proc.pid or 0)) for r in running.values())


def _spawn(ctx: Any, entry: Entry, out_dir: pathlib.Path, threads: int, estimate: Estimate) -> _Run:
    """Start ``entry``'s child process, its results coming back through a one-way pipe."""
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child,
        args=(child_conn, entry.to_dict(), str(out_dir), threads),
        name=f"dualexport-{entry.name}",
        daemon=False,
    )
    proc.start()
    child_conn.close()
    return _Run(entry, proc, parent_conn, time.monotonic(), estimate)


def run_local(
    entries: Sequence[Entry],
    out_dir: pathlib.Path,
    *,
    workers: int,
    budget_mb: float,
    estimates: Mapping[str, Estimate],
    on_event: ProgressCallback | None = None,
    start_method: str = "forkserver",
    threads: int | None = None,
) -> dict[str, EntryRecord]:
    """Run ``entries`` in child processes; the records by name (every entry gets one)."""
    ctx = _context(start_method, [e.hf for e in entries if e.hf is not None])
    threads = threads or worker_threads(workers)
    pending = list(entries)
    running: dict[str, _Run] = {}
    records: dict[str, EntryRecord] = {}
    tally = Tally(len(entries), time.monotonic())

    def emit(kind: str, name: str, **kw: Any) -> None:
        if on_event is not None:
            on_event(tally.event(kind, name, time.monotonic(), **kw))

    def admit() -> None:
        while pending and len(running) < workers:
            used = _charged(running)
            pick = next((e for e in pending if used + estimates[e.name].mb <= budget_mb), None)
            if pick is None:
                if running:
                    return
                pick = pending[0]
                logger.warning(
                    "%s needs ~%.0f MB, over what the budget of %.0f MB leaves (%.0f MB held): it runs alone",
                    pick.name,
                    estimates[pick.name].mb,
                    budget_mb,
                    used,
                )
            pending.remove(pick)
            running[pick.name] = _spawn(ctx, pick, out_dir, threads, estimates[pick.name])
            tally.running += 1
            emit("start", pick.name)

    try:
        while pending or running:
            admit()
            waitables = [r.conn for r in running.values()] + [r.proc.sentinel for r in running.values()]
            mp.connection.wait(waitables, timeout=0.5)
            now = time.monotonic()
            for name, run in list(running.items()):
                _drain(run)
                if run.phase_changed:
                    run.phase_changed = False
                    emit("phase", name, phase=run.phase)
                if run.proc.is_alive() and now - run.started > run.entry.timeout and not run.timed_out:
                    run.timed_out = True
                    _kill_group(run.proc.pid)
                if not run.proc.is_alive():
                    run.proc.join()
                    _drain(run)
                    rec = _ended(run, out_dir)
                    run.conn.close()
                    del running[name]
                    records[name] = rec
                    tally.running -= 1
                    tally.done += 1
                    tally.failed += not rec.passed
                    emit("done", name, record=rec)
    finally:
        for run in running.values():  # an interrupt: no orphan keeps exporting
            _kill_group(run.proc.pid)
            run.proc.join(timeout=5)
            _clean_after(out_dir / run.entry.name, run.entry.name)
    return records

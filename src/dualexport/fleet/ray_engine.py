"""The Ray engine: each entry a Ray task that declares one CPU and the entry's estimated memory,
retried when its worker dies, its files returned to the driver's output folder and checked
against their sha256 on arrival.

Why the driver retries (the task itself has ``max_retries=0``): the record then says how many
attempts an entry took and why the earlier ones ended. Why files travel through the object store
by default: a cluster's nodes need not share a file system; with ``shared_dir`` (a path every node
and the driver see) the worker writes there instead, the driver copies each file into the output
folder after checking its hash, and the shared copy doubles as the worker's cache on the next run.
Without it, the driver sends the entry's previous files along with the task, so a re-run is
incremental on any node.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ArtifactIOError, DualExportError, InputError
from ..outputs import artifact_set, safe_child
from .estimate import Estimate
from .manifest import Entry
from .progress import ProgressCallback, Tally
from .record import EntryRecord

__all__ = ["run_ray", "ray_task"]

logger = logging.getLogger(__name__)


def _safe_rel(folder: pathlib.Path, rel: str, what: str) -> pathlib.Path:
    """``folder/rel`` for a relative path of plain names (an ONNX test-data folder has two
    levels); anything that would leave ``folder`` is refused."""
    parts = rel.split("/")
    path = folder
    for part in parts:
        path = safe_child(path, part, what=what)
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ray_task(
    entry: dict[str, Any],
    previous: Mapping[str, bytes] | None,
    threads: int,
    shared_dir: str | None,
    attempt: int,
) -> tuple[dict[str, Any], dict[str, bytes] | None, dict[str, str]]:
    """Runs on a Ray worker: the entry exported into a private folder (or the shared one), its
    record, its files (None when they stay in ``shared_dir``) and their sha256."""
    import torch

    from .worker import entry_files, file_record, run_entry

    torch.set_num_threads(threads)
    e = Entry.from_dict(entry)
    root = (
        pathlib.Path(shared_dir) if shared_dir else pathlib.Path(tempfile.mkdtemp(prefix="dualexport-ray-"))
    )
    try:
        folder = root / e.name
        if previous and not shared_dir:
            for rel, data in previous.items():
                dst = _safe_rel(folder, rel, "a previous file")
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(data)
        rec = run_entry(e, root, attempts=attempt)
        import ray

        node = ray.get_runtime_context().get_node_id()
        rec = rec.with_(worker=f"{rec.worker} node {node[:12]}")
        files = entry_files(folder) if folder.is_dir() else []
        hashes = {f.relative_to(folder).as_posix(): file_record(f, folder).sha256 for f in files}
        payload = None if shared_dir else {f.relative_to(folder).as_posix(): f.read_bytes() for f in files}
        return rec.to_dict(), payload, hashes
    finally:
        if not shared_dir:
            shutil.rmtree(root, ignore_errors=True)


def _previous_files(folder: pathlib.Path) -> dict[str, bytes] | None:
    from .worker import entry_files

    if not folder.is_dir():
        return None
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in entry_files(folder)}


def _publish(
    out_dir: pathlib.Path,
    name: str,
    payload: Mapping[str, bytes] | None,
    hashes: Mapping[str, str],
    shared_dir: pathlib.Path | None,
) -> None:
    """The returned files into ``out_dir/<name>/`` as one set, each checked against its hash."""
    folder = out_dir / name
    if shared_dir is not None and (shared_dir / name).resolve() == folder.resolve():
        for rel, sha in hashes.items():  # written in place: check only
            if _sha(_safe_rel(folder, rel, "a shared file").read_bytes()) != sha:
                raise ArtifactIOError(f"{name}/{rel} changed between the worker and the driver")
        return
    folder.mkdir(parents=True, exist_ok=True)
    with artifact_set(folder, name) as tx:
        for rel, sha in sorted(hashes.items()):
            if rel.startswith("."):  # the worker's own set record: the commit writes the driver's
                continue
            if payload is not None:
                data = payload[rel]
            else:
                assert shared_dir is not None
                data = _safe_rel(shared_dir / name, rel, "a shared file").read_bytes()
            if _sha(data) != sha:
                raise ArtifactIOError(
                    f"{name}/{rel} arrived with sha256 {_sha(data)[:12]}…, the worker wrote {sha[:12]}…",
                    hint="the transfer corrupted it; run the batch again",
                )
            dst = _safe_rel(tx.dir, rel, "a returned file")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)


def _needs_token(address: str) -> bool:
    """Whether the cluster at ``address`` refuses a client without the token: asked of its GCS
    in a child process (the mode is read once per process, at ``import ray``)."""
    if address == "auto" or "://" in address:
        return True  # not probed: the token is sent, as Ray itself does for a local cluster
    code = (
        "import sys; from ray._raylet import GcsClient; "
        "GcsClient(address=sys.argv[1]).internal_kv_get(b'dualexport-probe', None, timeout=20)"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, address], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return True
    return proc.returncode != 0 and "AuthenticationError" in proc.stderr


def _token_mode_for(address: str | None) -> None:
    """Choose Ray's token mode (see ``_connect``) before ``import ray`` reads it."""
    token = (
        bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"))
        or (pathlib.Path.home() / ".ray" / "auth_token").is_file()
    )
    if address is None or not token or "RAY_AUTH_MODE" in os.environ or not _needs_token(address):
        return
    if "ray" in sys.modules:
        logger.warning(
            "ray was imported before dualexport could set RAY_AUTH_MODE=token; "
            "if the cluster refuses the connection, set it yourself"
        )
    logger.info("%s asks for the Ray token: connecting with RAY_AUTH_MODE=token", address)
    os.environ["RAY_AUTH_MODE"] = "token"


def _ray(address: str | None = None) -> Any:
    _token_mode_for(address)
    try:
        import ray
    except ImportError as exc:
        raise InputError(
            "the Ray engine needs ray", hint="pip install 'dualexport[fleet]' (or ray==2.60.0)"
        ) from exc
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """``ray.init`` for the cluster at ``address`` (None: a local Ray instance).

    Why the token mode: ``ray start --head`` (Ray 2.60) turns token authentication on and keeps
    the token in ``~/.ray/auth_token``, but a driver that connects by address with
    ``RAY_AUTH_MODE`` unset does not send it and is refused (and the mode is read once per
    process, so a second try cannot fix it). With a token at hand and no mode chosen, the cluster
    is asked first (``_needs_token``): the driver must not turn token mode on for a cluster
    without authentication either, whose workers then call back to a driver that refuses them
    (results lost as ``OwnerDiedError``: found on a ``ray.cluster_utils.Cluster`` while a token
    from an earlier ``ray start`` sat in ``~/.ray``). Ray reads the mode when it is imported, so
    ``_ray`` sets it before the import."""
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:
        raise InputError(
            f"cannot connect to a Ray cluster at {address!r}: {str(exc).splitlines()[0]}",
            hint="start one with `ray start --head --port=PORT` and pass --ray 127.0.0.1:PORT; a cluster "
            "with token authentication needs its token (RAY_AUTH_TOKEN or ~/.ray/auth_token)",
        ) from exc


_DIED = (
    "WorkerCrashedError",
    "NodeDiedError",
    "OutOfMemoryError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "RaySystemError",
)


def _outcome(
    ray: Any,
    ref: Any,
    e: Entry,
    attempt: int,
    t0: float,
    estimate_mb: float,
    retries: int,
    out_dir: pathlib.Path,
    shared_dir: pathlib.Path | None,
) -> EntryRecord | str:
    """The record of a finished task (its files published), or, when its worker died and
    attempts remain, the name of the error (the caller submits it again)."""
    base = EntryRecord(
        e.name,
        "killed",
        line=e.line,
        folder=e.name,
        attempts=attempt,
        estimate_mb=estimate_mb,
        seconds=time.monotonic() - t0,
    )
    try:
        rec_dict, payload, hashes = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return base.with_(
            status="timeout", reason=f"no result after {e.timeout:.0f} s; the task was cancelled"
        )
    except ray.exceptions.RayError as exc:
        kind = type(exc).__name__
        if isinstance(exc, ray.exceptions.RayTaskError) and kind not in _DIED:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return base.with_(status="failed", reason=f"internal error in the worker: {cause}")
        if attempt <= retries:
            return kind
        return base.with_(reason=f"the worker died ({kind}) on each of {attempt} attempts")
    rec = EntryRecord.from_dict(rec_dict).with_(attempts=attempt, estimate_mb=estimate_mb)
    if attempt > 1:
        note = f"{attempt - 1} earlier attempt(s) ended with the worker's death"
        rec = rec.with_(reason=f"{rec.reason}; {note}" if rec.reason else note)
    try:
        _publish(out_dir, e.name, payload, hashes, shared_dir)
    except (DualExportError, OSError) as exc:
        rec = rec.with_(status="failed", reason=f"the files could not be published: {exc}")
    return rec


def run_ray(
    entries: Sequence[Entry],
    out_dir: pathlib.Path,
    *,
    address: str | None,
    estimates: Mapping[str, Estimate],
    retries: int = 2,
    shared_dir: pathlib.Path | None = None,
    threads: int = 1,
    on_event: ProgressCallback | None = None,
) -> tuple[dict[str, EntryRecord], int]:
    """Run ``entries`` as Ray tasks on the cluster at ``address`` (None: a local Ray instance);
    the records by name, and the cluster's CPUs."""
    ray = _ray(address)
    initialized_here = not ray.is_initialized()
    if initialized_here:
        _connect(ray, address)
    task = ray.remote(ray_task)
    cpus = int(ray.cluster_resources().get("CPU", 0)) or 1
    tally = Tally(len(entries), time.monotonic())
    records: dict[str, EntryRecord] = {}
    inflight: dict[Any, tuple[Entry, int, float]] = {}

    def emit(kind: str, name: str, **kw: Any) -> None:
        if on_event is not None:
            on_event(tally.event(kind, name, time.monotonic(), **kw))

    def submit(e: Entry, attempt: int) -> None:
        est = estimates[e.name]
        ref = task.options(
            num_cpus=1, memory=int(est.mb * 2**20), max_retries=0, name=f"dualexport:{e.name}"
        ).remote(
            e.to_dict(),
            _previous_files(out_dir / e.name) if shared_dir is None else None,
            threads,
            str(shared_dir) if shared_dir else None,
            attempt,
        )
        inflight[ref] = (e, attempt, time.monotonic())

    def finish(e: Entry, rec: EntryRecord) -> None:
        records[e.name] = rec
        tally.running -= 1
        tally.done += 1
        tally.failed += not rec.passed
        emit("done", e.name, record=rec)

    try:
        for e in entries:
            submit(e, 1)
            tally.running += 1
            emit("start", e.name)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            now = time.monotonic()
            for ref, (e, _attempt, t0) in list(inflight.items()):
                if ref not in ready and now - t0 > e.timeout:
                    ray.cancel(ref, force=True)
            for ref in ready:
                e, attempt, t0 = inflight.pop(ref)
                outcome = _outcome(
                    ray, ref, e, attempt, t0, estimates[e.name].mb, retries, out_dir, shared_dir
                )
                if isinstance(outcome, str):
                    logger.warning("%s: the worker died (%s); attempt %d", e.name, outcome, attempt + 1)
                    emit("retry", e.name, phase=f"attempt {attempt + 1}")
                    submit(e, attempt + 1)
                else:
                    finish(e, outcome)
    finally:
        for ref in inflight:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if initialized_here:
            ray.shutdown()
    return records, cpus

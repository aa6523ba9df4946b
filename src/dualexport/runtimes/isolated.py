"""A runner in a forked child process: the runtime's memory and its crashes stay there.

Why: ONNX Runtime and ExecuTorch are C++ that a bad file can crash (ExecuTorch 1.4.1 segfaults on
a program whose weights file is missing or whose delegate data is damaged), and a crash in this
process would take the exporter, its staging folder and the user's session with it. And a runtime
loading a large artifact holds its own copy of the weights (XNNPACK packs them again): in the
parent that copy would stack on top of the exporter's. The child is forked (no re-import of torch
and the runtimes, which costs seconds), resets the thread pools it inherited without their
threads, answers ``run`` requests over a pipe, and exits with the runner. A child that dies
mid-request is reported as the target's error naming the signal.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pathlib
import signal
from typing import Any

import torch

from .._proc import StallWatch
from ..compat.executorch import reset_threadpool
from ..errors import DualExportError, RuntimeExecutionError, RuntimeLoadError

__all__ = ["IsolatedRunner", "call_isolated", "STALL_SECONDS"]

logger = logging.getLogger(__name__)

#: The runner attributes the parent may read (ranges the file records, its memory plan).
_ATTRIBUTES = ("input_specs", "ranges", "external")


def _send(conn: Any, obj: Any) -> None:
    """Plain pickle over the pipe: tensors travel by value (multiprocessing's own pickler would
    move them through shared memory and passed file descriptors, which a crash can leak)."""
    import pickle

    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Any) -> Any:
    import pickle

    return pickle.loads(conn.recv_bytes())


def _child_setup(target: str) -> None:
    import faulthandler
    import os

    faulthandler.disable()  # a crash here is reported by the parent, not dumped by the child
    torch.set_num_threads(1)  # libgomp deadlocks in a forked child once the parent used OpenMP
    if target != "xnnpack":  # importing ExecuTorch's runtime costs seconds an ONNX child never needs
        return
    with contextlib.suppress(Exception):  # pthreadpool's workers did not survive the fork
        saved = os.dup(2)
        try:
            with open(os.devnull, "w") as null:  # the reset logs a line on stderr
                os.dup2(null.fileno(), 2)
                reset_threadpool(len(os.sched_getaffinity(0)))
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _serve(conn: Any, target: str, path: str, lean: bool) -> None:
    """The child: open the runner, report its attributes, then run requests until closed."""
    _child_setup(target)
    from . import open_runner

    try:
        runner = open_runner(target, pathlib.Path(path), lean=lean, isolated=False)
        attrs = {a: getattr(runner, a) for a in _ATTRIBUTES if hasattr(runner, a)}
        if hasattr(runner, "planned_sizes"):
            attrs["planned"] = runner.planned_sizes()
        _send(conn, ("ok", attrs))
    except BaseException as exc:
        _send(conn, ("error", _portable(exc)))
        return
    while True:
        try:
            request = _recv(conn)
        except EOFError:
            return
        if request is None:
            return
        try:
            _send(conn, ("ok", runner.run(request)))
        except BaseException as exc:
            _send(conn, ("error", _portable(exc)))


#: A runtime child that uses no CPU this long while the parent waits is stuck: it is killed.
STALL_SECONDS = 120.0


def _wait(conn: Any, proc: Any, doing: str) -> None:
    """Block until the child answers or dies; a child stuck without using CPU for
    ``STALL_SECONDS`` is killed (the caller then reports it as crashed), so no receive waits
    forever. An interrupt (Ctrl-C) reaches the caller at once."""
    watch = StallWatch(proc.pid, STALL_SECONDS)
    while not conn.poll(1.0):
        if not proc.is_alive():
            return  # the receive sees EOF
        if watch.stalled():
            logger.warning("%s: no CPU used for %.0f s; killed", doing, STALL_SECONDS)
            proc.kill()
            proc.join(timeout=10)
            return


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it crosses a pipe, else a RuntimeExecutionError saying it."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeExecutionError(f"{type(exc).__name__}: {exc}")


class IsolatedRunner:
    """``open_runner(target, path)`` in a forked child; the same ``run`` and attributes."""

    def __init__(self, target: str, path: pathlib.Path, *, lean: bool = False) -> None:
        self.name = target
        self._target, self._path = target, pathlib.Path(path)
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, target, str(path), lean), daemon=True)
        self._proc.start()
        child.close()
        self._planned: list[list[int]] | None = None
        attrs = self._receive("loading")
        self._planned = attrs.pop("planned", None)
        for key, value in attrs.items():
            setattr(self, key, value)

    def _receive(self, doing: str) -> Any:
        try:
            _wait(self._conn, self._proc, f"{self._target} runtime {doing} {self._path.name}")
            kind, value = _recv(self._conn)
        except (EOFError, OSError):
            self._proc.join(timeout=10)
            code = self._proc.exitcode
            how = (
                f"signal {signal.Signals(-code).name}"
                if code is not None and code < 0
                else f"exit code {code}"
            )
            cls = RuntimeLoadError if doing == "loading" else RuntimeExecutionError
            raise cls(
                f"the {self._target} runtime crashed ({how}) {doing} {self._path.name}",
                target=self._target,
                hint="the file is damaged or incomplete (a missing weights file, a truncated delegate); "
                "re-export it; the exporter itself was not affected",
            ) from None
        if kind == "error":
            if doing == "loading":
                self.close()
            raise value
        return value

    def planned_sizes(self) -> list[list[int]] | None:
        return self._planned

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            _send(self._conn, [t.detach().contiguous() for t in inputs])
        except (BrokenPipeError, OSError):
            pass  # the child is gone: _receive says how
        try:
            return self._receive("running")
        except DualExportError:
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _send(self._conn, None)
        with contextlib.suppress(Exception):
            self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _call(conn: Any, fn: Any, args: tuple[Any, ...], target: str) -> None:
    _child_setup(target)
    try:
        _send(conn, ("ok", fn(*args)))
    except BaseException as exc:
        _send(conn, ("error", _portable(exc)))


def call_isolated(fn: Any, *args: Any, target: str, what: str) -> Any:
    """``fn(*args)`` in a forked child (a module-level function: a runtime call that may crash);
    its return value, its exception, or the target's error naming the signal it died of."""
    ctx = multiprocessing.get_context("fork")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_call, args=(child, fn, args, target), daemon=True)
    proc.start()
    child.close()
    try:
        _wait(conn, proc, f"{target} runtime {what}")
        kind, value = _recv(conn)
    except (EOFError, OSError):
        proc.join(timeout=10)
        code = proc.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        raise RuntimeExecutionError(
            f"the {target} runtime crashed ({how}) {what}",
            target=target,
            hint="the file is damaged or incomplete; re-export it; this process was not affected",
        ) from None
    finally:
        conn.close()
        proc.join(timeout=10)
    if kind == "error":
        raise value
    return value

"""Run one lowering in a forked child while the parent does the other target's work.

Why fork and not spawn or threads: the child must lower the very program the holder holds (the
same tensors, no copy and no re-import of torch and ExecuTorch, which alone costs seconds), and
both lowerings are pure Python under the GIL. Why it is safe enough:

* libgomp deadlocks in a forked child once the parent has used OpenMP (a parameter deepcopy inside
  ExecuTorch hung here): the child calls ``torch.set_num_threads(1)`` before anything else;
* the child dies with the parent (``PR_SET_PDEATHSIG``) and never runs the parent's exit handlers;
* the child writes to the real stdout/stderr, not to a redirecting proxy (rich's status display)
  whose lock another thread may have held at the fork;
* a child whose CPU time stops advancing for ``STALL_SECONDS`` is taken as deadlocked and killed;
* whenever the child fails, for whatever reason, :meth:`ForkedCall.result` returns ``None`` and the
  caller runs the work in-process, so errors and their messages are the in-process ones; except a
  Ctrl-C (SIGINT reaches the whole process group): the child reports it and the parent raises
  ``KeyboardInterrupt`` instead of lowering again.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

from .._proc import StallWatch

__all__ = ["ForkedCall", "STALL_SECONDS", "parallel_worthwhile"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: A lowering is CPU-bound Python; this long without any CPU time means a deadlock.
STALL_SECONDS = 120.0

#: Above this many weight bytes the two lowerings' working memory would stack (the XNNPACK
#: lowering alone needs about twice the weights; bench_memory: a 192 MB MLP peaks at 3.56x its
#: weights serial, at most 4.22x forked), so they run one after the other. Below it the time
#: saved matters more than a few tens of MB.
PARALLEL_WEIGHT_LIMIT = 64 << 20


def parallel_worthwhile(weight_bytes: int) -> bool:
    """Fork only where it can help: Linux, two usable cores with one of them idle, modest weights."""
    if sys.platform != "linux" or weight_bytes > PARALLEL_WEIGHT_LIMIT:
        return False
    cores = len(os.sched_getaffinity(0))
    return cores >= 2 and os.getloadavg()[0] <= cores - 1


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class ForkedCall(Generic[T]):
    """``fn()`` started in a forked child now; :meth:`result` collects its picklable return."""

    def __init__(self, fn: Callable[[], T], label: str) -> None:
        self.label = label
        parent = os.getpid()
        read, write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the child: never returns
            os.close(read)
            status = 1
            try:
                _die_with_parent(parent)
                # A progress display's thread may have held its console lock at the fork; the
                # child writes straight to the process's own streams instead.
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
                import torch

                torch.set_num_threads(1)
                payload = pickle.dumps(("ok", fn()), protocol=pickle.HIGHEST_PROTOCOL)
                status = 0
            except KeyboardInterrupt:  # the terminal's Ctrl-C reached the whole process group
                payload = pickle.dumps(("interrupted", "KeyboardInterrupt"))
            except BaseException as exc:
                payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(write, view) :]
            finally:
                os._exit(status)
        os.close(write)
        self._read = read

    def cancel(self) -> None:
        """Kill the child and reap it (the caller gave up on the result: an exception or an
        interrupt between start and collection)."""
        for step in (
            lambda: os.kill(self._pid, signal.SIGKILL),
            lambda: os.waitpid(self._pid, 0),
            lambda: os.close(self._read),
        ):
            try:
                step()
            except OSError:  # already gone, already reaped, already closed
                pass

    def result(self) -> T | None:
        """The child's return value, or ``None`` if it failed, crashed or stalled."""
        chunks: list[bytes] = []
        watch = StallWatch(self._pid, STALL_SECONDS)
        try:
            while True:
                ready, _, _ = select.select([self._read], [], [], 1.0)
                if ready:
                    chunk = os.read(self._read, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    watch.progress()
                    continue
                if watch.stalled():
                    logger.warning(
                        "%s: forked worker used no CPU for %.0f s; killed, running in-process",
                        self.label,
                        STALL_SECONDS,
                    )
                    os.kill(self._pid, signal.SIGKILL)
                    break
        finally:
            os.close(self._read)
            _, status = os.waitpid(self._pid, 0)
        try:
            kind, value = pickle.loads(b"".join(chunks))
        except Exception:
            kind, value = "error", f"exit code {os.waitstatus_to_exitcode(status)}"
        if kind == "interrupted":  # not a failure to fall back from: the user asked to stop
            raise KeyboardInterrupt
        if kind != "ok" or os.waitstatus_to_exitcode(status) != 0:
            logger.warning("%s: forked worker failed (%s); running in-process", self.label, value)
            return None
        return value

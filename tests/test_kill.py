"""Issue 5: an export SIGKILLed inside each phase leaves the previous complete set or the new
complete set, never a mix; and a rerun succeeds and cleans up after the killed run.

The child (helpers_kill.py) parks inside a phase and writes a marker; we kill it there, so each
kill lands where the test says, not at a random moment.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import dualexport as dx
from dualexport.outputs import export_lock, recover
from helpers_reliability import assert_complete_set, leftovers, tiny, weight_sha

HERE = pathlib.Path(__file__).parent
NAME = "k"
PREVIOUS_SEED, NEW_SEED, RERUN_SEED = 1, 2, 3


def _signal_state(pid: int) -> str:
    """Each process of the group and each of its threads: the signal masks the kernel sees, so a
    failure says whether SIGINT (bit 2, value 0x2) was blocked, ignored or caught at the kill."""
    lines = []
    for proc_dir in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc_dir.name)) != pid:
                continue
            cmd = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ")[:80].decode(errors="replace")
            for task in sorted((proc_dir / "task").iterdir()):
                st = dict(
                    line.split(":\t", 1)
                    for line in (task / "status").read_text().splitlines()
                    if ":\t" in line
                )
                lines.append(
                    f"{proc_dir.name}/{task.name} {st.get('Name', '?')} state={st.get('State', '?')} "
                    f"blk={st.get('SigBlk')} ign={st.get('SigIgn')} cgt={st.get('SigCgt')} :: {cmd}"
                )
        except (OSError, ValueError):  # gone meanwhile
            continue
    return "\n".join(lines)


def _listing(folder: pathlib.Path) -> str:
    """Names and modification times (ns) of what the folder holds now."""
    items = []
    for p in sorted(folder.iterdir()):
        try:
            items.append(f"{p.name}@{p.stat().st_mtime_ns}")
        except OSError:  # moved or removed meanwhile
            items.append(f"{p.name}@gone")
    return " ".join(items)


def _kill_inside(out: pathlib.Path, phase: str, marker: pathlib.Path, timeout: float = 120) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "helpers_kill.py"), str(out), NAME, str(NEW_SEED), phase, str(marker)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    try:
        while not marker.exists():
            if proc.poll() is not None:
                raise AssertionError(f"child ended before {phase}: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, f"child never reached {phase}"
            time.sleep(0.05)
        assert marker.read_text() == phase, f"child finished instead of parking in {phase}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)  # reaped, so its pid is dead for the leftover cleanup
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


SHA = {seed: weight_sha(tiny(seed)[0]) for seed in (PREVIOUS_SEED, NEW_SEED, RERUN_SEED)}

PHASES = [
    pytest.param("capture", id="capture"),
    pytest.param("transform", id="transform"),
    pytest.param("onnx", id="onnx-lowered-not-committed", marks=pytest.mark.slow),
    pytest.param("xnnpack", id="xnnpack-after-onnx-done", marks=pytest.mark.slow),
    pytest.param("manifest", id="before-manifest", marks=pytest.mark.slow),
    # the commit's own roll-forward is test_sigkill_between_renames_is_rolled_forward (fast)
    pytest.param("commit", id="between-two-renames-of-the-commit", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("kill_previous") / "out"
    m, a = tiny(PREVIOUS_SEED)
    dx.export(m, a, out_dir=d, name=NAME)
    assert assert_complete_set(d, NAME) == SHA[PREVIOUS_SEED]
    return d


@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_leaves_a_complete_set(phase: str, previous: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(previous, out)
    _kill_inside(out, phase, tmp_path / "marker")
    if phase == "commit":
        # Killed after the commit point: the journal says how to finish; readers and the next
        # export roll it forward before anything else, so nobody sees the half-moved state.
        assert (out / f".{NAME}.commit.json").exists()
        with export_lock(out, NAME):
            assert recover(out, NAME)
        assert assert_complete_set(out, NAME) == SHA[NEW_SEED]
    else:
        assert assert_complete_set(out, NAME) == SHA[PREVIOUS_SEED]
    # the rerun succeeds, replaces the set, and removes what the killed run left behind
    m, a = tiny(RERUN_SEED)
    res = dx.export(m, a, out_dir=out, name=NAME)
    assert res.ok and res.artifacts["onnx"].path == out / f"{NAME}.onnx"
    assert assert_complete_set(out, NAME) == SHA[RERUN_SEED]
    assert dx.compare(res).ok
    assert leftovers(out) == []


@pytest.mark.parametrize("target", ["xnnpack", pytest.param("onnx", marks=pytest.mark.slow)])
def test_ctrl_c_stops_an_export_promptly(target: str, previous: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """SIGINT to the whole process group (a terminal's Ctrl-C: the CLI, its forked lowering
    worker and its runtime children) while a target really lowers: the CLI stops within a few
    seconds with exit code 130, the previous set is intact and nothing half-written is left."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(previous, out)
    marker = tmp_path / "marker"
    phase = f"interrupt-{target}"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "helpers_kill.py"),
            str(out),
            NAME,
            str(NEW_SEED),
            phase,
            str(marker),
            "512",
        ],
        env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(HERE)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the child never started lowering"
            time.sleep(0.02)
        marked = time.monotonic()
        assert proc.poll() is None, "the export finished before the interrupt"
        # What the folder held at the kill: a set already committed there means the signal came
        # too late to stop anything (a starved test process), not that it was lost.
        seen = time.monotonic()
        state = "\n".join(
            [
                f"kill {seen - marked:.2f} s after the marker was seen, "
                f"{time.time() - marker.stat().st_mtime:.2f} s after it was written",
                "folder: " + _listing(out),
                _signal_state(proc.pid),
            ]
        )
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err = proc.stdout.read().decode()
        proc.stdout.close()
    handlers = [line for line in err.splitlines() if line.startswith("sigint handler")]
    assert proc.returncode == 130 and "interrupted" in err, (proc.returncode, err[-2000:], state, handlers)
    assert took < 5.0, f"the export took {took:.1f} s to stop"
    assert assert_complete_set(out, NAME) == SHA[PREVIOUS_SEED]
    assert leftovers(out) == []


@pytest.mark.slow  # the roll-forward itself: test_sigkill_between_renames_is_rolled_forward (fast)
def test_compare_dir_finishes_an_interrupted_commit(previous: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``dualexport compare DIR`` on a folder whose commit was killed halfway reads the new set."""
    import shutil

    from dualexport.parity.folder import compare_dir

    out = tmp_path / "out"
    shutil.copytree(previous, out)
    _kill_inside(out, "commit", tmp_path / "marker")
    report, check, werr, name = compare_dir(out)
    assert name == NAME and werr is None and report.ok
    assert assert_complete_set(out, NAME) == SHA[NEW_SEED]
    assert leftovers(out) == []


# ------------------------------------------------------------ the set commit on its own (fast)
_COMMIT_CHILD = """
import pathlib, sys, time
from dualexport.outputs import artifact_set, commit
out, marker = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
orig, moved = commit._move, []
def move(src, dst):
    orig(src, dst)
    moved.append(dst)
    if len(moved) == 2:
        marker.write_text("commit")
        time.sleep(120)
commit._move = move
with artifact_set(out, "s") as tx:
    for suffix in (".onnx", ".pte", ".weights.json"):
        (tx.dir / f"s{suffix}").write_text("new")
"""


def _write_set(
    out: pathlib.Path, text: str, suffixes=(".onnx", ".onnx.data", ".pte", ".weights.json")
) -> None:
    from dualexport.outputs import artifact_set

    with artifact_set(out, "s") as tx:
        for suffix in suffixes:
            (tx.dir / f"s{suffix}").write_text(text)


def _contents(out: pathlib.Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in out.iterdir() if not p.name.startswith(".")}


def test_set_commit_replaces_the_whole_set(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "other.onnx").write_text("not ours")
    _write_set(out, "old")
    _write_set(out, "new", suffixes=(".onnx", ".pte", ".weights.json"))
    # the old .onnx.data is not part of the new set: removed, not left beside the new .onnx
    assert _contents(out) == {
        "s.onnx": "new",
        "s.pte": "new",
        "s.weights.json": "new",
        "other.onnx": "not ours",
    }
    assert leftovers(out) == []


def test_set_commit_failure_keeps_the_previous_set(tmp_path: pathlib.Path) -> None:
    from dualexport.outputs import artifact_set

    out = tmp_path / "out"
    out.mkdir()
    _write_set(out, "old")
    before = _contents(out)
    with pytest.raises(RuntimeError, match="target failed"):
        with artifact_set(out, "s") as tx:
            (tx.dir / "s.onnx").write_text("new")
            raise RuntimeError("target failed")
    with artifact_set(out, "s"):
        pass  # nothing staged: a run that produced nothing never empties the folder
    assert _contents(out) == before and leftovers(out) == []


def test_a_swallowed_ctrl_c_still_stops_the_commit(tmp_path: pathlib.Path) -> None:
    """Library code that catches KeyboardInterrupt (a bare ``except:``) cannot make a set publish
    after a SIGINT: the latch remembers the signal, the commit raises it again, the previous set
    stays and nothing is staged; after the block the process's SIGINT handler is the one before."""
    from dualexport.outputs import artifact_set

    out = tmp_path / "out"
    out.mkdir()
    _write_set(out, "old")
    before = _contents(out)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with artifact_set(out, "s") as tx:
            (tx.dir / "s.onnx").write_text("new")
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt:
                pass  # what a library's bare except does
            (tx.dir / "s.pte").write_text("new")
    assert _contents(out) == before and leftovers(out) == []
    assert signal.getsignal(signal.SIGINT) is handler
    with artifact_set(out, "s") as tx:  # the next export is not haunted by the old signal
        (tx.dir / "s.onnx").write_text("next")
    assert _contents(out)["s.onnx"] == "next"


def test_sigkill_between_renames_is_rolled_forward(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _write_set(out, "old")
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _COMMIT_CHILD, str(out), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "child never reached the commit"
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    mixed = _contents(out)
    assert sorted(set(mixed.values())) == ["new", "old"], "the kill did not land between two renames"
    assert (out / ".s.commit.json").exists()
    _write_set(out, "rerun")  # the next export finishes the killed commit first, then commits its own
    assert _contents(out) == {
        "s.onnx": "rerun",
        "s.onnx.data": "rerun",
        "s.pte": "rerun",
        "s.weights.json": "rerun",
    }
    assert leftovers(out) == []


def test_leftovers_of_live_writers_and_pending_journals_are_kept(tmp_path: pathlib.Path) -> None:
    from dualexport.outputs.atomic import _HOST, STAGING_PREFIX, remove_dead_leftovers

    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    names = {
        "dead": f"{STAGING_PREFIX}{_HOST}-{dead}-abc",
        "live": f"{STAGING_PREFIX}{_HOST}-{os.getpid()}-abc",
        "pending": f"{STAGING_PREFIX}{_HOST}-{dead}-pending",
        "other-host": f"{STAGING_PREFIX}00000000-{dead}-abc",
    }
    for n in names.values():
        (out / n).mkdir()
    (out / f".s.onnx.{_HOST}-{dead}.xyz.tmp").write_text("partial")
    (out / ".t.commit.json").write_text(json.dumps({"staging": names["pending"]}))
    removed = remove_dead_leftovers(out, keep={names["pending"]})
    assert sorted(removed) == sorted([names["dead"], f".s.onnx.{_HOST}-{dead}.xyz.tmp"])
    assert {p.name for p in out.iterdir()} == {
        names["live"],
        names["pending"],
        names["other-host"],
        ".t.commit.json",
    }


def test_readers_share_the_lock_writers_exclude(tmp_path: pathlib.Path) -> None:
    from dualexport.errors import ExportLockedError

    with export_lock(tmp_path, "s", shared=True), export_lock(tmp_path, "s", shared=True):
        with pytest.raises(ExportLockedError, match="another export is writing 's'"):
            with export_lock(tmp_path, "s"):
                pass
    with export_lock(tmp_path, "s"):
        with pytest.raises(ExportLockedError):
            with export_lock(tmp_path, "s", shared=True):
                pass


def test_a_child_forked_under_the_lock_does_not_keep_it(tmp_path: pathlib.Path) -> None:
    """Issue 49: a child forked while an export held the lock (a forked lowering, an isolated
    runtime kept alive) shares the lock's file description; the same process's next export (a
    fallback that exports again) must still get the lock once the first let it go."""
    with export_lock(tmp_path, "s"):
        pid = os.fork()
        if pid == 0:  # the child outlives the export's lock, holding the inherited descriptor
            time.sleep(30)
            os._exit(0)
    try:
        with export_lock(tmp_path, "s"):
            pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_commit_that_cannot_be_finished_says_so(tmp_path: pathlib.Path) -> None:
    """If the staged files of a journal are gone (deleted by hand), recovery refuses to call the
    folder complete instead of recording a mix as the current set."""
    from dualexport.errors import ArtifactIOError
    from dualexport.outputs.atomic import STAGING_PREFIX

    out = tmp_path / "out"
    out.mkdir()
    _write_set(out, "old")
    journal = {
        "schema": "dualexport.commit/1",
        "name": "s",
        "staging": f"{STAGING_PREFIX}gone",
        "files": ["s.onnx", "s.pte"],
        "sizes": {"s.onnx": 3, "s.pte": 99},
        "remove": [],
    }
    (out / ".s.commit.json").write_text(json.dumps(journal))
    with pytest.raises(ArtifactIOError, match=r"cannot be finished: s\.pte"):
        with export_lock(out, "s"):
            recover(out, "s")
    assert (out / ".s.commit.json").exists()

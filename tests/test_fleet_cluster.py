"""Fleet export on Ray: the shipped 12-entry zoo (examples/zoo.toml) run with the local engine,
then against a Ray head started the way users start one (``ray start --head`` on loopback, then
``address=127.0.0.1:PORT``), then on a two-node simulated cluster (``ray.cluster_utils.Cluster``):
identical per-entry results and identical artifact bytes. And a Ray worker SIGKILLed mid-entry:
the entry is retried and passes, the others complete, no partial file is left. Slow (~5 min)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest

import dualexport as dx
from dualexport.fleet import load_batch

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
ZOO = REPO / "examples" / "zoo.toml"
RAY = pathlib.Path(sys.executable).parent / "ray"
OBJECT_STORE = 400 * 2**20


def _results(record: dx.BatchRecord) -> dict[str, Any]:
    """What must not depend on where an entry ran: status, per target how it ended, every
    file's name and sha256, the delegation, and the parity numbers."""
    return {
        e.name: (
            e.status,
            e.weights_ok,
            e.parity_ok,
            {
                t: (
                    r.ok,
                    r.outcome,
                    [(f.name, f.sha256) for f in r.files],
                    r.delegated_share,
                    r.subgraphs,
                    r.parity,
                )
                for t, r in e.targets.items()
            },
        )
        for e in record.entries
    }


def _no_partial_files(folder: pathlib.Path) -> None:
    bad = [
        p.name
        for p in folder.rglob("*")
        if p.name.startswith(".dualexport-staging-") or p.name.endswith((".tmp", ".commit.json"))
    ]
    assert bad == []


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dx.BatchRecord:
    record = dx.batch(ZOO, tmp_path_factory.mktemp("local"), workers=2)
    assert [e.status for e in record.entries] == ["passed"] * 12, [(e.name, e.reason) for e in record.entries]
    return record


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ray_head_on_loopback_matches_local(local_run: dx.BatchRecord, tmp_path: pathlib.Path) -> None:
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [
            str(RAY),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--object-store-memory={OBJECT_STORE}",
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=180,
    )
    try:  # the driver as users run it: the CLI, in its own process (Ray's auth mode is per process)
        proc = subprocess.run(
            [sys.executable, "-m", "dualexport", "batch", str(ZOO), "--out", str(tmp_path / "out")]
            + ["--ray", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = load_batch(tmp_path / "out")
    assert record.engine == "ray" and record.address == f"127.0.0.1:{port}"
    assert _results(record) == _results(local_run)
    for e in record.entries:  # the files arrived in the driver's folder, checked against their hashes
        for r in e.targets.values():
            for f in r.files:
                assert (tmp_path / "out" / e.name / f.name).stat().st_size == f.bytes
    _no_partial_files(tmp_path / "out")


def test_two_node_cluster_matches_local(local_run: dx.BatchRecord, tmp_path: pathlib.Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
    try:
        record = dx.batch(ZOO, tmp_path / "out", engine="ray", address=cluster.address)
    finally:
        cluster.shutdown()
    assert _results(record) == _results(local_run)
    nodes = {e.worker.rsplit(" node ", 1)[1] for e in record.entries if e.worker}
    assert len(nodes) == 2  # both nodes took entries
    _no_partial_files(tmp_path / "out")


def test_ray_retries_an_entry_whose_worker_was_killed(tmp_path: pathlib.Path) -> None:
    """The first attempt's worker is SIGKILLed while it stages its files; the driver retries the
    entry (attempt 2 passes); the other entries complete; nothing partial is left."""
    marker = tmp_path / "killed-once"
    mod = f"fleet_kill_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{mod}.py").write_text(
        textwrap.dedent(
            f"""
            import os, pathlib, signal, threading, time
            import torch
            from dualexport.examples import TinyConvNet

            def once():
                marker = pathlib.Path({str(marker)!r})
                sizing = torch.empty(0).device.type == "meta"  # the driver sizing the model
                if not sizing and not marker.exists():
                    marker.write_text("attempt 1")

                    def watch():  # die while the export is staging its files
                        while True:
                            for p in pathlib.Path("/tmp").glob("dualexport-ray-*/victim/.dualexport-staging-*"):
                                time.sleep(0.2)
                                os.kill(os.getpid(), signal.SIGKILL)
                            time.sleep(0.01)

                    threading.Thread(target=watch, daemon=True).start()
                return TinyConvNet()
            """
        )
    )
    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            [defaults]
            path = ["."]
            inputs = ["1x3x16x16:float32"]
            [models.victim]
            model = "{mod}:once"
            [models.a]
            model = "dualexport.examples:TinyConvNet"
            [models.b]
            model = "dualexport.examples:TinyMLP"
            inputs = ["2x16:float32"]
            """
        )
    )
    import ray

    ray.init(num_cpus=2, object_store_memory=OBJECT_STORE, include_dashboard=False, log_to_driver=False)
    try:
        record = dx.batch(manifest, tmp_path / "out", engine="ray")
    finally:
        ray.shutdown()
    victim = record.entry("victim")
    assert marker.read_text() == "attempt 1"
    assert victim.status == "passed" and victim.attempts == 2, victim
    assert "worker's death" in victim.reason
    assert record.entry("a").status == "passed" and record.entry("b").status == "passed"
    _no_partial_files(tmp_path / "out")

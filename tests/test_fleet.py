"""Fleet export on this machine: the manifest (malformed entries named with their line, the
others run), the local engine (a child per entry, memory admission, timeouts, a SIGKILLed worker
that leaves no partial file), the incremental re-run (every entry reused, a weights change
patched in one entry only), batch.json / batch.html and the diff against an earlier run.

The cluster side (a Ray head on loopback, a two-node simulated cluster, the 12-entry zoo) is in
test_fleet_cluster.py (slow)."""

from __future__ import annotations

import json
import pathlib
import textwrap
import uuid

import pytest
import torch

import dualexport as dx
from dualexport.errors import InputError
from dualexport.examples import TinyMLP
from dualexport.fleet import BatchRecord, diff_batches, parse_manifest, read_manifest
from dualexport.fleet.estimate import BASE_MB, estimate_entry

REPO = pathlib.Path(__file__).resolve().parents[1]


def _module(folder: pathlib.Path, body: str) -> str:
    """A module of model factories in ``folder`` (a fresh name: children import it anew)."""
    name = f"fleet_models_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def _no_partial_files(folder: pathlib.Path) -> None:
    leftovers = [
        p.name
        for p in folder.rglob("*")
        if p.name.startswith(".dualexport-staging-")
        or p.name.endswith(".tmp")
        or p.name.endswith(".commit.json")
    ]
    assert leftovers == []


# ----------------------------------------------------------------------------- manifest
def test_manifest_reports_each_malformed_entry_with_its_line(tmp_path: pathlib.Path) -> None:
    text = textwrap.dedent(
        """\
        [defaults]
        timeout = 60

        [models.good]
        model = "dualexport.examples:TinyMLP"
        inputs = ["2x16:float32"]

        [models.typo]
        model = "dualexport.examples:TinyMLP"
        input = ["2x16:float32"]

        [models.both]
        model = "dualexport.examples:TinyMLP"
        hf = "BertConfig"
        inputs = ["2x16"]

        [models.bad_dtype]
        model = "dualexport.examples:TinyMLP"
        inputs = ["2x16:float33"]

        [models.bad_range]
        model = "dualexport.examples:TinyMLP"
        inputs = ["2x16:float32"]
        dynamic = ["0.0=4..64"]

        [models."batch.json"]
        model = "dualexport.examples:TinyMLP"
        inputs = ["2x16:float32"]
        """
    )
    m = parse_manifest(text, base=tmp_path)
    assert [e.name for e in m.entries] == ["good"]
    assert m.entries[0].timeout == 60.0 and m.entries[0].line == 4
    bad = {x.name: x for x in m.malformed}
    assert {n: x.line for n, x in bad.items()} == {
        "typo": 8,
        "both": 12,
        "bad_dtype": 17,
        "bad_range": 21,
        "batch.json": 26,
    }
    assert "unknown key 'input'" in bad["typo"].reason and "inputs" in bad["typo"].reason
    assert "exactly one of" in bad["both"].reason
    assert "float33" in bad["bad_dtype"].reason
    assert "outside 4..64" in bad["bad_range"].reason


def test_manifest_that_is_not_toml_names_the_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[models.a]\nmodel = "x:y" extra\ninputs = ["1x2"]\n')
    with pytest.raises(InputError, match=r"line 2"):
        read_manifest(path)


def test_shipped_zoo_manifest_parses() -> None:
    m = read_manifest(REPO / "examples" / "zoo.toml")
    assert len(m.entries) == 12 and not m.malformed
    assert {e.hf is not None for e in m.entries} == {True, False}


def test_estimate_counts_weights_on_the_meta_device(tmp_path: pathlib.Path) -> None:
    m = parse_manifest(
        '[models.big]\nmodel = "torch.nn:Identity"\ninputs = ["2x2"]\n'
        '[models.llama]\nhf = "LlamaConfig"\ntask = "causal-lm"\ninputs = ["1x8:int64:0..99"]\n'
        "config = { hidden_size = 256, intermediate_size = 512, num_hidden_layers = 2, "
        "num_attention_heads = 4, vocab_size = 1000 }\n",
        base=tmp_path,
    )
    ident, llama = m.entries
    assert estimate_entry(ident).weight_bytes == 0  # sized in this process: trusted factories
    est = estimate_entry(llama)
    expected = 4 * (2 * 1000 * 256 + 2 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 256)
    assert est.source == "weights" and est.weight_bytes == pytest.approx(expected, rel=0.02)
    assert est.mb > BASE_MB


# ----------------------------------------------------------------------------- local engine
@pytest.mark.slow  # the default run has the local pool in test_killed_worker_and_timeout_fail_only_their_entry
def test_local_batch_reruns_incrementally_and_diffs(tmp_path: pathlib.Path) -> None:
    """First run: every entry lowered, checked, paged. Unchanged re-run: every target reused and
    the checks carried. One entry's weights changed: only that entry patched and checked again."""
    weights = tmp_path / "w.pt"
    torch.manual_seed(0)
    torch.save(TinyMLP().state_dict(), weights)
    mod = _module(
        tmp_path,
        f"""
        import torch
        from dualexport.examples import TinyMLP

        def mlp():
            m = TinyMLP()
            m.load_state_dict(torch.load({str(weights)!r}))
            return m
        """,
    )
    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            [defaults]
            path = ["."]
            [models.mlp]
            model = "{mod}:mlp"
            inputs = ["4x16:float32"]
            dynamic = ["0.0=batch:1..16"]
            [models.conv]
            model = "dualexport.examples:TinyConvNet"
            inputs = ["1x3x16x16:float32"]
            [models.broken]
            model = "dualexport.examples:TinyMLP"
            inputs = ["4x0:float32"]
            """
        )
    )
    out = tmp_path / "run"
    first = dx.batch(manifest, out, workers=2)
    assert [e.status for e in first.entries] == ["passed", "passed", "invalid"]
    assert "line 10" in first.entry("broken").reason
    for name in ("mlp", "conv"):
        e = first.entry(name)
        assert {t: r.outcome for t, r in e.targets.items()} == {"onnx": "lowered", "xnnpack": "lowered"}
        assert e.weights_ok and e.parity_ok and not e.carried
        assert all(r.parity is not None and r.parity.ok for r in e.targets.values())
        for r in e.targets.values():
            for f in r.files:
                assert (out / name / f.name).stat().st_size == f.bytes
        assert (out / name / f"{name}.report.html").is_file() and (
            out / name / f"{name}.parity.json"
        ).is_file()
        assert e.peak_rss_mb and e.estimate_mb and e.worker
    data = json.loads((out / "batch.json").read_text())
    assert data["schema"] == "dualexport.batch/1" and BatchRecord.from_dict(data).to_dict() == data
    page = (out / "batch.html").read_text()
    assert "mlp/mlp.report.html" in page and "conv/conv.report.html" in page

    second = dx.batch(manifest, out, workers=2)
    for name in ("mlp", "conv"):
        e = second.entry(name)
        assert {r.outcome for r in e.targets.values()} == {"reused"} and e.carried
        same = {t: (r.files, r.parity, r.delegated_share) for t, r in e.targets.items()}
        assert same == {
            t: (r.files, r.parity, r.delegated_share) for t, r in first.entry(name).targets.items()
        }
        assert (out / name / f"{name}.parity.json").is_file()
    assert second.entry("conv").seconds < first.entry("conv").seconds

    state = torch.load(weights)
    state["net.0.weight"] = state["net.0.weight"] * 1.5
    torch.save(state, weights)
    third = dx.batch(manifest, out, workers=2, compare_to=out / "batch.json")
    mlp, conv = third.entry("mlp"), third.entry("conv")
    assert {r.outcome for r in mlp.targets.values()} == {"patched"} and not mlp.carried and mlp.parity_ok
    assert {r.outcome for r in conv.targets.values()} == {"reused"}
    changed = {(c["name"], c["field"]) for c in third.diff["changes"]}
    assert ("mlp", "onnx.bytes") in changed and not any(n == "conv" for n, _ in changed)
    _no_partial_files(out)


def test_killed_worker_and_timeout_fail_only_their_entry(tmp_path: pathlib.Path) -> None:
    """A worker SIGKILLed while its export is being written is reported ``killed`` with the
    signal and phase; a worker past its timeout is killed and reported ``timeout``; the other
    entry completes; no staging folder, temp file or journal survives."""
    out = tmp_path / "run"
    mod = _module(
        tmp_path,
        f"""
        import os, signal, threading, time, pathlib
        from dualexport.examples import TinyConvNet

        def killed():
            folder = pathlib.Path({str(out / "victim")!r})

            def watch():  # die the moment the export starts staging its files
                while True:
                    if folder.is_dir() and any(p.name.startswith(".dualexport-staging-") for p in folder.iterdir()):
                        time.sleep(0.3)
                        os.kill(os.getpid(), signal.SIGKILL)
                    time.sleep(0.01)

            threading.Thread(target=watch, daemon=True).start()
            return TinyConvNet()

        def slow():
            time.sleep(60)
            return TinyConvNet()
        """,
    )
    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""\
            [defaults]
            path = ["."]
            inputs = ["1x3x16x16:float32"]
            [models.victim]
            model = "{mod}:killed"
            [models.sleeper]
            model = "{mod}:slow"
            timeout = 3
            [models.fine]
            model = "dualexport.examples:TinyConvNet"
            """
        )
    )
    res = dx.batch(manifest, out, workers=2)
    victim, sleeper, fine = (res.entry(n) for n in ("victim", "sleeper", "fine"))
    assert victim.status == "killed" and "SIGKILL" in victim.reason, victim.reason
    assert "export" in victim.reason  # the phase it died in
    assert sleeper.status == "timeout" and "load" in sleeper.reason
    assert fine.status == "passed"
    _no_partial_files(out)
    record = out / "victim" / ".victim.set.json"
    if record.is_file():  # killed after its commit point: the set is whole
        assert all((out / "victim" / f).exists() for f in json.loads(record.read_text())["files"])
    else:
        assert not [p.name for p in (out / "victim").glob("victim.*")]


@pytest.mark.slow  # two batches: ~10 s
def test_memory_admission_keeps_two_entries_apart_when_both_do_not_fit(tmp_path: pathlib.Path) -> None:
    """The budget covers the whole batch (this process, the fork server, the running entries):
    with room for what is held now plus one entry's declared peak but not two, two workers run
    the entries one after the other; with the default budget they overlap."""
    import os

    from dualexport.fleet import tree_pss_mb

    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        textwrap.dedent(
            """\
            [defaults]
            inputs = ["2x16:float32"]
            memory_mb = 3000

            [models.a]
            model = "dualexport.examples:TinyMLP"
            [models.b]
            model = "dualexport.examples:TinyMLP"
            """
        )
    )
    held = tree_pss_mb(os.getpid())
    # one entry fits (the fork server's imports take well under 2000 MB); a second would need
    # 3000 MB more than the 2000 MB left beside the first
    tight = dx.batch(manifest, tmp_path / "tight", workers=2, memory_budget_mb=held + 3000 + 2000)
    loose = dx.batch(manifest, tmp_path / "loose", workers=2)

    def spans(record: BatchRecord) -> list[tuple[float, float]]:
        assert [e.status for e in record.entries] == ["passed", "passed"]
        return sorted((e.started or 0.0, (e.started or 0.0) + e.seconds) for e in record.entries)

    (_, end_first), (start_second, _) = spans(tight)
    assert start_second >= end_first  # admitted only once the first had finished
    (_, end_first), (start_second, _) = spans(loose)
    assert start_second < end_first  # room for both: they ran side by side


def test_batch_refuses_bad_arguments(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InputError, match="engine"):
        dx.batch(REPO / "examples" / "zoo.toml", tmp_path, engine="slurm")
    with pytest.raises(InputError, match="workers"):
        dx.batch(REPO / "examples" / "zoo.toml", tmp_path, workers=0)
    with pytest.raises(InputError, match="no entries named"):
        dx.batch(REPO / "examples" / "zoo.toml", tmp_path, only=["nope"])


def test_diff_lists_regressions_first() -> None:
    from dualexport.fleet import EntryRecord, ParitySummary, TargetRecord

    def rec(share: float, ok: bool, status: str) -> EntryRecord:
        return EntryRecord(
            "m",
            status,
            targets={
                "xnnpack": TargetRecord(
                    "xnnpack",
                    True,
                    "lowered",
                    delegated_share=share,
                    subgraphs=1,
                    parity=ParitySummary(ok, 1e-5, 80.0 if ok else 20.0, 1.0, 0.0),
                )
            },
        )

    def batch_of(*entries: EntryRecord) -> BatchRecord:
        return BatchRecord(entries, "m.toml", "", "local", 1, "", 1.0)

    new_only = EntryRecord("n", "passed")
    d = diff_batches(
        batch_of(rec(0.99, True, "passed")), batch_of(rec(0.90, False, "check_failed"), new_only)
    )
    kinds = [c["kind"] for c in d["changes"]]
    assert kinds[: d["regressions"]] == ["regression"] * d["regressions"] and d["regressions"] == 4
    assert kinds[-1] == "new"
    assert {c["field"] for c in d["changes"] if c["kind"] == "regression"} == {
        "status",
        "xnnpack.delegated_share",
        "xnnpack.parity",
        "xnnpack.snr_db",
    }

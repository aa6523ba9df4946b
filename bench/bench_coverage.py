"""Coverage of 46 transformers architectures as users build them (bench/_archs.py), dualexport's
default export against the plain libraries in the same run, per architecture:

- both targets exported or not, parity against eager (dualexport: ``dx.compare``, which also runs
  every declared range at min, max-1 and max; plain: the example inputs, under the same
  per-target tolerances) and dualexport's weight proof (``verify_weights``);
- XNNPACK delegated share over compute ops (getitem and symbolic-size arithmetic aside) and
  subgraphs, static and with serving-style dynamic shapes (decoders: the sequence; text
  encoders: batch and sequence; vision and speech: the batch);
- per-call latency of the static files: ExecuTorch (dualexport's .pte / plain .pte) and ONNX
  Runtime (dualexport's .onnx / plain torch.onnx's), medians of rounds timed alternately.

Each architecture runs in a child process (a crash or leak stays there); results are appended as
JSON lines, so the sweep runs in pieces (``--only``, ``--family``) and resumes. ``--render`` writes
the table into docs/coverage.md between ``<!-- bench:begin -->`` and ``<!-- bench:end -->``.

    python bench/bench_coverage.py --family vision --results /tmp/cov.jsonl
    python bench/bench_coverage.py --render /tmp/cov.jsonl [--before /tmp/cov-before.jsonl]

``--dx-only`` skips the plain libraries and the latency (for a "before" run of another checkout:
``PYTHONPATH=<old src> python bench/bench_coverage.py --dx-only --label before ...``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from dualexport.exporters.delegation import STRUCTURAL_OPS  # noqa: E402  (light: no torch import)

#: Rows of the delegation table that compute nothing: delegate outputs, planned buffers, and the
#: Python arithmetic on symbolic sizes (dualexport's own list, the one ``delegated_share`` uses).
STRUCTURAL = STRUCTURAL_OPS
GOALS = {"median_share": 0.95, "min_share": 0.85, "max_subgraphs": 3, "dynamic_share": 0.90}


def compute_share(by_op: dict[str, tuple[int, int]]) -> tuple[float, int, int]:
    """(share, delegated, total) over compute ops."""
    done = sum(d for op, (d, _) in by_op.items() if op not in STRUCTURAL)
    left = sum(n for op, (_, n) in by_op.items() if op not in STRUCTURAL)
    total = done + left
    return (done / total if total else 1.0), done, total


def _delegation(report: Any) -> dict[str, Any]:
    share, done, total = compute_share(dict(report.by_op))
    outside = sorted(op for op, (_, n) in report.by_op.items() if n and op not in STRUCTURAL)
    return {
        "share": share,
        "delegated": done,
        "compute_ops": total,
        "subgraphs": report.subgraphs,
        "outside": outside,
    }


def _short(exc: BaseException) -> str:
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(root).__name__}: {str(root).strip().splitlines()[0] if str(root).strip() else ''}"
    return text[:240]


# ---------------------------------------------------------------------------- one architecture
def _dx(arch: Any, dynamic: bool, out: pathlib.Path) -> tuple[dict[str, Any], Any]:
    import torch

    import dualexport as dx

    model, args = arch.build(), arch.example()
    row: dict[str, Any] = {}
    t = time.perf_counter()
    try:
        res = dx.export(
            model,
            args,
            out_dir=out,
            name="m",
            cache=False,
            dynamic_shapes=arch.dynamic_shapes() if dynamic else None,
        )
    except Exception as exc:
        return {"error": _short(exc)}, None
    row["export_s"] = time.perf_counter() - t
    row["errors"] = {k: _short(v) for k, v in res.errors.items()}
    if "xnnpack" in res.artifacts and res.artifacts["xnnpack"].delegation is not None:
        row["xnnpack"] = _delegation(res.artifacts["xnnpack"].delegation)
    try:
        res.verify_weights()
        row["weights"] = True
    except Exception as exc:
        row["weights"] = False
        row["weights_error"] = _short(exc)
    try:
        report = dx.compare(res)
        row["parity"] = {
            rt: all(o.metrics[rt].ok for o in report.outputs if rt in o.metrics) and rt not in report.errors
            for rt in ("onnx", "xnnpack")
            if rt in res.artifacts
        }
        row["max_abs"] = {
            rt: max((o.metrics[rt].max_abs for o in report.outputs if rt in o.metrics), default=math.nan)
            for rt in ("onnx", "xnnpack")
            if rt in res.artifacts
        }
    except Exception as exc:
        row["parity"] = {}
        row["parity_error"] = _short(exc)
    with torch.no_grad():
        ref = model(*args)
    row["ref_std"] = float(ref[0].float().std())
    return row, res


def _plain(arch: Any, dynamic: bool, out: pathlib.Path) -> dict[str, Any]:
    import torch

    from _plain import delegation, et_runner, ort_runner, plain_lower
    from dualexport.parity.tolerances import tolerance_for

    model, args = arch.build(), arch.example()
    dyn = arch.dynamic_shapes() if dynamic else None
    with torch.no_grad():
        ref = model(*args)[0]
    row: dict[str, Any] = {}
    try:
        prog = torch.onnx.export(model, args, dynamic_shapes=dyn, dynamo=True, verbose=False)
        prog.save(str(out / "plain.onnx"))
        (got,) = ort_runner(out / "plain.onnx", args)()[:1]
        metrics = tolerance_for("onnx", ref.dtype).judge(torch.from_numpy(got), ref)
        row["onnx"] = {"ok": metrics.ok, "max_abs": metrics.max_abs}
    except Exception as exc:
        row["onnx"] = {"error": _short(exc)}
    try:
        ep = torch.export.export(model, args, dynamic_shapes=dyn)
        edge = plain_lower(ep)
        row["xnnpack_delegation"] = _delegation(delegation(edge))
        with open(out / "plain.pte", "wb") as f:
            edge.to_executorch().write_to_file(f)
        del edge
        got = et_runner(out / "plain.pte", args)()[0]
        metrics = tolerance_for("xnnpack", ref.dtype).judge(got, ref)
        row["xnnpack"] = {"ok": metrics.ok, "max_abs": metrics.max_abs}
    except Exception as exc:
        row["xnnpack"] = {"error": _short(exc)}
    return row


def _latency(dx_res: Any, out: pathlib.Path, args: tuple) -> dict[str, Any]:
    from _plain import et_runner, latency_pair, ort_runner

    lat: dict[str, Any] = {}
    pairs = {
        "et": (dx_res.artifacts.get("xnnpack"), out / "plain.pte", et_runner),
        "ort": (dx_res.artifacts.get("onnx"), out / "plain.onnx", ort_runner),
    }
    for key, (art, plain_path, runner) in pairs.items():
        if art is None or not plain_path.is_file():
            continue
        try:
            mine, plain = latency_pair(runner(art.path, args), runner(plain_path, args))
            lat[key] = {"dx_s": mine, "plain_s": plain, "ratio": mine / plain}
        except Exception as exc:
            lat[key] = {"error": _short(exc)}
    return lat


def run_one(
    name: str, label: str, dx_only: bool, kinds: tuple[str, ...] = ("static", "dynamic")
) -> dict[str, Any]:
    """Every measurement of one architecture (in this process)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from _archs import by_name

    arch = by_name(name)
    result: dict[str, Any] = {
        "arch": name,
        "family": arch.family,
        "label": label,
        "dynamic": arch.dynamic_label(),
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"cov-{name}-") as tmp:
        root = pathlib.Path(tmp)
        for kind, dynamic in (("static", False), ("dynamic", True)):
            if kind not in kinds:
                continue
            (root / kind).mkdir()
            try:
                row, res = _dx(arch, dynamic, root / kind)
            except Exception as exc:
                row, res = {"error": _short(exc), "trace": traceback.format_exc()[-800:]}, None
            result[f"dx_{kind}"] = row
            if not dx_only:
                try:
                    result[f"plain_{kind}"] = _plain(arch, dynamic, root / kind)
                except Exception as exc:
                    result[f"plain_{kind}"] = {"error": _short(exc)}
                if kind == "static" and res is not None:
                    result["latency"] = _latency(res, root / kind, arch.example())
            del res
    result["seconds"] = time.perf_counter() - t0
    return result


# --------------------------------------------------------------------------------- rendering
def _pct(x: Any) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) and not math.isnan(x) else "-"


def _cell(row: dict[str, Any] | None) -> str:
    """ "share / subgraphs, parity" of one dualexport export."""
    if not row:
        return "-"
    if "error" in row:
        return "capture failed"
    d = row.get("xnnpack")
    parity = row.get("parity", {})
    both = all(parity.get(t) for t in ("onnx", "xnnpack")) and not row.get("errors") and row.get("weights")
    failed = sorted(set(row.get("errors", {})) | {t for t, ok in parity.items() if not ok})
    tail = "" if both else " ✗ " + ",".join(failed or ["weights"])
    return (f"{_pct(d['share'])} / {d['subgraphs']}" if d else "no .pte") + tail


def _plain_cell(row: dict[str, Any] | None) -> str:
    if not row:
        return "-"
    d = row.get("xnnpack_delegation")
    bad = [t for t in ("onnx", "xnnpack") if not (row.get(t) or {}).get("ok")]
    return (f"{_pct(d['share'])} / {d['subgraphs']}" if d else "no .pte") + (
        " ✗ " + ",".join(bad) if bad else ""
    )


def _ratio(lat: dict[str, Any] | None, key: str) -> str:
    v = (lat or {}).get(key, {}).get("ratio")
    return f"{v:.2f}x" if isinstance(v, float) else "-"


def load(path: pathlib.Path) -> dict[str, dict[str, Any]]:
    """The last result per architecture in a JSON-lines file."""
    out: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["arch"]] = r
    return out


def _shares(rows: list[dict[str, Any]], key: str) -> list[tuple[float, int]]:
    out = []
    for r in rows:
        d = (
            (r.get(key) or {}).get("xnnpack")
            if key.startswith("dx")
            else (r.get(key) or {}).get("xnnpack_delegation")
        )
        if d:
            out.append((d["share"], d["subgraphs"]))
    return out


def render(after: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> str:
    from _archs import ARCHS, FAMILIES

    lines = [
        "| architecture | family | dynamic | before: dx static | dx static | plain static | before: dx dynamic | "
        "dx dynamic | plain dynamic | ET dx/plain | ORT dx/plain |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arch in ARCHS:
        a, b = after.get(arch.name), before.get(arch.name)
        if a is None:
            continue
        lines.append(
            f"| {arch.name} | {arch.family} | {arch.dynamic_label()} | {_cell((b or {}).get('dx_static'))} | "
            f"{_cell(a.get('dx_static'))} | {_plain_cell(a.get('plain_static'))} | "
            f"{_cell((b or {}).get('dx_dynamic'))} | {_cell(a.get('dx_dynamic'))} | "
            f"{_plain_cell(a.get('plain_dynamic'))} | {_ratio(a.get('latency'), 'et')} | {_ratio(a.get('latency'), 'ort')} |"
        )
    summary = [
        "",
        "| family (count) | before: dx static, median | dx static, median | plain static, median | "
        "before: dx dynamic | dx dynamic, median | plain dynamic, median |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family in (*FAMILIES, "all"):
        rows = [r for r in after.values() if family == "all" or r["family"] == family]
        brows = [r for r in before.values() if family == "all" or r["family"] == family]
        if not rows:
            continue

        def med(pairs: list[tuple[float, int]]) -> str:
            if not pairs:
                return "-"
            return (
                f"{_pct(statistics.median(p[0] for p in pairs))}, {statistics.median(p[1] for p in pairs):g}"
            )

        summary.append(
            f"| {family} ({len(rows)}) | {med(_shares(brows, 'dx_static'))} | {med(_shares(rows, 'dx_static'))} | "
            f"{med(_shares(rows, 'plain_static'))} | {med(_shares(brows, 'dx_dynamic'))} | "
            f"{med(_shares(rows, 'dx_dynamic'))} | {med(_shares(rows, 'plain_dynamic'))} |"
        )
    return "\n".join(lines + summary)


def write_doc(table: str, doc: pathlib.Path, command: str) -> None:
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    text = doc.read_text() if doc.is_file() else ""
    block = (
        f"{begin}\n\nGenerated by `{command}`. Cells: XNNPACK delegated share over compute ops / "
        "subgraphs; ✗ names a target that failed to export, to match eager, or (dualexport) its "
        "weight proof. Latency: median per call of the static files, dualexport / plain.\n\n"
        f"{table}\n\n{end}"
    )
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = (
            text.rstrip()
            + "\n\n## Transformers architectures as users build them (bench/bench_coverage.py)\n\n"
            + block
            + "\n"
        )
    doc.write_text(text)


# -------------------------------------------------------------------------------------- main
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--results", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "dx-coverage.jsonl"
    )
    p.add_argument("--only", action="append", default=[], help="this architecture (repeatable)")
    p.add_argument("--family", action="append", default=[], help="this family (repeatable)")
    p.add_argument("--label", default="after")
    p.add_argument("--dx-only", action="store_true", help="dualexport only (no plain libraries, no latency)")
    p.add_argument("--redo", action="store_true", help="run architectures already in --results again")
    p.add_argument("--kinds", default="static,dynamic", help="static, dynamic or both (a quick survey)")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--render", type=pathlib.Path, help="write the table of these results into --doc")
    p.add_argument("--before", type=pathlib.Path, help="(with --render) the before run's results")
    p.add_argument("--doc", type=pathlib.Path, default=ROOT / "docs" / "coverage.md")
    ns = p.parse_args(argv)

    if ns.one:
        print(json.dumps(run_one(ns.one, ns.label, ns.dx_only, tuple(ns.kinds.split(",")))), flush=True)
        return 0
    if ns.render:
        table = render(load(ns.render), load(ns.before) if ns.before else {})
        write_doc(table, ns.doc, "python bench/bench_coverage.py --render RESULTS --before BEFORE")
        print(table)
        return 0

    from _archs import ARCHS

    done = set() if ns.redo else set(load(ns.results))
    chosen = [
        a for a in ARCHS if (not ns.only or a.name in ns.only) and (not ns.family or a.family in ns.family)
    ]
    for arch in chosen:
        if arch.name in done:
            continue
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--one", arch.name, "--label", ns.label, "--kinds", ns.kinds]
        cmd += ["--dx-only"] if ns.dx_only else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            result = (
                json.loads(lines[-1])
                if lines
                else {
                    "arch": arch.name,
                    "family": arch.family,
                    "label": ns.label,
                    "crash": (proc.stderr or "")[-600:],
                }
            )
        except subprocess.TimeoutExpired:
            result = {"arch": arch.name, "family": arch.family, "label": ns.label, "crash": "timeout"}
        with open(ns.results, "a") as f:
            f.write(json.dumps(result) + "\n")
        s, d = result.get("dx_static", {}), result.get("dx_dynamic", {})
        print(
            f"{arch.name:14s} static {_cell(s):24s} dynamic {_cell(d):24s} "
            f"plain {_plain_cell(result.get('plain_static')):14s} ({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The plain-library path every benchmark compares against: ``torch.onnx.export`` on the module,
then a separate ``torch.export`` and ``to_edge_transform_and_lower`` for ExecuTorch/XNNPACK."""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch


def plain_onnx(model: torch.nn.Module, args: tuple[Any, ...], path: pathlib.Path) -> None:
    """torch.onnx.export on the module (its own trace), saved to ``path``."""
    prog = torch.onnx.export(model, args, dynamo=True, verbose=False)
    prog.save(str(path))


def plain_lower(ep: torch.export.ExportedProgram) -> Any:
    """to_edge_transform_and_lower with the XNNPACK partitioner: the edge manager."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])


def plain_pte(model: torch.nn.Module, args: tuple[Any, ...], path: pathlib.Path) -> Any:
    """A second torch.export, lowering, serialization to ``path``; returns the edge manager."""
    ep = torch.export.export(model, args)
    edge = plain_lower(ep)
    with open(path, "wb") as f:
        edge.to_executorch().write_to_file(f)
    return edge


def plain_dual(model: torch.nn.Module, args: tuple[Any, ...], out: pathlib.Path) -> None:
    plain_onnx(model, args, out / "plain.onnx")
    plain_pte(model, args, out / "plain.pte")


def delegation(edge: Any) -> Any:
    """The DelegationReport of an edge manager (the same table dx reports)."""
    from dualexport.exporters.delegation import DelegationReport

    return DelegationReport.from_graph_module(edge.exported_program().graph_module)


def latency(run: Any, calls: int = 30, repeats: int = 3) -> tuple[float, float, float]:
    """Per-call seconds: min/median/max over ``repeats`` batches of ``calls`` calls (after warm-up)."""
    run()
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            run()
        per.append((time.perf_counter() - t) / calls)
    return min(per), statistics.median(per), max(per)


def latency_pair(mine: Any, plain: Any, calls: int = 50, rounds: int = 15) -> tuple[float, float]:
    """Median per-call seconds of two runners timed in alternating rounds (``latency_rounds``)."""
    got = latency_rounds({"mine": mine, "plain": plain}, calls=calls, rounds=rounds)
    return got["mine"], got["plain"]


def latency_rounds(runners: dict[Any, Any], calls: int = 50, rounds: int = 15) -> dict[Any, float]:
    """Median per-call seconds of each runner, timed in rounds that visit every runner in turn
    (``calls`` calls each, after warm-up): on a noisy machine a load spike then lands on all of
    them, where timing one runner after the other once put tiny BERT's ratio at 1.61x and
    interleaved at 0.77x."""
    for run in runners.values():
        for _ in range(max(5, calls // 5)):
            run()
    per: dict[Any, list[float]] = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            t = time.perf_counter()
            for _ in range(calls):
                run()
            per[key].append((time.perf_counter() - t) / calls)
    return {key: statistics.median(times) for key, times in per.items()}


def et_runner(path: pathlib.Path, inputs: Sequence[torch.Tensor]) -> Any:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(path)).load_method("forward")
    return lambda: method.execute(list(inputs))


def ort_runner(path: pathlib.Path, inputs: Sequence[torch.Tensor]) -> Any:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(s.get_inputs(), inputs, strict=True)}
    return lambda: s.run(None, feed)

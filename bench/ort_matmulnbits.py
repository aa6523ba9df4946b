"""ONNX Runtime's ``MatMulNBits`` per call, one token, by accuracy level, bits and zero-point kind:
why ``export_llm``'s quantized .onnx runs at level 4 with its 8-bit head as an 8-bit
``MatMulNBits``, and why its group offsets stay a float correction instead of float zero points.

Each row is a chain of ``--layers`` ``MatMulNBits`` of SmolLM2-135M's MLP shape (K 576, N 1536,
block 32) run on one token; the ratio is against the level-0 4-bit kernel without zero points
(the plain path ONNX Runtime takes for an int4 file whose session sets no accuracy level entry
but level 0), measured in the same run.

Run: ``python bench/ort_matmulnbits.py [--layers 30] [--rounds 5]``; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

K, N, BLOCK = 576, 1536, 32


def _model(level: int, bits: int, zero_points: str | None, layers: int) -> bytes:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = K // BLOCK
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        inits.append(
            numpy_helper.from_array(
                rng.integers(0, 256, (N, blocks, BLOCK * bits // 8), dtype=np.uint8), f"b{i}"
            )
        )
        inits.append(
            numpy_helper.from_array((rng.random(N * blocks) * 0.01 + 0.001).astype(np.float32), f"s{i}")
        )
        ins = [x, f"b{i}", f"s{i}"]
        if zero_points == "uint8":
            per_row = (blocks + 1) // 2 if bits == 4 else blocks
            inits.append(numpy_helper.from_array(rng.integers(0, 256, N * per_row, dtype=np.uint8), f"z{i}"))
            ins.append(f"z{i}")
        elif zero_points == "float":
            inits.append(numpy_helper.from_array((rng.random(N * blocks) * 15).astype(np.float32), f"z{i}"))
            ins.append(f"z{i}")
        attrs: dict[str, Any] = {"K": K, "N": N, "bits": bits, "block_size": BLOCK, "accuracy_level": level}
        nodes.append(helper.make_node("MatMulNBits", ins, [f"y{i}"], domain="com.microsoft", **attrs))
        nodes.append(helper.make_node("Slice", [f"y{i}", "start", "end", "axis"], [f"x{i}"]))
        x = f"x{i}"
    for name, value in (("start", 0), ("end", K), ("axis", 2)):
        inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, K])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, K])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def _per_call_us(level: int, bits: int, zero_points: str | None, layers: int, rounds: int) -> float:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        _model(level, bits, zero_points, layers), options, providers=["CPUExecutionProvider"]
    )
    x = np.random.default_rng(1).random((1, 1, K), dtype=np.float32)
    for _ in range(10):
        session.run(None, {"x": x})
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(50):
            session.run(None, {"x": x})
        times.append((time.perf_counter() - start) / 50 / layers * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    rows = [
        (0, 4, None),
        (0, 4, "uint8"),
        (0, 4, "float"),
        (4, 4, None),
        (4, 4, "uint8"),
        (4, 4, "float"),
        (0, 8, None),
        (4, 8, None),
    ]
    base = _per_call_us(0, 4, None, ns.layers, ns.rounds)
    print(f"MatMulNBits K={K} N={N} block {BLOCK}, one token, median of {ns.rounds} rounds, us per call")
    print(f"{'level':>5} {'bits':>4} {'zero points':>12} {'us':>9} {'vs level 0 int4':>16}")
    for level, bits, zp in rows:
        us = (
            base if (level, bits, zp) == (0, 4, None) else _per_call_us(level, bits, zp, ns.layers, ns.rounds)
        )
        print(f"{level:>5} {bits:>4} {zp or '-':>12} {us:>9.1f} {base / us:>15.2f}x")


if __name__ == "__main__":
    main()

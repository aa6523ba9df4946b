"""A model with a buffer counter agrees across runtimes at every step of 3: ONNX gets the state
as an explicit input/output, ExecuTorch keeps its own (initialized from the buffer)."""

from __future__ import annotations

import pathlib

import onnx
import torch
from torch import nn

import dualexport as dx


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("count", torch.full((1,), 5.0))  # non-zero start: must be kept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += x.sum()
        return self.fc(x) + self.count


def test_counter_agrees_at_every_step(tmp_path: pathlib.Path) -> None:
    model = Counter()
    x = torch.randn(2, 4)
    res = dx.export(model, (x,), out_dir=tmp_path, name="counter")
    assert not res.errors
    assert torch.equal(res.program.state_dict["count"], torch.full((1,), 5.0))  # untouched by tracing
    proto = onnx.load(str(res.artifacts["onnx"].path))
    assert [i.name for i in proto.graph.input] == ["b_count", "x"]
    assert len(proto.graph.output) == 2 and "dualexport.state" in {p.key for p in proto.metadata_props}

    report = dx.compare(res, steps=3)
    assert report.ok, report.to_markdown()
    assert len(report.outputs) == 3
    # running the reference never changed the holder
    assert torch.equal(res.program.state_dict["count"], torch.full((1,), 5.0))
    res.verify_weights()
    # the eager model accumulates (step 2 differs from step 0); it shares its tensors with the
    # holder, so this runs last
    eager = model.eval()
    outs = [eager(x) for _ in range(3)]
    assert not torch.allclose(outs[0], outs[2])

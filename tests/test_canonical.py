"""Models the plain libraries fail on, exported to both targets with parity.

Each case is a pair: the plain library path the way a user meets it, as a strict xfail naming the
library bug (it XPASSes, and the strict xfail fails, the day the library is fixed), and
dualexport's default export of the same model: no target error, weights from disk, parity.
"""

from __future__ import annotations

import os
import pathlib

import pytest
import torch
from torch import nn

import dualexport as dx

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _t5() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The T5 encoder from a tiny config (random weights), with the default (SDPA) attention."""
    import transformers

    from dualexport.loading import HFWrapper

    torch.manual_seed(0)
    cfg = transformers.T5Config(
        d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2, vocab_size=100, use_cache=False
    )
    model = HFWrapper(transformers.T5EncoderModel(cfg).eval(), ("input_ids",), 1).eval()
    return model, (torch.randint(0, 100, (1, 16)),)


class MaxPoolDefaultStride(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)  # stride left to default


def _maxpool() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MaxPoolDefaultStride().eval(), (torch.randn(1, 4, 8, 8),)


class DashedNames(nn.Module):
    """Module names with a dash, as torchvision's RegNet has (``trunk_output.block1.block1-0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential()
        for i in range(2):
            self.trunk.add_module(
                f"block1-{i}",
                nn.Sequential(nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x)


def _dashed() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = DashedNames()
    m.train()
    with torch.no_grad():
        m(torch.randn(4, 3, 8, 8))
    return m.eval(), (torch.randn(1, 3, 8, 8),)


class DeadSizedByValue(nn.Module):
    """A tensor sized by an input's value and then unused: OPT's position mask, sized by
    ``past_key_values.get_seq_length() + seq`` (a 0-dim tensor under export_llm's cache) and dead
    once position ids are given. The program keeps the value read and its assertion."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        n = pos[0] + x.shape[1]  # a 0-dim tensor used as a size: .item() in the program
        _ = torch.ones(x.shape[0], n)
        return self.lin(x)


def _dead_sized() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return DeadSizedByValue().eval(), (torch.randn(2, 8), torch.tensor([3]))


class SqueezeOfNonUnit(nn.Module):
    """``squeeze(1)`` of a dim that is not 1 (a no-op in eager): code written for one token
    (``x[:, 1:].squeeze(1)`` for a length-2 sequence) run on longer ones."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x[:, 1:].squeeze(1)).squeeze(-1)


def _squeeze() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return SqueezeOfNonUnit().eval(), (torch.randn(2, 8, 4),)


def _plain_onnx(model: nn.Module, args: tuple) -> None:
    import onnxruntime as ort

    program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args, strict=True)})


def _plain_xnnpack(model: nn.Module, args: tuple) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    edge = to_edge_transform_and_lower(torch.export.export(model, args), partitioner=[XnnpackPartitioner()])
    Runtime.get().load_program(edge.to_executorch().buffer).load_method("forward").execute(list(args))


CASES = {
    "t5_encoder": (
        _t5,
        _plain_onnx,
        "torch.onnx 2.13 fails in run_decompositions on the T5 encoder: 'Cannot view "
        "a tensor with shape [1, 16, 4, 16] and strides (1024, 16, 256, 1)' (a view of the transposed "
        "decomposed SDPA output after contiguous() was dropped; pytorch#136543 and siblings)",
    ),
    "maxpool_default_stride": (
        _maxpool,
        _plain_xnnpack,
        "ExecuTorch 1.4.1 XNNPACK MaxPool2dConfig reads node.args[2] "
        "(the stride), absent with the default stride: IndexError in "
        "to_edge_transform_and_lower (executorch#21488)",
    ),
    "dashed_module_names": (
        _dashed,
        _plain_xnnpack,
        "ExecuTorch 1.4.1 FuseBatchNormPass names the fused weight "
        "with '-' kept but looks it up by FX's sanitized node name: ValueError "
        "'..._block1-0_0_weight_fused_bn' is not in list (torchvision RegNet)",
    ),
    "value_read_only_asserted": (
        _dead_sized,
        _plain_xnnpack,
        "ExecuTorch 1.4.1's re-trace of a program whose .item() feeds only an assertion fails: "
        "AssertionError 'Expected output node' in to_edge (PendingUnbackedSymbolNotFound in "
        "run_decompositions), as on transformers' OPT under export_llm",
    ),
    "squeeze_of_a_non_unit_dim": (
        _squeeze,
        _plain_onnx,
        "torch.onnx 2.13 writes squeeze(1) of a dim of size 7 (a no-op in eager) as ONNX Squeeze "
        "over that axis: ONNX Runtime 1.31 refuses to load the file ('Dimension of input 1 must be "
        "1 instead of 7')",
    ),
}


class KnownLimit(Exception):
    """The plain library failed the way the case's reason says (not some unrelated crash)."""


#: case -> (the exception the plain library raises, a pattern of its message or of a cause's)
SIGNATURES: dict[str, tuple[type[BaseException], str]] = {
    "t5_encoder": (RuntimeError, r"Cannot view a tensor with shape"),
    "maxpool_default_stride": (IndexError, r"tuple index out of range"),
    "dashed_module_names": (Exception, r"FuseBatchNormPass|is not in list"),
    "value_read_only_asserted": (Exception, r"Expected output node|Pending unbacked symbols"),
    "squeeze_of_a_non_unit_dim": (Exception, r"must be 1 instead of 7"),
}


def _messages(exc: BaseException | None) -> str:
    text = []
    while exc is not None:
        text.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return "\n".join(text)


@pytest.mark.parametrize(
    "case",
    [
        # slow: each runs a plain library to its failure (a whole lowering for some); the
        # dualexport side of each case stays in the default run
        pytest.param(
            c,
            marks=[pytest.mark.xfail(strict=True, reason=CASES[c][2], raises=KnownLimit), pytest.mark.slow],
        )
        for c in CASES
    ],
)
def test_plain_library_fails(case: str) -> None:
    import re

    build, plain, _ = CASES[case]
    model, args = build()
    kind, pattern = SIGNATURES[case]
    try:
        plain(model, args)
    except kind as exc:
        if re.search(pattern, _messages(exc)):
            raise KnownLimit(f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        raise


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[pytest.mark.slow] if c == "t5_encoder" else []) for c in CASES]
)
def test_dualexport_exports_both_targets_with_parity(case: str, tmp_path: pathlib.Path) -> None:
    build, _, _ = CASES[case]
    model, args = build()
    res = dx.export(model, args, out_dir=tmp_path, name=case, cache=False)
    assert not res.errors, {t: str(e) for t, e in res.errors.items()}
    assert set(res.artifacts) == {"onnx", "xnnpack"}
    res.verify_weights()
    report = dx.compare(res, generate=1)
    assert report.ok, report.to_markdown()
    ref = res.program.run_eager(*args)
    ref = ref[0] if isinstance(ref, tuple) else ref
    assert float(ref.std()) > 1e-3  # not a vacuous comparison


def test_canonicalizations_keep_the_computation() -> None:
    """Each canonicalization changes how the graph is written, never what it computes."""
    from dualexport.shared_state import SharedProgram
    from dualexport.shared_state.passes import CANONICALIZATIONS

    for build, changes in (
        (_t5, {"ReshapeForView", "ContiguousAsCopy"}),
        (_maxpool, {"ExplicitPoolArgs"}),
        (_dead_sized, {"AssertOnlyScalars"}),
        (_squeeze, {"SqueezeOnlyUnitDims"}),
    ):
        model, args = build()
        shared = SharedProgram.capture(model, args)
        before = shared.exported_program.module()(*args)
        records = shared.apply_passes(CANONICALIZATIONS)
        assert {r.name for r in records if r.modified} == changes, (build, records)
        after = shared.exported_program.module()(*args)
        torch.testing.assert_close(after, before, rtol=0, atol=0)

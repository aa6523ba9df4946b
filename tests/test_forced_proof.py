"""The linear-by-linear proof of a quantized program's file (parity/forced.py, pipeline/forced_proof.py).

An int4 program with per-token int8 activations is chaotic on real weights, so a correct file can
sit far from the program end to end; teacher forcing judges each linear on the file's own input
instead. What must hold: a file that differs only by float rounding passes, even when its inputs
come through a chain that amplified a tiny difference; a doubled scale or transposed codes of one
32-weight block fail at the layer they are in, with that layer named.

The fast checks drive ``teacher_forced`` with values made by running the program itself with a
planted defect (no export); the slow ones plant the defects in exported files.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from dualexport.llm.quantize import SCHEMES, quantize_linears
from dualexport.parity.forced import FLIPS, linear_taps, teacher_forced
from dualexport.parity.localize import reference_values

torch.manual_seed(0)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128, bias=False)
        self.mid = nn.Linear(128, 128)
        self.down = nn.Linear(128, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(x))
        h = h + torch.relu(self.mid(h))
        return self.down(h) * 3.0


@pytest.fixture(scope="module")
def quantized() -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    model = Mlp().eval()
    with torch.no_grad():  # an outlier channel, as real weights have
        model.up.weight[:, 5] *= 20.0
    x = torch.randn(2, 16, 64)
    program = torch.export.export(model, (x,))
    return quantize_linears(program, SCHEMES["int4"]), x


@contextlib.contextmanager
def planted(program: torch.export.ExportedProgram, name: str, edit: Any) -> Iterator[None]:
    """``program`` with one buffer replaced by an edited copy, for the ``with`` block."""
    original = program.state_dict[name]
    program.state_dict[name] = edit(original.clone())
    try:
        yield
    finally:
        program.state_dict[name] = original


def linear_values(program: torch.export.ExportedProgram, x: torch.Tensor) -> dict[str, torch.Tensor]:
    values = reference_values(program, [x])
    return {n: values[n] for n in linear_taps(program)}


def test_a_file_that_only_rounds_otherwise_passes_every_linear(quantized: Any) -> None:
    program, x = quantized
    exact = teacher_forced(program, [x], linear_values(program, x))
    # the three quantized linears, and the group sums of their inputs and offsets of int4's grid
    assert len(exact.linears) == 3 * 3 and exact.worst == 0.0
    # a file whose values differ by float rounding, and whose input came through a chain that
    # amplified a 1e-6 change into other activation levels: within the bound at every linear
    noisy = {
        n: v * (1 + 1e-6 * torch.randn_like(v)) for n, v in linear_values(program, x * (1 + 1e-6)).items()
    }
    result = teacher_forced(program, [x], noisy)
    assert result.first_failure is None, [v.describe() for v in result.linears]
    assert 0.0 < result.worst < 1.0


def test_the_bound_allows_a_few_activation_levels_and_no_more(quantized: Any) -> None:
    """A file whose kernel rounds FLIPS + 2 activations of one token to the other level is out of
    the bound; FLIPS of them is within it."""
    program, x = quantized
    step_node = next(n for n in program.graph.nodes if "choose_qparams" in str(n.target))
    values = reference_values(program, [x])
    # the first linear's input levels, moved by one step at k activations of token 0
    scale = next(values[u.name] for u in step_node.users if u.args[1] == 0)
    w = next(v for n, v in values.items() if "dequantize_affine" in n and v.shape == (128, 64))
    k_top = w.abs().amax(0).argsort(descending=True)  # the inputs with the largest weights
    up = next(  # the quantized linear of `up` (its input quantized, not the group sums of it)
        n.name
        for n in program.graph.nodes
        if n.name in linear_taps(program) and "dequantize" in str(n.args[0].target)
    )
    results = {}
    for flips in (FLIPS, FLIPS + 2):
        observed = linear_values(program, x)
        delta = torch.zeros(64)
        delta[k_top[:flips]] = scale.flatten()[0]
        observed[up] = observed[up].clone()
        observed[up][0, 0] += torch.nn.functional.linear(delta, w)
        results[flips] = next(v for v in teacher_forced(program, [x], observed).linears if v.node == up)
    assert results[FLIPS].ok, results[FLIPS].describe()
    assert not results[FLIPS + 2].ok, results[FLIPS + 2].describe()


@pytest.mark.parametrize("defect", ["scale doubled", "codes transposed"])
def test_a_defect_in_one_block_is_refused_at_its_layer(quantized: Any, defect: str) -> None:
    program, x = quantized

    def edit(t: torch.Tensor) -> torch.Tensor:
        if defect == "scale doubled":
            t[7, 2] *= 2.0  # the scale of one group of 32 weights
        else:
            t[7, 64:96] = t[7, 64:96].flip(0)  # one block's codes in reverse order
        return t

    buffer = "mid.int4_scales" if defect == "scale doubled" else "mid.int4_codes"
    with planted(program, buffer, edit):
        observed = linear_values(program, x)
    result = teacher_forced(program, [x], observed)
    bad = result.first_failure
    assert bad is not None, [v.describe() for v in result.linears]
    assert bad.module == "mid" and "mid.int4_codes" in bad.weights, bad.describe()
    assert bad.ratio > 10.0, bad.describe()
    assert all(v.ok for v in result.linears if v.module == "up")  # the layer before it is not blamed


# ------------------------------------------------------------------- defects planted in files
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _tamper_onnx(path: pathlib.Path, defect: str) -> str:
    """Plant ``defect`` in one block of the .onnx's first quantized MLP weight; return the layer."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=True)
    inits = {i.name: i for i in model.graph.initializer}
    name = next(
        n
        for n in inits
        if ".mlp.down_proj." in n
        and n.endswith(("scales.kn", "codes.kn"))
        and (("scales" in n) == (defect == "scale doubled"))
    )
    arr = numpy_helper.to_array(inits[name]).copy()
    if defect == "scale doubled":
        arr[1, 3] *= 2  # [K / group, N] after the move to MatMulNBits' layout
    else:
        arr[32:64, 3] = arr[32:64, 3][::-1].copy()
    inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr).astype(arr.dtype), name))
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return name.split(".mlp.down_proj.")[0] + ".mlp.down_proj"


class CachedStep(nn.Module):
    """A runner program in miniature: a cache buffer written at a data-dependent position with
    ExecuTorch's ``llama::update_cache``, read by a linear after it."""

    def __init__(self) -> None:
        super().__init__()
        self.key = nn.Linear(16, 16)
        self.out = nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(1, 4, 1, 16), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        start = pos[0].item()
        torch._check(start >= 0)
        torch._check(start < 4)
        torch.ops.llama.update_cache(self.key(x).view(1, 1, 1, 16), self.cache, start)
        return self.out(self.cache.sum(dim=1))


def test_a_stateful_program_lowers_twice_and_each_tap_is_its_own_node_call_after_call() -> None:
    """What the runner .pte's linear-by-linear proof stands on (llm/deploy/runner_proof.py): a
    program whose cache is written at ``pos[0].item()`` lowers a second time after the first
    (the first trace's unbacked sizes do not stay pending: ``compat.torch.pending_unbacked_kept``),
    each tap of the tapped lowering reads its own node although the method returns no mutation
    output, and teacher forcing with ``state`` carries the cache from call to call as the file
    does: three calls, every linear within its bound, the outputs the file's."""
    from dualexport.compat.executorch import load_llm_ops
    from dualexport.exporters.xnnpack import XnnpackExporter, lower_to_buffer
    from dualexport.parity.forced import initial_state
    from dualexport.parity.localize import TappedXnnpack

    load_llm_ops()
    module = CachedStep().eval()
    with torch.no_grad():
        captured = torch.export.export(module, (torch.randn(1, 1, 16), torch.tensor([0])), strict=False)
    program = XnnpackExporter().decompose(captured)  # the functional form: the cache a mutation
    assert lower_to_buffer(program)  # the file
    names = set(linear_taps(program))
    tapped = TappedXnnpack(program, lambda n: n.name in names, same_names=True)  # lowered again
    state = initial_state(program)
    assert set(state) == {"cache"}
    for pos in range(3):
        inputs = [torch.randn(1, 1, 16), torch.tensor([pos])]
        values = tapped.values(inputs)
        observed = {n: v for n, v in values.items() if n in names}
        assert set(observed) == names
        if pos == 0:  # an empty cache: the program's own values, node by node
            own = reference_values(program, inputs)
            for name, value in observed.items():
                torch.testing.assert_close(value.reshape(own[name].shape), own[name], rtol=1e-5, atol=1e-5)
        else:  # without the carried cache the program reads an empty one: the reading linear fails
            fresh = teacher_forced(program, inputs, observed)
            assert fresh.first_failure is not None and fresh.first_failure.module == "out"
        forced = teacher_forced(program, inputs, observed, state)
        assert forced.first_failure is None and len(forced.linears) == 2
        torch.testing.assert_close(forced.outputs[0], values["output:0"], rtol=1e-5, atol=1e-5)
    written = state["cache"][0, :, 0]
    assert bool(written[:3].abs().sum(dim=1).gt(0).all()) and float(written[3].abs().sum()) == 0.0


def stale_decomposition(monkeypatch: pytest.MonkeyPatch, edit: Any = None) -> list[str]:
    """Make the XNNPACK decomposition hand back a state_dict holding a copy of one ``up_proj``
    int4 scale tensor (the stale copy of the first public bug), edited in place by ``edit``;
    the returned list receives the copied weight's name at each decomposition."""
    from dualexport.compat.torch import set_weight_dicts
    from dualexport.exporters.xnnpack import XnnpackExporter

    decompose = XnnpackExporter.decompose
    copied: list[str] = []

    def stale(self: Any, program: Any, options: Any = None) -> Any:
        dec = decompose(self, program, options)
        name = next(k for k in dec.state_dict if ".mlp.up_proj." in k and k.endswith("int4_scales"))
        state = dict(dec.state_dict)
        state[name] = state[name].clone()
        if edit is not None:
            edit(state[name])
        set_weight_dicts(dec, state_dict=state)
        copied.append(name)
        return dec

    monkeypatch.setattr(XnnpackExporter, "decompose", stale)
    return copied


@pytest.mark.slow
@pytest.mark.parametrize("defect", ["scale doubled", "codes transposed"])
def test_a_defect_planted_in_the_onnx_file_is_refused_with_its_layer(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, defect: str
) -> None:
    import dualexport as dx
    from dualexport.exporters.onnx import OnnxExporter
    from test_llm import make_model

    lower = OnnxExporter.lower
    layers: list[str] = []

    def tampered(self: Any, program: Any, staging: pathlib.Path, name: str, options: Any) -> Any:
        lowered = lower(self, program, staging, name, options)
        layers.append(_tamper_onnx(pathlib.Path(lowered.files[0]), defect))
        return lowered

    monkeypatch.setattr(OnnxExporter, "lower", tampered)
    res = dx.export_llm(
        make_model("llama"), max_seq_len=32, out_dir=tmp_path, quantize="int4", target="onnx", deploy=False
    )
    assert not res.ok and layers
    message = str(res.errors["onnx"])
    print(message)  # the figures the closing note quotes
    assert "linear" in message and layers[0].removeprefix("model.").split(".int4")[0] in message, message
    assert not list(tmp_path.glob("*.onnx"))


@pytest.mark.slow
def test_a_stale_block_in_the_pte_program_is_refused_with_its_layer(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The XNNPACK decomposition hands back a state_dict whose one block scale is a doubled copy
    (the stale copy of the first public bug): the .pte computes it, and the proof names the layer."""
    import dualexport as dx
    from test_llm import make_model

    def doubled(scales: torch.Tensor) -> None:
        scales[3, 1] *= 2.0

    copied = stale_decomposition(monkeypatch, doubled)
    res = dx.export_llm(
        make_model("llama"), max_seq_len=32, out_dir=tmp_path, quantize="int4", target="xnnpack"
    )
    assert not res.ok and copied
    planted_in = copied[0].rsplit(".int4", 1)[0]
    message = str(res.errors["xnnpack"])
    print(message)
    assert f"linear model.{planted_in}" in message or planted_in in message, message
    assert not list(tmp_path.glob("*.pte"))

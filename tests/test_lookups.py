"""Index work that computes nothing input-dependent, folded on the shared program (fast, no
lowering): BERT-family token-type lookups from an all-zero buffer become one broadcast row, and
``x + 0`` on integer position ids goes; the program still computes what the module computes at
every size of its range, and the passes leave alone what they cannot prove."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

from dualexport.exporters.base import ExportOptions
from dualexport.pipeline.export import shared_passes
from dualexport.shared_state import SharedProgram
from dualexport.shared_state.passes import IntegerIdentities, UniformLookup

aten = torch.ops.aten


class Embeddings(nn.Module):
    """RoBERTa's embeddings in small: position ids from the padding (cumsum + past length 0), token
    types gathered from a registered buffer by those position ids, three lookups summed."""

    def __init__(self, token_types: torch.Tensor | None = None, pad: int = 1) -> None:
        super().__init__()
        self.pad = pad
        self.words = nn.Embedding(50, 16, padding_idx=pad)
        self.positions = nn.Embedding(40, 16, padding_idx=pad)
        self.types = nn.Embedding(2, 16)
        self.register_buffer(
            "token_type_ids",
            torch.zeros(1, 40, dtype=torch.long) if token_types is None else token_types,
            persistent=False,
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        mask = ids.ne(self.pad).int()
        past = 0
        pos = (torch.cumsum(mask, dim=1).type_as(mask) + past) * mask
        pos = pos.long() + self.pad
        types = torch.gather(self.token_type_ids.expand(b, -1), 1, pos)
        return self.words(ids) + self.types(types) + self.positions(pos)


def _ids(b: int, s: int) -> torch.Tensor:
    ids = torch.randint(2, 50, (b, s))
    ids[0, s // 2 :] = 1  # padding: position ids stay at the padding index there
    return ids


def _lookups(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.target is aten.embedding.default]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_uniform_token_types_are_one_row_and_values_hold(dynamic: bool) -> None:
    model = Embeddings().eval()
    spec: Any = ({0: Dim("b", min=1, max=4), 1: Dim("s", min=2, max=30)},) if dynamic else None
    shared = SharedProgram.capture(model, (_ids(2, 8),), None, spec)
    records = shared.apply_passes(shared_passes(ExportOptions()))
    ran = {r.name: r.modified for r in records}
    assert ran["UniformLookup"] and ran["IntegerIdentities"], ran
    ep = shared.exported_program
    rows = [n for n in _lookups(ep) if n.meta["val"].shape[:2] == (1, 1)]
    assert len(rows) == 1, [n.meta["val"].shape for n in _lookups(ep)]
    assert aten.gather.default not in {n.target for n in ep.graph.nodes}
    assert not [n for n in ep.graph.nodes if n.target is aten.add.Tensor and n.args[1] == 0]
    for b, s in ((1, 2), (2, 8), (4, 29), (4, 30)) if dynamic else ((2, 8),):
        ids = _ids(b, s)
        torch.testing.assert_close(shared.run_eager(ids), model(ids), rtol=0, atol=0)


def test_a_lookup_that_is_not_uniform_or_not_broadcast_stays() -> None:
    """Token types that differ along the sequence, and a lookup the module returns as it is (no
    reader broadcasts it), are not rewritten; float ``x + 0`` is not an identity either."""
    mixed = torch.zeros(1, 40, dtype=torch.long)
    mixed[0, 20:] = 1
    model = Embeddings(mixed).eval()

    class Returned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.types = nn.Embedding(2, 4)
            self.register_buffer("zeros", torch.zeros(1, 9, dtype=torch.long), persistent=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.types(self.zeros.expand(x.shape[0], -1)), x + 0

    cases: list[tuple[nn.Module, tuple[torch.Tensor, ...], list[Any]]] = [
        (model, (_ids(2, 8),), [UniformLookup()]),
        (Returned().eval(), (torch.randn(3, 9),), [IntegerIdentities(), UniformLookup()]),
    ]
    for module, args, passes in cases:
        shared = SharedProgram.capture(module, args)
        shared.apply_passes(shared_passes(ExportOptions(canonicalize=False)))
        before = shared.exported_program.graph_module.code
        records = shared.apply_passes(passes)
        assert not any(r.modified for r in records), before
        for got, want in zip(
            torch.utils._pytree.tree_leaves(shared.run_eager(*args)),
            torch.utils._pytree.tree_leaves(module(*args)),
            strict=True,
        ):
            torch.testing.assert_close(got, want, rtol=0, atol=0)

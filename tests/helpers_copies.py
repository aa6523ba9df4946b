"""Shared-weight models, and tampering with one stored copy of a weight on disk.

The models are the class the weight proof must cover: one Parameter stored several times by a
file (an LM's tied embedding and head; one Parameter used by three modules and once transposed).
"""

from __future__ import annotations

import pathlib

import onnx
import torch
import torch.nn.functional as F
from torch import nn

import dualexport as dx
from dualexport.weights.readers import pte_extents, read_onnx, read_ptd


class TiedHand(nn.Module):
    """One Parameter in three Linear modules and once transposed, and an embedding tied to the
    output head (what GPT-2 and tied Llama do)."""

    def __init__(self, vocab: int = 64, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.b.weight = self.a.weight
        self.c.weight = self.a.weight
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = torch.tanh(self.a(h))
        h = torch.tanh(self.b(h))
        h = self.c(h) + F.linear(h, self.a.weight.t())
        return self.head(h)


def hf_lm(config_cls: str, model_cls: str, **config: object) -> nn.Module:
    """A transformers causal LM from a tiny config (random weights, no download), called with
    ``input_ids`` and returning its logits, with transformers' default attention."""
    import transformers

    from dualexport.loading import HFWrapper

    cfg = getattr(transformers, config_cls)(**config)
    cfg.use_cache = False
    return HFWrapper(getattr(transformers, model_cls)(cfg).eval(), ("input_ids",), 1).eval()


def copy_extent(res: dx.ExportResult, target: str, where: str, nbytes: int) -> tuple[pathlib.Path, int, int]:
    """(file, offset, size) of one stored copy, from the files on disk."""
    main = res.out_dir / res.manifest.artifacts[target]["file"]
    kind, _, ref = where.partition(":")
    if kind == "initializer":
        name, _, place = ref.partition("@")
        parts = place.split("@")
        if len(parts) == 2:
            return res.out_dir / parts[0], int(parts[1]), read_onnx(main).nbytes[name]
        init = next(
            i for i in onnx.load(str(main), load_external_data=False).graph.initializer if i.name == name
        )
        data = main.read_bytes()
        assert data.count(init.raw_data) == 1, f"{name}: inline bytes not unique in {main.name}"
        return main, data.find(init.raw_data), len(init.raw_data)
    if kind == "named_data":
        named, _ = pte_extents(main)
        if ref in named:
            return main, *named[ref]
        index, mapped = read_ptd(main.with_suffix(".ptd"))
        mapped.close()
        return main.with_suffix(".ptd"), *index[ref]
    if kind == "constant_buffer":
        _, constants = pte_extents(main)
        return main, constants[int(ref)][0], nbytes
    if kind == "delegate_payload":
        return main, int(ref), nbytes
    raise AssertionError(f"no extent for {where}")


def flip_byte(path: pathlib.Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def assert_every_read_weight_exact(res: dx.ExportResult, target: str = "xnnpack") -> None:
    """Every copy ``target``'s file holds is exact, and what it leaves out is only a constant its
    own program never reads (the folded mask and positions XNNPACK's attention form does not
    take, dropped before serializing): no weight lost, no dead bytes in the file."""
    check = res.verify_weights()  # raises on any copy that differs
    assert check.exact[target] + check.not_stored[target] == check.entries, check
    for entry in res.manifest.entries:
        for loc in entry.copies[target]:
            if loc.status != "exact":
                assert loc.status == "not_stored", (entry.name, loc)
                assert entry.kind == "constant" and "unused" in (loc.reason or ""), (entry.name, loc)

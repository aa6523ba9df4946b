"""A real model past 2 GiB of fp32 weights: a Llama-style decoder from a transformers config with
random weights (10 layers, hidden 2048, MLP 5632, GQA 32:4, untied 32000-token embedding and
head: 2.13 GiB), exported to both targets with external weights (``.onnx.data``, ``.ptd``),
weights verified bit for bit from those files, parity checked, and a weights-only change patched
into both data files without lowering again. Slow (about 4 minutes, 5.5 GB peak)."""

from __future__ import annotations

import hashlib
import pathlib

import pytest
import torch

import dualexport as dx
from dualexport.loading import hf_model
from helpers_copies import assert_every_read_weight_exact

pytestmark = pytest.mark.slow

GIB = 2**30


def _llama() -> torch.nn.Module:
    config = dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=10,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return hf_model("LlamaConfig", config, task="causal-lm", seed=0)


def _sha(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def test_llama_past_2gib_exports_verifies_and_patches(tmp_path: pathlib.Path) -> None:
    model = _llama()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes > 2 * GIB
    ids = torch.randint(0, 32000, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)[0]
    assert float(logits.std()) > 0  # parity on it means something

    res = dx.export(model, (ids,), out_dir=tmp_path, name="llama", strict=True, cache=False)
    files = {f.name: f.stat().st_size for a in res.artifacts.values() for f in a.files}
    assert set(files) == {"llama.onnx", "llama.onnx.data", "llama.pte", "llama.ptd"}
    assert files["llama.onnx"] < 16 * 2**20  # the graph; the weights sit in the data file
    assert files["llama.ptd"] > 1.8 * GIB  # every delegated weight is in the program-data file
    d = res.artifacts["xnnpack"].delegation
    assert d.delegated_share > 0.85, d.to_markdown()  # measured: 737 of 822 nodes in 11 subgraphs

    check = res.verify_weights()  # re-read from .onnx.data and .ptd, bit for bit
    entries = len(res.manifest.entries)
    assert_every_read_weight_exact(res, "xnnpack")
    assert check.exact["onnx"] + check.transformed["onnx"] == entries
    report = dx.compare(res, edges=False)
    assert report.ok, report.to_markdown()

    old = {n: _sha(tmp_path / n) for n in ("llama.onnx", "llama.pte")}
    with torch.no_grad():
        model.model.model.layers[3].mlp.down_proj.weight.mul_(1.01)
        model.model.model.layers[7].self_attn.q_proj.weight.add_(0.001)
    again = dx.export(model, (ids,), out_dir=tmp_path, name="llama", strict=True)
    assert {t: type(a.outcome) for t, a in again.artifacts.items()} == {
        "onnx": dx.Patched,
        "xnnpack": dx.Patched,
    }
    assert {t: a.outcome.patched for t, a in again.artifacts.items()} == {"onnx": 2, "xnnpack": 2}
    assert _sha(tmp_path / "llama.onnx") == old["llama.onnx"]  # only the data files changed
    again.verify_weights()
    report = dx.compare(again, edges=False)
    assert report.ok, report.to_markdown()

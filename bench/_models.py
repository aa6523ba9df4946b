"""Benchmark models, at sizes that fit 2 shared cores (each script says where it reduced one)."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import torch
from torch import nn

#: The issue's TransformerEncoder is 6 layers, d=512; lowering it on the plain path takes ~22 s per
#: run here, so the repeated benchmarks use d=256 (6 layers, 8 heads, ff 1024, seq 32).
ENC_LAYERS, ENC_D, ENC_HEADS, ENC_FF, ENC_SEQ = 6, 256, 8, 1024, 32


class Encoder(nn.Module):
    """nn.TransformerEncoder without a mask, batch_first (the issue's model, reduced)."""

    def __init__(
        self, layers: int = ENC_LAYERS, d: int = ENC_D, heads: int = ENC_HEADS, ff: int = ENC_FF
    ) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(x)


def encoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Encoder().eval(), (torch.randn(1, ENC_SEQ, ENC_D),)


class _HF(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, return_dict=False)[0]


def bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BertModel from a tiny config (2 layers, hidden 32), random weights, padding mask, with
    transformers' own attention (SDPA), as users get it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=32,
    )
    cfg.use_cache = False
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return _HF(transformers.BertModel(cfg).eval()).eval(), (ids, mask)


def big_mlp(width: int = 4096) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """~50 M parameters (201 M in the issue): 2048 -> 4096 -> 4096 -> 4096 -> 2048."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(2048, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 2048),
    ).eval()
    return m, (torch.randn(4, 2048),)


def mlp_201m() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The issue's 201 M-parameter MLP (805 MB): 4096 -> 8192 -> 8192 -> 8192 -> 4096."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Linear(4096, 8192),
        nn.ReLU(),
        nn.Linear(8192, 8192),
        nn.ReLU(),
        nn.Linear(8192, 8192),
        nn.ReLU(),
        nn.Linear(8192, 4096),
    ).eval()
    return m, (torch.randn(4, 4096),)


def llama_2g() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A Llama-style decoder past 2 GiB of fp32 weights: tests/test_big_model.py's model (10
    layers, hidden 2048, MLP 5632, GQA 32:4, untied 32000-token embedding and head; 2.13 GiB)."""
    import sys

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from test_big_model import _llama

    return _llama(), (torch.randint(0, 32000, (1, 8), generator=torch.Generator().manual_seed(0)),)


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.state_dict().values())


MODELS: dict[str, Any] = {"encoder": encoder, "bert": bert}


def smollm2_135m(layers: int = 30) -> nn.Module:
    """A decoder of SmolLM2-135M's shape (hidden 576, 9 heads of 64, 3 KV heads, FFN 1536,
    vocabulary 49152, tied head), random seeded weights; ``layers`` shortens the stack and keeps
    each layer's shape (the model has 30)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()

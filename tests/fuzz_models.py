"""A grammar of small models that put every op a dualexport pass rewrites at the input, in the
middle and at the output of the graph (issue 48): the generative fuzz's model builder.

A model is a ``Spec``: a chain of blocks applied to a hidden state ``h [B, S, D]``, then an
output form. Each block is one op (or op chain) that some pass matches: SDPA in each mask form,
matmul attention, norms, GELU forms, squeeze, slices, views, mean/sum, embeddings, linears
written as ``@ W.T``, the LLM canonicalizations' shapes (rotate-half, a ``True &`` mask, GQA's
expand), products with buffers of special values (ones, zeros, ``-inf`` masks). Output forms:
one tensor, a tuple, the same tensor twice, an input returned, a dict, nested containers,
integer arithmetic beside a tensor. Specs are plain tuples of strings, so a failure is a line
to keep (``REGRESSIONS`` in the test).
"""

from __future__ import annotations

import math
import pathlib
import re
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

import dualexport as dx
from dualexport.errors import DualExportError, InternalError

D = 16
HEADS = 2
HD = D // HEADS
VOCAB = 32

BLOCKS = (
    "sdpa",  # no mask
    "sdpa_causal",  # is_causal=True
    "sdpa_bool",  # a boolean causal mask buffer
    "sdpa_bool_row",  # a boolean mask that fully masks one query row
    "sdpa_float",  # an additive -inf mask buffer
    "sdpa_gqa",  # one key/value head expanded to two (GQA)
    "matmul_attn",  # q @ k^T * scale + -inf mask, softmax, @ v
    "layernorm",
    "rmsnorm",
    "gelu",
    "gelu_tanh",
    "silu_mul",  # a gated MLP
    "squeeze",  # unsqueeze(1).squeeze(1): a squeeze of a view
    "view",  # a view into heads and back
    "slice_cat",  # halves sliced and concatenated back
    "rotate_half",  # cat(-x2, x1) of the last dim (RoPE)
    "full_slice",  # h[:, :, :] (a slice that keeps everything)
    "mean_sub",  # h - h.mean(-1)
    "sum",  # h.sum(-1, keepdim) broadcast back
    "linear_wt",  # h @ W.T with a parameter W
    "tied",  # the same Linear applied twice
    "mul_ones",  # a product with a buffer of ones
    "add_zeros",  # a sum with a buffer of zeros
    "mul_one",  # h * 1.0
    "embed",  # h + an embedding of the ids
    "true_and",  # a mask built as True & causal, used with where
    "transpose_contig",  # transpose, contiguous, transpose back
    "relu",
)
OUTPUTS = (
    "one",  # h
    "tuple",  # (h, h.sum(-1))
    "twice",  # (h, h)
    "input",  # (h, x)
    "dict",  # {"a": h, "b": h * 2}
    "nested",  # (h, {"c": (h.mean(-1), h)})
    "int_beside",  # (h, ids * 2 + 1)
)
DYNAMIC = ("none", "batch", "seq", "both")


@dataclass(frozen=True)
class Spec:
    blocks: tuple[str, ...]
    output: str
    dynamic: str
    batch: int = 2
    seq: int = 6

    def __str__(self) -> str:
        return f"{'+'.join(self.blocks)}->{self.output}@{self.dynamic}[{self.batch}x{self.seq}]"


def _heads(t: torch.Tensor) -> torch.Tensor:
    b, s, _ = t.shape
    return t.reshape(b, s, HEADS, HD).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    b, _, s, _ = t.shape
    return t.transpose(1, 2).reshape(b, s, D)


class Block(nn.Module):
    """One block of the grammar, its weights seeded."""

    def __init__(self, kind: str, max_seq: int) -> None:
        super().__init__()
        self.kind = kind
        if kind.startswith("sdpa") or kind == "matmul_attn":
            self.qkv = nn.Linear(D, 3 * D)
            self.o = nn.Linear(D, D)
        causal = torch.ones(max_seq, max_seq, dtype=torch.bool).tril()
        if kind in ("sdpa_bool", "true_and"):
            self.register_buffer("mask", causal)
        elif kind == "sdpa_bool_row":
            row = causal.clone()
            row[1] = False  # query 1 sees nothing: eager's SDPA (a safe softmax) gives zeros there
            self.register_buffer("mask", row)
        elif kind in ("sdpa_float", "matmul_attn"):
            self.register_buffer("mask", torch.full((max_seq, max_seq), float("-inf")).triu(1))
        elif kind in ("layernorm",):
            self.norm = nn.LayerNorm(D)
        elif kind == "rmsnorm":
            self.weight = nn.Parameter(torch.rand(D) + 0.5)
        elif kind == "silu_mul":
            self.gate, self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        elif kind == "linear_wt":
            self.w = nn.Parameter(torch.randn(D, D) / math.sqrt(D))
        elif kind == "tied":
            self.lin = nn.Linear(D, D)
        elif kind == "mul_ones":
            self.register_buffer("ones", torch.ones(D))
        elif kind == "add_zeros":
            self.register_buffer("zeros", torch.zeros(D))
        elif kind == "embed":
            self.emb = nn.Embedding(VOCAB, D)

    def forward(self, h: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        k = self.kind
        s = h.shape[1]
        if k.startswith("sdpa") or k == "matmul_attn":
            q, key, v = (_heads(t) for t in self.qkv(h).chunk(3, dim=-1))
            if k == "sdpa":
                a = F.scaled_dot_product_attention(q, key, v)
            elif k == "sdpa_causal":
                a = F.scaled_dot_product_attention(q, key, v, is_causal=True)
            elif k == "sdpa_gqa":
                key = key[:, :1].expand(-1, HEADS, -1, -1)
                v = v[:, :1].expand(-1, HEADS, -1, -1)
                a = F.scaled_dot_product_attention(q, key, v, is_causal=True)
            elif k == "matmul_attn":
                scores = q @ key.transpose(-1, -2) * (HD**-0.5) + self.mask[:s, :s]
                a = scores.softmax(-1) @ v
            else:
                a = F.scaled_dot_product_attention(q, key, v, attn_mask=self.mask[:s, :s])
            return self.o(_merge(a)) if k != "sdpa_bool_row" else _merge(a)  # SDPA at the output
        if k == "layernorm":
            return self.norm(h)
        if k == "rmsnorm":
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        if k == "gelu":
            return F.gelu(h)
        if k == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        if k == "silu_mul":
            return self.down(F.silu(self.gate(h)) * self.up(h))
        if k == "squeeze":
            return h.unsqueeze(1).squeeze(1)
        if k == "view":
            b = h.shape[0]
            return h.view(b, s, HEADS, HD).view(b, s, D)
        if k == "slice_cat":
            return torch.cat([h[..., : D // 2], h[..., D // 2 :]], dim=-1)
        if k == "rotate_half":
            x1, x2 = h[..., : D // 2], h[..., D // 2 :]
            return torch.cat((-x2, x1), dim=-1)
        if k == "full_slice":
            return h[:, :, :]
        if k == "mean_sub":
            return h - h.mean(-1, keepdim=True)
        if k == "sum":
            return h + h.sum(-1, keepdim=True) * 0.1
        if k == "linear_wt":
            return h @ self.w.T
        if k == "tied":
            return self.lin(torch.relu(self.lin(h)))
        if k == "mul_ones":
            return h * self.ones
        if k == "add_zeros":
            return h + self.zeros
        if k == "mul_one":
            return h * 1.0
        if k == "embed":
            return h + self.emb(ids)
        if k == "true_and":
            keep = torch.ones((), dtype=torch.bool) & self.mask[:s, :s]
            scores = h @ h.transpose(-1, -2)
            return torch.where(keep, scores, torch.finfo(h.dtype).min).softmax(-1) @ h
        if k == "transpose_contig":
            return h.transpose(1, 2).contiguous().transpose(1, 2)
        if k == "relu":
            return torch.relu(h)
        raise ValueError(k)


class Fuzzed(nn.Module):
    def __init__(self, spec: Spec, max_seq: int = 32) -> None:
        super().__init__()
        self.spec = spec
        self.blocks = nn.ModuleList(Block(k, max_seq) for k in spec.blocks)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> Any:
        h = x
        for block in self.blocks:
            h = block(h, ids)
        out = self.spec.output
        if out == "one":
            return h
        if out == "tuple":
            return h, h.sum(-1)
        if out == "twice":
            return h, h
        if out == "input":
            return h, x
        if out == "dict":
            return {"a": h, "b": h * 2}
        if out == "nested":
            return h, {"c": (h.mean(-1), h)}
        if out == "int_beside":
            return h, ids * 2 + 1
        raise ValueError(out)


def build(spec: Spec, seed: int = 0) -> tuple[Fuzzed, tuple[torch.Tensor, torch.Tensor], Any]:
    """The model (seeded weights), its example inputs and the dynamic shapes of ``spec``."""
    torch.manual_seed(seed)
    model = Fuzzed(spec).eval()
    x = torch.randn(spec.batch, spec.seq, D)
    ids = torch.randint(0, VOCAB, (spec.batch, spec.seq))
    dims: dict[int, Any] = {}
    if spec.dynamic in ("batch", "both"):
        dims[0] = Dim("batch", min=1, max=8)
    if spec.dynamic in ("seq", "both"):
        dims[1] = Dim("seq", min=2, max=16)
    dynamic = None if not dims else {"x": dims, "ids": dict(dims)}
    return model, (x, ids), dynamic


#: what a refusal's message must name: an op, a node or an input (never a bare library message)
NAMES_SOMETHING = re.compile(r"\bop\b|\bnode\b|\binputs?\b|args\[|\boutput\b|\bdim\b|\bseq\b|\bbatch\b")

specs = st.builds(
    Spec,
    blocks=st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=3).map(tuple),
    output=st.sampled_from(OUTPUTS),
    dynamic=st.sampled_from(DYNAMIC),
    batch=st.sampled_from([2, 3]),
    seq=st.integers(3, 8),
)


def check(spec: Spec, out: pathlib.Path) -> str:
    """Export ``spec``'s model to both targets and hold the outcome to the oracle."""
    model, args, dynamic = build(spec, seed=zlib.crc32(str(spec).encode()))
    try:
        res = dx.export(model, args, out_dir=out, name="f", dynamic_shapes=dynamic)
    except InternalError:
        raise  # dualexport's own defect
    except DualExportError as exc:
        assert NAMES_SOMETHING.search(str(exc)), f"{spec}: a refusal that names nothing: {exc}"
        return "refused"
    suffix = {"onnx": ".onnx", "xnnpack": ".pte"}
    assert set(res.artifacts) | set(res.errors) == {"onnx", "xnnpack"}
    for target, err in res.errors.items():
        assert not isinstance(err, InternalError), f"{spec}: {err}"
        assert NAMES_SOMETHING.search(str(err)), f"{spec}: a refusal that names nothing: {err}"
        assert not (out / f"f{suffix[target]}").exists(), f"{spec}: refused {target} left its file"
    if not res.artifacts:
        return "refused"
    report = dx.compare(res)
    assert report.ok, f"{spec}\n{report.to_markdown()}"
    res.verify_weights()
    return "exported" if not res.errors else "partial"


def explore(tmp_path: pathlib.Path, examples: int, seed: int) -> list[str]:
    outcomes: list[str] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=seed == 0,
        suppress_health_check=list(HealthCheck),
    )
    @given(spec=specs)
    def one(spec: Spec) -> None:
        outcomes.append(check(spec, tmp_path / f"o{len(outcomes)}"))

    one()
    return outcomes

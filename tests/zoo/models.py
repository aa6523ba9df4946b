"""The hand-written zoo: small models, each exercising one thing that trips exporters.

Every model is tiny (a few thousand parameters, inputs of a few hundred elements) so that the
default run of all cases on both targets fits in CI's time on two cores.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.export import Dim

from .case import Case, InputSet

__all__ = ["ZOO"]


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _randomize_bn(model: nn.Module) -> nn.Module:
    """Give BatchNorm non-trivial running statistics, so folding it is actually tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


# ----------------------------------------------------------------------------------- models
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNNBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1),
            nn.BatchNorm2d(8),
            nn.Hardtanh(),
        )
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class DepthwiseGrouped(nn.Module):
    """MobileNet-style depthwise separable block plus a grouped (groups=2) convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.grouped(nn.functional.relu6(self.pw(nn.functional.relu6(self.dw(x))))))


class ConvTranspose(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
        self.conv = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.relu(self.up(x)))


class PoolUpsample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(self.conv(x), 2, stride=2)  # see MaxPoolDefaultStride
        y = nn.functional.avg_pool2d(y, 2)
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="nearest")
        y = nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return y + nn.functional.adaptive_avg_pool2d(y, 1)


class MaxPoolDefaultStride(nn.Module):
    """``F.max_pool2d(x, 2)`` with the stride left to its default (= kernel size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(torch.relu(x), 2)


class GRUModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 16, num_layers=1, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class LSTMModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 16, num_layers=1, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, (h, _c) = self.rnn(x)
        return self.head(out), h


class MaskedAttention(nn.Module):
    """Self-attention whose key padding mask comes in as a bool input (True = padding)."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, d))


class SDPAttention(nn.Module):
    """The fused ``scaled_dot_product_attention`` with an additive float mask."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2).reshape(b, s, d)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.enc(x)


class TiedLM(nn.Module):
    """Embedding and output head share one Parameter: the weight must be found once, by one name."""

    def __init__(self, vocab: int = 64, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(ids)))


class Rotary(nn.Module):
    """Rotary position embedding with the ``inv_freq`` non-persistent buffer (as in Llama)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        x1, x2 = x[..., ::2], x[..., 1::2]
        rot = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
        return self.proj(rot)


class ForwardConstant(nn.Module):
    """Tensors created inside forward (a lifted constant and a ``torch.full``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.tensor([0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 3.0, 1.0])
        return self.fc(x) * w + torch.full((8,), 0.125)


class MultiIO(nn.Module):
    """Tuple and dict inputs, a nested tuple/dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(4, 8)

    def forward(
        self, pair: tuple[torch.Tensor, torch.Tensor], extra: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x, y = pair
        h = self.a(x) + self.b(y) * extra["scale"]
        return h, {"sum": h.sum(-1), "neg": -h}


class WithKwargs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * torch.sigmoid(gate) + bias


class Int64Inputs(nn.Module):
    """int64 token ids and positions, an int64 output (argmax), and a float output."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(50, 16)
        self.pos = nn.Embedding(12, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.tok(ids) + self.pos(positions))
        return logits, logits.argmax(-1)


class BufferCounter(nn.Module):
    """A buffer mutated in place by forward: the state must advance between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.full((1,), 1.5))  # non-zero: the start state counts
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += x.sum()
        return self.fc(x) + self.count


class KVCache(nn.Module):
    """A KV cache written in place (``index_copy_``) at a position kept in a buffer that forward
    advances, as a decoder's cache does: each step writes a new slot, so state matters."""

    def __init__(self, dim: int = 16, max_len: int = 4) -> None:
        super().__init__()
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.q = nn.Linear(dim, dim)
        self.register_buffer("k_cache", torch.zeros(1, max_len, dim))
        self.register_buffer("v_cache", torch.zeros(1, max_len, dim))
        self.register_buffer("pos", torch.zeros(1, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.k_cache.index_copy_(1, self.pos, self.k(x))
        self.v_cache.index_copy_(1, self.pos, self.v(x))
        self.pos += 1
        scores = self.q(x) @ self.k_cache.transpose(1, 2) / 4.0
        return scores.softmax(-1) @ self.v_cache


# --------------------------------------------------------------------------- dynamic shapes
_BATCH = Dim("batch", min=2, max=8)
_SEQ = Dim("seq", min=2, max=16)


def _mlp_sets() -> list[InputSet]:
    """Batch at its min, a middle value and its max."""
    return [((_r(b, 16),), {}) for b in (2, 5, 8)]


def _encoder_sets() -> list[InputSet]:
    return [((_r(2, s, 32),), {}) for s in (2, 9, 16)]


def _cnn_sets() -> list[InputSet]:
    return [((_r(b, 3, 8, 8),), {}) for b in (1, 3, 4)]


def _pad_mask(b: int, s: int) -> torch.Tensor:
    mask = torch.zeros(b, s, dtype=torch.bool)
    mask[0, s - 2 :] = True  # the first sequence is padded at its end
    return mask


def _masked_sets() -> list[InputSet]:
    return [((_r(2, s, 32), _pad_mask(2, s)), {}) for s in (3, 9, 16)]


def _ops(*names: str) -> frozenset[str]:
    """Edge op names as the delegation table spells them (``aten_<op>_<overload>``)."""
    return frozenset(names)


#: Layout/shape ops XNNPACK leaves outside the delegate around recurrent cells and attention.
_RNN_GLUE = _ops(
    "aten_full_default",
    "aten_split_with_sizes_copy_default",
    "aten_squeeze_copy_dims",
    "aten_unsqueeze_copy_default",
)
#: What torch's fast-path mask handling in nn.MultiheadAttention / SDPA leaves outside XNNPACK.
_MASK_GLUE = _ops(
    "aten_any_dim",
    "aten_eq_scalar",
    "aten_expand_copy_default",
    "aten_full_like_default",
    "aten_logical_not_default",
    "aten_mul_scalar",
    "aten_squeeze_copy_dims",
    "aten_unsqueeze_copy_default",
    "aten_where_self",
)

ZOO: tuple[Case, ...] = (
    Case(
        "mlp",
        MLP,
        lambda: ((_r(4, 16),), {}),
        description="Linear/GELU/ReLU stack; dynamic batch 2..8",
        dynamic_shapes=lambda: {"x": {0: _BATCH}},
        extra_inputs=_mlp_sets,
        xnnpack_subgraphs=1,
        onnx_ops=_ops("Gemm"),
    ),
    Case(
        "cnn_batchnorm",
        lambda: _randomize_bn(CNNBatchNorm()),
        lambda: ((_r(2, 3, 8, 8),), {}),
        description="Conv + BatchNorm (folded differently by each target); dynamic batch 1..4",
        dynamic_shapes=lambda: {"x": {0: Dim("n", min=1, max=4)}},
        extra_inputs=_cnn_sets,
        # the head's mean (XNNPACK's mean.dim is a 4-D global pool only) is rewritten as one,
        # dynamic batch included (xnnpack_rewrites._mean): one subgraph
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=frozenset(),
        onnx_ops=_ops("Conv"),
    ),
    Case(
        "depthwise_grouped",
        lambda: _randomize_bn(DepthwiseGrouped()),
        lambda: ((_r(1, 8, 8, 8),), {}),
        description="depthwise (groups=C) and grouped (groups=2) convolutions",
        xnnpack_subgraphs=1,
        onnx_ops=_ops("Conv"),
    ),
    Case(
        "conv_transpose",
        ConvTranspose,
        lambda: ((_r(1, 8, 4, 4),), {}),
        description="ConvTranspose2d stride 2",
        xnnpack_subgraphs=1,
        onnx_ops=_ops("ConvTranspose"),
    ),
    Case(
        "pool_upsample",
        PoolUpsample,
        lambda: ((_r(1, 4, 8, 8),), {}),
        description="max/avg/adaptive pooling, nearest and bilinear upsampling",
        # ExecuTorch's XNNPACK partitioner has no nearest upsampling (avg_pool2d without padding
        # goes in once canonicalized: count_include_pad=False).
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=_ops("aten_upsample_nearest2d_vec"),
        onnx_ops=_ops("MaxPool", "Resize"),
    ),
    Case(
        "maxpool_default_stride",
        MaxPoolDefaultStride,
        lambda: ((_r(1, 4, 8, 8),), {}),
        description="F.max_pool2d(x, 2) with the default stride (the plain ExecuTorch path fails: "
        "tests/test_canonical.py; dualexport writes the stride out)",
        xnnpack_subgraphs=1,
        onnx_ops=_ops("MaxPool"),
    ),
    Case(
        "gru",
        GRUModel,
        lambda: ((_r(2, 5, 8),), {}),
        description="nn.GRU (unrolled by torch.export)",
        xnnpack_subgraphs=1,
        slow=True,  # the default run has the LSTM
        onnx_ops=_ops("Gemm"),
    ),
    Case(
        "lstm",
        LSTMModel,
        lambda: ((_r(2, 5, 8),), {}),
        description="nn.LSTM, two outputs (sequence and final hidden state)",
        # the final hidden state's cat of one-step slices stays out (XNNPACK takes 2-5 inputs)
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=_ops("aten_cat_default"),
        onnx_ops=_ops("LSTM"),
    ),
    Case(
        "masked_attention",
        MaskedAttention,
        lambda: ((_r(2, 6, 32), _pad_mask(2, 6)), {}),
        description="hand-written attention with a bool key padding mask; dynamic seq 3..16 "
        "(its masked_fill with -inf before the softmax is written as a sum XNNPACK takes)",
        dynamic_shapes=lambda: ({1: Dim("s", min=3, max=16)}, {1: Dim("s", min=3, max=16)}),
        extra_inputs=_masked_sets,
        xnnpack_subgraphs=3,
        xnnpack_allowed_non_delegated=_ops(
            "aten_slice_copy_tensor",
            "aten_squeeze_copy_dims",
            "aten_unsqueeze_copy_default",
            "aten_view_copy_default",
            "aten_where_self",
            "scalar_tensor",
            "sym_size",
        ),
        onnx_ops=_ops("Softmax", "Where"),
    ),
    Case(
        "sdpa_attention",
        SDPAttention,
        lambda: ((_r(2, 6, 32), torch.where(_pad_mask(2, 6), -1e4, 0.0)), {}),
        description="F.scaled_dot_product_attention with an additive padding mask; its fully "
        "masked rows are found once, up front (ExplicitMaskedRows), and XNNPACK's attention "
        "has no guard (XnnpackAttention)",
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops(
            "aten_any_dim", "aten_ne_scalar", "aten_where_self", "dim_order_ops__to_dim_order_copy_default"
        ),
        onnx_ops=_ops("Softmax"),
        slow=True,  # test_attention.py's additive-mask variants check the same in the default run
    ),
    Case(
        "transformer_encoder",
        Encoder,
        lambda: ((_r(2, 6, 32),), {}),
        description="nn.TransformerEncoder, 2 layers; dynamic seq 2..16",
        dynamic_shapes=lambda: {"x": {1: _SEQ}},
        extra_inputs=_encoder_sets,
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_MASK_GLUE
        | _ops(
            "aten_native_layer_norm_default",
            "aten_select_copy_int",
            "aten_view_copy_default",
            "mul",
            "sym_size",
        ),
        onnx_ops=_ops("LayerNormalization", "Softmax"),
        slow=True,  # ~40 s on 2 cores; test_passes' static encoder checks it in the default run
    ),
    Case(
        "tied_embedding",
        TiedLM,
        lambda: ((torch.randint(0, 64, (2, 7)),), {}),
        description="embedding and output head share one Parameter",
        # the embedding's gather reads its own placeholder (a view of the tied storage,
        # exporters/xnnpack_partitions.py), so it stays out at the start and the rest is one delegate
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_embedding_default", "getitem"),
        onnx_ops=_ops("Gather"),
    ),
    Case(
        "rotary_inv_freq",
        Rotary,
        lambda: ((_r(2, 6, 16),), {}),
        description="non-persistent inv_freq buffer (rotary embedding); its input-independent "
        "cos/sin tables are folded into constants for both targets",
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_slice_copy_tensor"),
        onnx_ops=_ops("Mul", "Concat"),
    ),
    Case(
        "forward_constant",
        ForwardConstant,
        lambda: ((_r(3, 8),), {}),
        description="constants created in forward (torch.tensor, torch.full)",
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_full_default"),
        onnx_ops=_ops("Gemm", "Mul"),
    ),
    Case(
        "multi_io",
        MultiIO,
        lambda: (((_r(2, 8), _r(2, 4)), {"scale": _r(2, 8)}), {}),
        description="tuple and dict inputs; tuple + dict outputs",
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_sum_dim_int_list"),
        onnx_ops=_ops("ReduceSum", "Neg"),
    ),
    Case(
        "kwargs",
        WithKwargs,
        lambda: ((_r(2, 8),), {"bias": _r(8), "gate": _r(2, 8)}),
        description="keyword-only tensor inputs",
        xnnpack_subgraphs=1,
        onnx_ops=_ops("Sigmoid"),
    ),
    Case(
        "int64_inputs",
        Int64Inputs,
        lambda: ((torch.randint(0, 50, (2, 6)), torch.arange(6).repeat(2, 1)), {}),
        description="int64 ids and positions in, int64 argmax out",
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_argmax_default", "aten_embedding_default"),
        onnx_ops=_ops("Gather", "ArgMax"),
    ),
    Case(
        "buffer_counter",
        BufferCounter,
        lambda: ((_r(2, 4),), {}),
        description="buffer mutated in place (count += x.sum()), compared over 3 steps",
        steps=3,
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=_ops("aten_sum_dim_int_list"),
        onnx_ops=_ops("ReduceSum"),
    ),
    Case(
        "kv_cache",
        KVCache,
        lambda: ((_r(1, 1, 16),), {}),
        description="KV cache and its position updated in place (index_copy_), compared over 3 steps",
        steps=3,
        onnx_ops=_ops("Softmax"),
        # index_copy_ (index_put) and the int64 ``pos += 1`` stay in the portable ops.
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=_ops("aten_index_put_default", "aten_add_tensor"),
    ),
    Case(
        "int8_mlp",
        MLP,
        lambda: ((_r(4, 16),), {}),
        description="MLP quantized with quantize='int8' (PT2E per-channel, 16 calibration draws); "
        "parity within one quantization step of the quantized eager reference",
        int8_calibration=16,
        xnnpack_subgraphs=1,
        onnx_ops=_ops("QuantizeLinear", "DequantizeLinear"),
        slow=True,  # the default run quantizes this MLP in tests/test_quantize.py
    ),
    Case(
        "int8_cnn",
        lambda: _randomize_bn(CNNBatchNorm()),
        lambda: ((_r(2, 3, 8, 8),), {}),
        description="Conv + BatchNorm CNN quantized with quantize='int8'",
        int8_calibration=16,
        slow=True,  # the default run quantizes a Conv + BatchNorm in tests/test_quantize.py
        xnnpack_allowed_non_delegated=None,
        onnx_ops=_ops("QuantizeLinear", "DequantizeLinear"),
    ),
)

"""Small models the foundation tests share (the zoo in tests/zoo/ covers many more)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)  # no BatchNorm after it: XNNPACK keeps it NHWC
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.bn(self.conv(x))))


class WithNonPersistentBuffer(nn.Module):
    """A rotary-style ``inv_freq`` that is not in the state_dict (torch.export lifts it as a
    constant): the manifest must still cover it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8).float() / 8)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * torch.cos(x * self.inv_freq)


class TiedEmbedding(nn.Module):
    """Embedding and output head share one weight (as in GPT-2)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.proj(self.emb(ids))))


class DoublePermute(nn.Module):
    """Two permutes that cancel out: the graph pass in the seed regression removes them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.permute(0, 2, 1).permute(0, 2, 1)
        return self.fc(y)


class WithCdist(nn.Module):
    """torch.cdist lowers to aten._cdist_forward, which torch.onnx cannot translate but
    ExecuTorch's portable kernels run."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(self.fc(x), x)


def remove_permute_pairs(gm: torch.fx.GraphModule) -> None:
    """FX pass: drop ``permute(p) -> permute(p^-1)`` pairs (in place)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.permute.default:
            continue
        src = node.args[0]
        if not (isinstance(src, torch.fx.Node) and src.target == torch.ops.aten.permute.default):
            continue
        p1, p2 = src.args[1], node.args[1]
        if [p1[i] for i in p2] == list(range(len(p1))):
            node.replace_all_uses_with(src.args[0])
    gm.graph.eliminate_dead_code()
    gm.recompile()

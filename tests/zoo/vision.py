"""Common image classifiers from torchvision's model definitions, random weights (no download).

Why realistic activations matter: with random weights BatchNorm's running statistics are the
identity and several heads are initialized to (near) zero (ViT's is all zeros), so every output is
~0 and any parity check passes. Each factory sets the BatchNorm statistics from a few batches in
training mode and re-draws the classifier head so the logits are O(1), as a trained model's are;
``tests/test_vision_models.py`` checks that the reference outputs are not constant.

torchvision 0.28.0 (the release for torch 2.13) is published as a CUDA build only; its model
definitions are pure Python. ``make install`` keeps it out of the venv's site-packages (it would
break ``import transformers`` for every user of the venv) and puts it in ``.venv/vision-models``;
``_torchvision`` puts that folder on this process's path with ``torchvision._meta_registrations``
stubbed, the first time a vision case is built (``dualexport.loading.allow_torchvision``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .case import Case, InputSet

__all__ = ["VISION_CASES", "realistic"]


def _torchvision() -> Any:
    from dualexport.loading import allow_torchvision

    if not allow_torchvision(search=True):
        raise ModuleNotFoundError(
            "torchvision's model definitions are not installed: `make install` puts them in "
            ".venv/vision-models (pip install --no-deps --target .venv/vision-models torchvision==0.28.0; "
            "DUALEXPORT_VISION_MODELS names another folder)"
        )
    import torchvision

    return torchvision


def _head(model: nn.Module) -> nn.Linear:
    """The classifier's last Linear layer."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def realistic(model: nn.Module, size: int, *, batches: int = 3, seed: int = 0) -> nn.Module:
    """BatchNorm statistics from data, and a head that gives O(1) logits."""
    g = torch.Generator().manual_seed(seed)
    head = _head(model)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) / head.in_features**0.5)
        if head.bias is not None:
            head.bias.zero_()
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            model.train()
            for _ in range(batches):
                model(torch.randn(4, 3, size, size, generator=g))
        model.eval()
        # Unit-variance logits on the example's distribution.
        logits = model(torch.randn(2, 3, size, size, generator=g))
        head.weight.div_(float(logits.std()) + 1e-6)
    return model.eval()


def _build(name: str, size: int, **kwargs: Any) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        torch.manual_seed(0)
        model = getattr(_torchvision().models, name)(weights=None, **kwargs)
        return realistic(model, size)

    return factory


def _image(size: int) -> Callable[[], InputSet]:
    return lambda: ((torch.randn(1, 3, size, size),), {})


def _case(
    name: str, size: int, description: str, *, subgraphs: int = 1, slow: bool = True, **kwargs: Any
) -> Case:
    return Case(
        f"tv_{name}",
        _build(name, size, **kwargs),
        _image(size),
        description=f"torchvision {name}, {size}x{size}: {description}",
        # The delegation is measured and tabulated; what must hold is parity and that the
        # weight-carrying ops are all delegated.
        xnnpack_subgraphs=subgraphs,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=frozenset({"aten_convolution_default"}),
        onnx_ops=frozenset({"Conv"}),
        slow=slow,
        group="vision",
    )


VISION_CASES: tuple[Case, ...] = (
    _case("mobilenet_v2", 128, "inverted residuals, ReLU6, depthwise"),
    _case("mobilenet_v3_small", 128, "hardswish, squeeze-excitation with hardsigmoid"),
    _case("mobilenet_v3_large", 128, "hardswish, squeeze-excitation with hardsigmoid"),
    _case("resnet18", 128, "basic blocks, max pooling"),
    _case("resnet50", 128, "bottleneck blocks"),
    _case("efficientnet_b0", 128, "SiLU, squeeze-excitation, stochastic depth (eval)"),
    _case("shufflenet_v2_x1_0", 128, "channel split and shuffle"),
    _case("regnet_y_400mf", 128, "group convolutions, module names with '-'"),
    _case("convnext_tiny", 128, "depthwise 7x7, LayerNorm over channels (permuted), layer scale"),
    # the shifted-window masks depend on shapes only and are folded; one gather stays outside
    _case(
        "swin_t", 224, "shifted-window attention (roll, window masks), relative position bias", subgraphs=1
    ),
    _case("vit_b_16", 64, "patch embedding, class token, 12 encoder layers", image_size=64),
)

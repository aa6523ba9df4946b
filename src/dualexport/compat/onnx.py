"""The ONNX side's private symbols dualexport reaches (onnxscript's rewriter and optimizer;
``SEAMS`` lists each), behind small functions. torch.onnx's own internals are in
``compat/torch.py`` (they ship with torch).

Why: see the package docstring. onnxscript is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import Seam

__all__ = ["SEAMS", "default_rewrite_rules", "fold_constants_pass", "fuse_batchnorm_rules", "no_op_rules"]

SEAMS: tuple[Seam, ...] = (
    Seam(
        "onnxscript.rewriter._DEFAULT_REWRITE_RULES",
        "the rewrite rules optimize runs",
        "default_rewrite_rules",
    ),
    Seam(
        "onnxscript.rewriter.rules.common._fuse_batchnorm.rules",
        "rules taken out of the default set",
        "fuse_batchnorm_rules",
    ),
    Seam(
        "onnxscript.rewriter.rules.common._no_op.rules",
        "rules replaced by exact ones",
        "no_op_rules",
    ),
    Seam(
        "onnxscript.optimizer._constant_folding.FoldConstantsPass",
        "constant folding with a should_fold veto",
        "fold_constants_pass",
    ),
    Seam(
        "onnxscript.optimizer._constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT",
        "the optimizer's own input size limit",
        "fold_constants_pass",
    ),
    Seam(
        "onnxscript.optimizer._constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT",
        "the optimizer's own output size limit",
        "fold_constants_pass",
    ),
)


def default_rewrite_rules() -> tuple[Any, ...]:
    """The rules ``onnxscript.rewriter.rewrite`` applies when given none."""
    from onnxscript import rewriter

    return tuple(rewriter._DEFAULT_REWRITE_RULES)


def no_op_rules() -> tuple[Any, ...]:
    """onnxscript's rules that drop ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0`` and
    ``x / 1`` (the first six of its no-op set; the dropout rules follow). Their constants match
    within ``abs_tol=1e-8, rel_tol=1e-5``: ``x + 1e-8`` (an RMSNorm's epsilon) is dropped."""
    from onnxscript.rewriter.rules.common import _no_op

    return tuple(_no_op.rules.rules[:6])


def fuse_batchnorm_rules() -> tuple[Any, ...]:
    """The rules that fold a BatchNormalization into the convolution or Gemm before it."""
    from onnxscript.rewriter.rules.common import _fuse_batchnorm

    return tuple(_fuse_batchnorm.rules)


def fold_constants_pass(should_fold: Callable[[Any], bool | None]) -> Any:
    """onnxscript's constant folding pass with shape inference and its default size limits,
    asking ``should_fold`` first for every node."""
    from onnxscript.optimizer import _constant_folding

    return _constant_folding.FoldConstantsPass(
        shape_inference=True,
        input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
        should_fold=should_fold,
    )

"""Models from text: ``MODULE:ATTR`` (the CLI's and the manifest's reference) or a Hugging Face
config class with keyword arguments (random weights, nothing downloaded).

Why torchvision needs care: torchvision 0.28 (the release for torch 2.13) is published as a CUDA
build whose compiled ops do not load against the CPU torch; its meta registrations then fail at
import, and transformers imports torchvision whenever it can find it. So ``make install`` keeps it
out of the venv's site-packages (a user's interpreter never sees it and transformers works) and
puts its pure-Python model definitions in ``.venv/vision-models``. A ``torchvision.models:...``
reference puts that folder on the path, with an empty ``torchvision._meta_registrations`` module
in place before the first import, in this process only. A venv that still has torchvision in
site-packages gets the same stub.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..compat.torch import BatchNormBase
from ..compat.transformers import set_attn_implementation
from ..errors import InputError

__all__ = [
    "load_model",
    "load_object",
    "load_callable",
    "hf_model",
    "HFWrapper",
    "settle_batchnorm",
    "outputs_constant",
    "allow_torchvision",
    "vision_models_dir",
]


#: Where ``make install`` puts torchvision's model definitions (``pip install --no-deps --target``),
#: beside the venv's site-packages and not on its path; ``DUALEXPORT_VISION_MODELS`` overrides it.
VISION_MODELS = "vision-models"


def vision_models_dir() -> pathlib.Path | None:
    """The folder holding torchvision's model definitions outside site-packages, if there is one."""
    env = os.environ.get("DUALEXPORT_VISION_MODELS")
    folder = pathlib.Path(env) if env else pathlib.Path(sys.prefix) / VISION_MODELS
    return folder if (folder / "torchvision").is_dir() else None


def allow_torchvision(*, search: bool = False) -> bool:
    """Make ``import torchvision`` (and transformers, which imports it) work on the CPU torch:
    stub its meta registrations when it is importable; with ``search``, also put
    :func:`vision_models_dir` on the path when it is not. Returns whether torchvision can be
    imported now."""
    if "torchvision" in sys.modules:
        return True
    if importlib.util.find_spec("torchvision") is None:
        folder = vision_models_dir() if search else None
        if folder is None:
            return False
        sys.path.append(str(folder))
        importlib.invalidate_caches()
    sys.modules.setdefault(
        "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
    )
    return True


def load_object(
    ref: str,
    *,
    search_path: Sequence[str | os.PathLike[str]] = (),
    what: str = "model",
    example: str = "dualexport.examples:TinyConvNet",
) -> Any:
    """The object MODULE:ATTR names (ATTR may be dotted). The module is looked up in
    ``search_path`` first, then in the current folder."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"{what} reference {ref!r} is not MODULE:ATTR", hint=f"e.g. {example}")
    for folder in [*map(str, search_path), str(pathlib.Path.cwd())]:
        if folder not in sys.path:
            sys.path.insert(0, folder)
    if module_name.split(".")[0] in ("torchvision", "transformers"):
        allow_torchvision(search=module_name.split(".")[0] == "torchvision")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InputError(
            f"cannot import {module_name!r}: {exc}",
            hint="run from the folder that holds the module, or install it",
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_callable(ref: str, *, what: str = "transform") -> Callable[..., Any]:
    """MODULE:FN for a callable (a transform: an FX pass or an ExportedProgram -> ExportedProgram
    function, as ``dx.export(transforms=...)`` takes)."""
    obj = load_object(ref, what=what, example="mypasses:remove_permutes")
    if not callable(obj):
        raise InputError(f"{ref} is a {type(obj).__name__}, not a function", hint="point at a function")
    return obj


def load_model(ref: str, *, search_path: Sequence[str | os.PathLike[str]] = ()) -> nn.Module:
    """MODULE:ATTR where ATTR is an nn.Module instance, class, or zero-argument factory.

    The module is looked up in ``search_path`` first, then in the current folder."""
    obj = load_object(ref, search_path=search_path)
    if isinstance(obj, nn.Module):
        return obj
    if callable(obj):
        try:
            made = obj()
        except TypeError as exc:
            raise InputError(
                f"{ref} could not be called without arguments: {exc}",
                hint="point at a module instance or a zero-argument factory",
            ) from exc
        if isinstance(made, nn.Module):
            return made
        raise InputError(f"{ref}() returned {type(made).__name__}, not an nn.Module")
    raise InputError(f"{ref} is a {type(obj).__name__}, not an nn.Module, class or factory")


class HFWrapper(nn.Module):
    """Call an HF model with positional tensors bound to ``input_names``; return its first
    ``n_out`` outputs as a tuple of tensors (the ``ModelOutput`` dataclasses and cache objects are
    not what a deployment artifact returns). Changes nothing inside the model."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...], n_out: int = 1) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.n_out = n_out

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.input_names, inputs, strict=False)), return_dict=False)
        return tuple(out[: self.n_out])


def _task_class(config_cls: str, task: str) -> str:
    family = config_cls.removesuffix("Config")
    suffix = {
        "base": "Model",
        "causal-lm": "ForCausalLM",
        "masked-lm": "ForMaskedLM",
        "sequence-classification": "ForSequenceClassification",
        "image-classification": "ForImageClassification",
        "encoder": "EncoderModel",
    }.get(task)
    if suffix is None:
        raise InputError(
            f"unknown Hugging Face task {task!r}",
            hint="one of base, causal-lm, masked-lm, sequence-classification, image-classification, "
            "encoder; or name the class with model_class",
        )
    return family + suffix


def hf_model(
    config_class: str,
    config: Mapping[str, Any] | None = None,
    *,
    model_class: str | None = None,
    task: str = "base",
    input_names: Sequence[str] = ("input_ids",),
    outputs: int = 1,
    attention: str | None = None,
    seed: int = 0,
) -> nn.Module:
    """A transformers model from ``config_class(**config)`` with random weights (seeded), no
    cache objects (``use_cache=False``), wrapped in ``HFWrapper``. Attention is transformers'
    own choice (SDPA wherever the model supports it), as users get it, unless ``attention``
    names one (``"eager"``, ``"sdpa"``). Nothing is downloaded: only ``from_config``-style
    construction."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    allow_torchvision()
    try:
        import transformers
    except ImportError as exc:
        raise InputError("Hugging Face models need transformers", hint="pip install transformers") from exc
    cls_name = model_class or _task_class(config_class, task)
    cfg_cls: Callable[..., Any] | None = getattr(transformers, config_class, None)
    model_cls: Callable[..., Any] | None = getattr(transformers, cls_name, None)
    if cfg_cls is None or model_cls is None:
        missing = config_class if cfg_cls is None else cls_name
        raise InputError(
            f"transformers {transformers.__version__} has no {missing!r}",
            hint="check the class name (e.g. LlamaConfig with task causal-lm, or model_class)",
        )
    try:
        cfg = cfg_cls(**dict(config or {}))
    except Exception as exc:
        raise InputError(f"{config_class}(**config) failed: {exc}", hint="check the config keys") from exc
    cfg.use_cache = False
    if attention is not None:
        set_attn_implementation(cfg, attention)
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    return HFWrapper(model, tuple(input_names), outputs).eval()


def settle_batchnorm(model: nn.Module, batches: Sequence[tuple[Any, ...]]) -> nn.Module:
    """BatchNorm running statistics from ``batches`` (train-mode forwards, no gradients), then
    eval mode. Why: with random weights the default statistics (mean 0, var 1) leave activations
    that explode or vanish layer by layer, and parity on them is vacuous."""
    if not any(isinstance(m, BatchNormBase) for m in model.modules()):
        return model
    was_training = model.training
    model.train()
    with torch.no_grad():
        for args in batches:
            model(*args)
    model.train(was_training)
    return model.eval()


def outputs_constant(outputs: Any) -> bool:
    """True when every floating output is constant (or non-finite): a parity check on it proves
    nothing (a zero-initialised head, activations that exploded)."""
    tensors = [t for t in _leaves(outputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        return False
    for t in tensors:
        flat = t.detach().flatten().double()
        if flat.numel() > 1 and bool(torch.isfinite(flat).all()) and float(flat.std()) > 1e-12:
            return False
    return True


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _leaves(o)]
    if isinstance(obj, dict):
        return [x for o in obj.values() for x in _leaves(o)]
    return [obj]

"""A decoder from text: a transformers config ``.json`` (random, seeded weights), a local model
folder (its weights if it has them, else random from its ``config.json``), a GGUF file (llama.cpp's
format: transformers dequantizes its weights to float32; needs the ``gguf`` package), a Hugging
Face Hub id (``org/name``: ``from_pretrained``, from the local cache when the Hub is not reachable
or ``HF_HUB_OFFLINE=1``), or ``MODULE:ATTR``.

Configs and folders are read with ``local_files_only``; only a Hub id may download.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..loading import allow_torchvision, load_model

__all__ = ["load_decoder", "is_hub_id"]

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    allow_torchvision()
    try:
        import transformers
    except ImportError as exc:
        raise InputError(
            "config files and model folders need transformers", hint="pip install transformers"
        ) from exc
    return transformers


#: attention implementations a user may ask transformers for (None: transformers' own default)
ATTENTIONS = ("sdpa", "eager")


def _attention_kwargs(attention: str | None) -> dict[str, Any]:
    if attention is None:
        return {}
    if attention not in ATTENTIONS:
        raise InputError(
            f"unknown attention implementation {attention!r}",
            hint=f"one of {', '.join(ATTENTIONS)}, or leave it out for transformers' default",
        )
    return {"attn_implementation": attention}


def _from_config(config_path: pathlib.Path, seed: int, attention: str | None) -> nn.Module:
    tf = _transformers()
    try:
        config = tf.AutoConfig.from_pretrained(str(config_path), local_files_only=True)
    except Exception as exc:
        raise InputError(
            f"{config_path} is not a transformers config: {exc}",
            hint="pass a config.json with a model_type (e.g. written by LlamaConfig().to_json_file)",
        ) from exc
    torch.manual_seed(seed)
    try:
        return tf.AutoModelForCausalLM.from_config(config, **_attention_kwargs(attention)).eval()
    except Exception as exc:
        raise InputError(
            f"transformers has no causal LM for {type(config).__name__}: {exc}",
            hint="export_llm takes decoders (…ForCausalLM)",
        ) from exc


def _from_gguf(path: pathlib.Path, attention: str | None) -> nn.Module:
    """A GGUF file's model, its quantized weights dequantized to float32 by transformers."""
    if not path.is_file():
        raise InputError(f"{path} does not exist", hint="pass the path of a .gguf file")
    tf = _transformers()
    try:
        return tf.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True, **_attention_kwargs(attention)
        ).eval()
    except ImportError as exc:
        raise InputError(
            f"reading {path.name} needs the gguf package: {exc}", hint="pip install gguf accelerate"
        ) from exc
    except Exception as exc:
        raise InputError(
            f"cannot load the model in {path.name}: {exc}",
            hint="check that transformers reads this GGUF architecture (Llama, Qwen2, Mistral, ...)",
        ) from exc


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(ref: str | os.PathLike[str]) -> bool:
    """Whether ``ref`` reads as a Hub id (``org/name``) and names no local path."""
    text = str(ref)
    return (
        bool(_HUB_ID.match(text))
        and not pathlib.Path(text).exists()
        and not text.endswith((".json", ".gguf"))
    )


def _from_hub(ref: str, attention: str | None) -> nn.Module:
    tf = _transformers()
    try:
        return tf.AutoModelForCausalLM.from_pretrained(ref, **_attention_kwargs(attention)).eval()
    except Exception as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        raise InputError(
            f"cannot load {ref!r} from the Hugging Face Hub"
            + (" (offline: HF_HUB_OFFLINE is set, so only the local cache is read)" if offline else "")
            + f": {type(exc).__name__}: {exc}",
            hint="download it where the Hub is reachable (huggingface-cli download), or pass a local "
            "model folder or .gguf file",
        ) from exc


def load_decoder(ref: str | os.PathLike[str], *, seed: int = 0, attention: str | None = None) -> nn.Module:
    """The decoder ``ref`` names (see the module docstring); random weights are seeded by ``seed``.
    ``attention`` ("sdpa", "eager") is the implementation the reference model runs with; None
    keeps transformers' own default (SDPA wherever the model supports it), as users get it. A
    MODULE:ATTR model is the user's own and keeps what it was built with."""
    path = pathlib.Path(ref)
    if path.suffix == ".gguf":
        return _from_gguf(path, attention)
    if path.is_dir():
        if any((path / f).is_file() for f in _WEIGHT_FILES):
            tf = _transformers()
            try:
                return tf.AutoModelForCausalLM.from_pretrained(
                    str(path), local_files_only=True, **_attention_kwargs(attention)
                ).eval()
            except Exception as exc:
                raise InputError(
                    f"cannot load the model in {path}: {exc}", hint="check the folder's config and weights"
                ) from exc
        if (path / "config.json").is_file():
            return _from_config(path / "config.json", seed, attention)
        raise InputError(f"{path} holds no config.json", hint="pass a transformers model folder")
    if path.suffix == ".json":
        if not path.is_file():
            raise InputError(f"{path} does not exist", hint="pass the path of a transformers config.json")
        return _from_config(path, seed, attention)
    if is_hub_id(ref):
        return _from_hub(str(ref), attention)
    if attention is not None:
        raise InputError(
            f"attention={attention!r} was given for {ref}, a module of your own",
            hint="build the module with the attention you want; the option is for config files and model folders",
        )
    return load_model(str(ref))

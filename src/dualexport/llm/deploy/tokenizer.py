"""The tokenizer that goes with the files: found where the model came from, or given; written as
``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template), which both runners read.

Why ``tokenizer.json``: ExecuTorch's text runner (pytorch/tokenizers' HF tokenizer) and
onnxruntime-genai both read Hugging Face's fast-tokenizer file; transformers 5 writes the chat
template to ``chat_template.jinja`` beside it, so the template is also put back into
``tokenizer_config.json``, where onnxruntime-genai and older readers look for it.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

from ...errors import InputError

__all__ = [
    "resolve_tokenizer",
    "save_tokenizer",
    "folder_tokenizer",
    "TOKENIZER_FILE",
    "special_ids",
    "render_chat",
]

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


def _transformers() -> Any:
    from ..loading import _transformers as load

    return load()


def resolve_tokenizer(tokenizer: Any, source: str | os.PathLike[str] | None, model: Any) -> Any:
    """The tokenizer to ship: ``tokenizer`` as given (a transformers tokenizer, or a folder or
    GGUF file to load one from), else the one beside the model's source (its folder, its GGUF
    file), else the one in the folder the model was loaded from (``config._name_or_path``; of a
    model loaded with ``gguf_file=`` transformers records only the folder: its one .gguf file).
    None when there is none (logged: the files are written without it)."""
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        if not callable(getattr(tokenizer, "save_pretrained", None)):
            raise InputError(
                f"tokenizer must be a transformers tokenizer or a path, got {type(tokenizer).__name__}",
                hint="pass AutoTokenizer.from_pretrained(...), a model folder or a .gguf file",
            )
        if getattr(tokenizer, "backend_tokenizer", None) is None:
            raise InputError(
                f"{type(tokenizer).__name__} is a slow tokenizer: the runners read tokenizer.json",
                hint="pass the fast tokenizer (AutoTokenizer.from_pretrained(..., use_fast=True))",
            )
        return tokenizer
    candidates: list[pathlib.Path] = []
    if tokenizer is not None:
        candidates.append(pathlib.Path(tokenizer))
    if source is not None:
        candidates.append(pathlib.Path(source))
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(name, str) and name:
        candidates.append(pathlib.Path(name))
    for path in candidates:
        found = _load(path, explicit=tokenizer is not None and path == pathlib.Path(tokenizer))
        if found is not None:
            return found
    logger.warning(
        "no tokenizer found for the model: the runners need one (pass tokenizer= to export_llm); "
        "the files are written without it"
    )
    return None


def _load(path: pathlib.Path, explicit: bool) -> Any:
    from ..loading import is_hub_id

    tf = _transformers()
    try:
        if is_hub_id(path):
            return tf.AutoTokenizer.from_pretrained(str(path))
        if path.suffix == ".gguf" and path.is_file():
            return tf.AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            )
        if path.is_dir() and any((path / f).is_file() for f in (TOKENIZER_FILE, "tokenizer_config.json")):
            return tf.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        ggufs = sorted(path.glob("*.gguf")) if path.is_dir() else []
        if len(ggufs) == 1:  # a model loaded with gguf_file= records only its folder
            return tf.AutoTokenizer.from_pretrained(str(path), gguf_file=ggufs[0].name, local_files_only=True)
    except Exception as exc:
        if explicit:
            raise InputError(
                f"cannot load a tokenizer from {path}: {exc}", hint="pass a model folder"
            ) from exc
        logger.info("no tokenizer from %s: %s", path, exc)
        return None
    if explicit:
        raise InputError(
            f"{path} holds no tokenizer (tokenizer.json or a .gguf file)",
            hint="pass the model's folder, its .gguf file, or a transformers tokenizer",
        )
    return None


def save_tokenizer(tokenizer: Any, folder: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """Write the tokenizer's files into ``folder``; returns them. The chat template goes into
    ``tokenizer_config.json`` too (see the module docstring)."""
    before = set(os.listdir(folder))
    tokenizer.save_pretrained(str(folder))
    written = sorted(set(os.listdir(folder)) - before)
    if TOKENIZER_FILE not in written:
        raise InputError(
            f"{type(tokenizer).__name__} wrote no {TOKENIZER_FILE}",
            hint="pass a fast tokenizer: both runners read tokenizer.json",
        )
    config_path = folder / "tokenizer_config.json"
    template = getattr(tokenizer, "chat_template", None)
    if config_path.is_file() and isinstance(template, str):
        config = json.loads(config_path.read_text())
        if config.get("chat_template") != template:
            config["chat_template"] = template
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return tuple(folder / f for f in written)


def special_ids(tokenizer: Any, model: Any) -> tuple[int | None, tuple[int, ...], int | None]:
    """``(bos, eos ids, pad)``: the model's generation config first (what transformers'
    ``generate`` stops on), then its config, then the tokenizer's."""
    gen = getattr(model, "generation_config", None)
    config = getattr(model, "config", None)

    def first(key: str) -> Any:
        for holder in (gen, config, tokenizer):
            value = getattr(holder, key, None) if holder is not None else None
            if value is not None:
                return value
        return None

    eos = first("eos_token_id")
    eos_ids = tuple(
        int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    )
    bos, pad = first("bos_token_id"), first("pad_token_id")
    return (int(bos) if bos is not None else None, eos_ids, int(pad) if pad is not None else None)


def render_chat(tokenizer: Any, text: str) -> str:
    """``text`` as one user turn of the tokenizer's chat template, with the assistant's turn
    opened (what a chat model answers)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            "the tokenizer has no chat template", hint="drop --chat, or export a chat (instruct) model"
        )
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return str(rendered)


def folder_tokenizer(folder: pathlib.Path) -> Any:
    """The tokenizer written beside the files of a deploy folder (``tokenizer.json``)."""
    folder = pathlib.Path(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise InputError(
            f"{folder} holds no {TOKENIZER_FILE}",
            hint="export with export_llm(..., tokenizer=...) (the CLI's --tokenizer), or pass token ids",
        )
    return _load(folder, explicit=True)

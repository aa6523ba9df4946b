"""``dx.generate``: greedy prefill and decode on ONNX Runtime (.onnx) or ExecuTorch (.pte), driven
by the cache layout the file records.

Why the existing runners: they already check each input against the ranges the file records and
load the .pte's weights file; a generation is a loop of their ``run``.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InputError, typed_errors
from .layout import LlmLayout, read_layout

__all__ = ["generate", "DecoderSession", "SequenceTooLongError", "Generation", "prompt_ids"]


class SequenceTooLongError(InputError):
    """A prompt plus the new tokens needs more positions than the file's cache holds."""


_TARGETS = {".onnx": "onnx", ".pte": "xnnpack"}


def prompt_ids(input_ids: Any, vocab: int | None = None) -> list[int]:
    """Token ids as a list: from a list of ints, a 1-D tensor or a ``[1, S]`` tensor."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2 and input_ids.shape[0] == 1:
            input_ids = input_ids[0]
        if input_ids.dim() != 1 or input_ids.is_floating_point():
            raise InputError(
                f"input_ids must be integer ids of shape [S] or [1, S], got {tuple(input_ids.shape)} "
                f"{input_ids.dtype}",
                hint="generate takes one prompt (batch 1)",
            )
        ids = [int(t) for t in input_ids.tolist()]
    elif isinstance(input_ids, Sequence) and not isinstance(input_ids, (str, bytes)):
        try:
            ids = [int(t) for t in input_ids]
        except (TypeError, ValueError) as exc:
            raise InputError(f"input_ids must be ints: {exc}", hint="e.g. input_ids=[1, 2, 3]") from exc
    else:
        raise InputError(
            f"input_ids must be a list of ints or a tensor, got {type(input_ids).__name__}",
            hint="e.g. input_ids=[1, 2, 3]",
        )
    if not ids:
        raise InputError("input_ids is empty", hint="pass a prompt of at least one token")
    if vocab is not None and any(not 0 <= t < vocab for t in ids):
        bad = next(t for t in ids if not 0 <= t < vocab)
        raise InputError(f"token id {bad} is outside the vocabulary [0, {vocab})", hint="check the tokenizer")
    return ids


@dataclass(frozen=True)
class Generation:
    """The prompt and the new tokens (``tokens``: all of them, like transformers' ``generate``),
    and the logits that chose each new token (``[new, vocab]``)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    prompt_len: int

    @property
    def new_tokens(self) -> list[int]:
        return [int(t) for t in self.tokens[0, self.prompt_len :]]


class DecoderSession:
    """One file, loaded once, with its cache: ``step(ids)`` runs the program on the next tokens and
    returns their logits ``[len(ids), vocab]``; ``reset()`` empties the cache. The cache is the
    program's input, and its output is either the whole updated cache or (``"rows"``) the new
    rows, written here in place. The files of a deploy folder: a ``"genai"`` .onnx is driven as
    onnxruntime-genai drives it (``_genai_step``); a ``"buffers"`` .pte keeps its cache inside,
    and ``reopen`` loads it again to empty it."""

    def __init__(
        self,
        runner: Any,
        layout: LlmLayout,
        label: str = "the program",
        reopen: Any = None,
        past_slots: Any = None,
    ) -> None:
        """``past_slots``: how many cache slots a call at a position passes, instead of what the
        layout says (a proof drives a file with the past another file is fed)."""
        self.runner, self.layout, self.label = runner, layout, label
        self.past_slots = past_slots
        #: a ``"genai"`` file's genai_config.json (the names it is fed by), when beside it
        self.genai_config: dict[str, Any] | None = None
        self._past: dict[str, torch.Tensor] = {}
        self._reopen = reopen
        self._fresh = True
        if layout.cache == "buffers" and reopen is None:
            raise InputError(
                f"{label} keeps its cache inside: a session over it needs a way to load it again",
                hint="open it with DecoderSession.open(path)",
            )
        self.reset()

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> DecoderSession:
        """Load ``path`` in its runtime (ONNX Runtime for .onnx, ExecuTorch for .pte), in this
        process, and read the layout it records."""
        from ..runtimes import open_runner

        path = pathlib.Path(path)
        target = _TARGETS.get(path.suffix)
        if target is None:
            raise InputError(
                f"{path.name} is neither .onnx nor .pte", hint="pass the .onnx or .pte that export_llm wrote"
            )
        if not path.is_file():
            raise InputError(f"{path} does not exist", hint="pass the path of an exported file")
        runner = open_runner(target, path, isolated=False)
        layout = read_layout(path, runner if target == "onnx" else None)
        session = cls(runner, layout, path.name, reopen=lambda: open_runner(target, path, isolated=False))
        config = path.parent / "genai_config.json"
        if layout.cache == "genai" and config.is_file():
            import json

            session.genai_config = json.loads(config.read_text())
        return session

    def reset(self) -> None:
        dtype = getattr(torch, self.layout.dtype)
        if self.layout.cache == "buffers":  # the cache is inside: a fresh load empties it
            if not self._fresh:
                self.runner = self._reopen()
            self._fresh = True
            self.past_k = self.past_v = torch.zeros(0, dtype=dtype)
        else:
            self.past_k = torch.zeros(self.layout.cache_shape(), dtype=dtype)
            self.past_v = torch.zeros(self.layout.cache_shape(values=True), dtype=dtype)
        self.position = 0

    def check_room(self, prompt: int, new: int) -> None:
        """Refuse a generation that needs more positions than the cache holds."""
        t = self.layout.max_seq_len
        if prompt + new > t or prompt > self.layout.max_prompt:
            raise SequenceTooLongError(
                f"a prompt of {prompt} tokens plus {new} new tokens needs {prompt + new} positions, "
                f"past {self.label}'s max_seq_len of {t}",
                hint=f"ask for at most {max(t - prompt, 0)} new tokens, shorten the prompt, or re-export "
                f"with export_llm(..., max_seq_len={prompt + new})",
            )

    def step(self, ids: Sequence[int]) -> torch.Tensor:
        n, t = len(ids), self.layout.max_seq_len
        if self.position + n > t or n > self.layout.max_prompt:
            raise SequenceTooLongError(
                f"{n} tokens at position {self.position} need positions up to {self.position + n}; "
                f"{self.label} holds {t} (at most {self.layout.max_prompt} per call)",
                hint="reset() the session, feed fewer tokens per call, or re-export with a larger max_seq_len",
            )
        tokens = torch.tensor([list(ids)], dtype=torch.long)
        position = torch.arange(self.position, self.position + n, dtype=torch.long)
        kind = self.layout.cache
        if kind == "buffers":
            self._fresh = False
            logits = self.runner.run([tokens, position])[0]
            self.position += n
            return logits[0]
        if kind == "genai":
            logits = self._genai_step(tokens, position)
            self.position += n
            return logits[0]
        slots = self.layout.past_length(self.position) if kind == "rows" else t
        if self.past_slots is not None:
            slots = self.past_slots(self.position)
        past = self.layout.past_args(self.past_k, self.past_v, slots)
        logits, k, v = self.runner.run([tokens, position, *past])
        if kind == "rows":  # the new rows, written here at their positions
            self.past_k[:, :, :, self.position : self.position + n] = k
            self.past_v[:, :, :, self.position : self.position + n] = v
        else:
            self.past_k, self.past_v = k, v
        self.position += n
        return logits[0]

    def _genai_step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """One call as onnxruntime-genai makes it: inputs and outputs bound by the names its
        config gives (``genai_config.json`` beside the file, else its defaults), the past of
        exactly the tokens seen in, the presents read back as the next past."""
        import numpy as np

        from .deploy.genai import genai_names

        names = genai_names(self.layout.layers, self.genai_config)
        if self.position == 0:
            dtype = getattr(torch, self.layout.dtype)
            k, v = self.layout.cache_shape(), self.layout.cache_shape(values=True)
            search = (self.genai_config or {}).get("search", {})
            # a shared past/present buffer holds all max_length slots from the start
            slots = (
                int(search.get("max_length", self.layout.max_seq_len))
                if search.get("past_present_share_buffer")
                else 0
            )
            empty = [torch.zeros(1, k[2], slots, k[4], dtype=dtype)] * self.layout.layers
            empty += [torch.zeros(1, v[2], slots, v[4], dtype=dtype)] * self.layout.layers
            self._past = dict(zip(names.past, empty, strict=True))
        feed = {names.input_ids: tokens, names.position_ids: position.unsqueeze(0), **self._past}
        session = self.runner.session
        wanted = [names.logits, *names.present]
        try:
            outs = session.run(wanted, {k: np.ascontiguousarray(v.numpy()) for k, v in feed.items()})
        except Exception as exc:
            raise InputError(
                f"{self.label} does not run as onnxruntime-genai feeds it: {exc}",
                hint="the file's inputs and outputs must carry the names genai_config.json gives",
            ) from exc
        self._past = {
            name: torch.from_numpy(np.asarray(o)) for name, o in zip(names.past, outs[1:], strict=True)
        }
        return torch.from_numpy(np.asarray(outs[0]))

    def generate(self, input_ids: Any, max_new_tokens: int, *, stop_at_eos: bool = True) -> Generation:
        """Greedy: prefill the prompt, then one token per step until ``max_new_tokens`` (or an
        end-of-sequence id of the model, as transformers' ``generate`` stops)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        ids = prompt_ids(input_ids, self.layout.vocab)
        self.check_room(len(ids), max_new_tokens)
        self.reset()
        out = list(ids)
        chosen: list[torch.Tensor] = []
        eos = set(self.layout.eos_token_ids) if stop_at_eos else set()
        if max_new_tokens:
            logits = self.step(ids)[-1]
            while True:
                token = int(logits.argmax())
                out.append(token)
                chosen.append(logits)
                if len(chosen) == max_new_tokens or token in eos:
                    break
                logits = self.step([token])[-1]
        vocab = self.layout.vocab
        return Generation(
            torch.tensor([out], dtype=torch.long),
            torch.stack(chosen) if chosen else torch.zeros(0, vocab),
            len(ids),
        )


def generate(
    path: str | os.PathLike[str],
    input_ids: Any,
    *,
    max_new_tokens: int,
    return_logits: bool = False,
    stop_at_eos: bool = True,
    chat: bool = False,
) -> Any:
    """Greedy generation from an ``export_llm`` file: ONNX Runtime for ``.onnx``, ExecuTorch for
    ``.pte``. Returns the token ids ``[1, prompt + new]`` (as transformers' ``generate`` does), and
    with ``return_logits`` also the logits that chose each new token (``[new, vocab]``).

    ``input_ids`` may be text: the tokenizer written beside the file (a deploy folder's
    ``tokenizer.json``) encodes it (``chat=True``: as one user turn of its chat template), and
    the answer comes back as text (the new tokens decoded), with the logits when asked.

    Raises :class:`SequenceTooLongError` when the prompt plus ``max_new_tokens`` is past the
    file's ``max_seq_len``."""
    with typed_errors("generate"):
        tokenizer = None
        if isinstance(input_ids, str):
            from .deploy.tokenizer import folder_tokenizer, render_chat

            tokenizer = folder_tokenizer(pathlib.Path(path).parent)
            text = render_chat(tokenizer, input_ids) if chat else input_ids
            input_ids = tokenizer(text, add_special_tokens=not chat)["input_ids"]
        elif chat:
            raise InputError("chat=True needs the prompt as text", hint="pass the prompt as a string")
        gen = DecoderSession.open(path).generate(input_ids, max_new_tokens, stop_at_eos=stop_at_eos)
    if tokenizer is not None:
        answer = tokenizer.decode(gen.new_tokens, skip_special_tokens=True)
        return (answer, gen.logits) if return_logits else answer
    return (gen.tokens, gen.logits) if return_logits else gen.tokens

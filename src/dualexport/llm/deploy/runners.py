"""The runtimes' own LLM runners over a deploy folder, greedy: ExecuTorch's ``TextLLMRunner`` (the
C++ text runner of its apps, through its Python binding) and onnxruntime-genai's ``Generator``.

Why drive them here: what a user deploys is run by these runners, not by dualexport's loop, so
``dualexport generate FOLDER`` and the parity checks go through them. Each takes text (the
runner's own tokenizer encodes it); ``Generator`` also gives the token ids, ``TextLLMRunner``
only the text of each token (its callback), so its tokens are compared as pieces of text.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ...errors import InputError, RuntimeExecutionError, RuntimeLoadError

__all__ = ["RunnerAnswer", "run_text_llm_runner", "run_genai", "run_runner", "RUNTIMES"]

#: ``--runtime`` choices: the runner each drives.
RUNTIMES = {"xnnpack": "ExecuTorch TextLLMRunner", "onnx": "onnxruntime-genai Generator"}


@dataclass(frozen=True)
class RunnerAnswer:
    """A greedy answer: its text, the text of each new token (``pieces``), the token ids where the
    runner gives them (onnxruntime-genai), and the timings the runner reports."""

    runtime: str
    text: str
    pieces: tuple[str, ...]
    tokens: tuple[int, ...] | None
    prompt_tokens: int
    seconds: float
    first_token_s: float
    decode_tok_s: float

    @property
    def new_tokens(self) -> int:
        return len(self.pieces)


def _folder_file(folder: pathlib.Path, suffix: str, what: str) -> pathlib.Path:
    files = sorted(p for p in folder.glob(f"*{suffix}") if p.is_file())
    if not files:
        raise InputError(
            f"{folder} holds no {suffix} file for {what}",
            hint="pass a folder written by `dualexport export-llm` (export_llm with deploy=True)",
        )
    return files[0]


def _tokenizer_file(folder: pathlib.Path) -> pathlib.Path:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise InputError(
            f"{folder} holds no tokenizer.json: the runners tokenize the prompt themselves",
            hint="re-export with export_llm(..., tokenizer=...) or copy the model's tokenizer.json there",
        )
    return path


@contextlib.contextmanager
def _native_output_to_null() -> Iterator[None]:
    """The C++ runner prints each piece to the process's stdout (file descriptor 1) whatever the
    callback does, and logs to stderr (2); the caller prints the answer itself. Kept when
    dualexport logs at INFO (the CLI's ``-v``)."""
    from ..._quiet import verbose

    if verbose():
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (null, *saved):
            os.close(fd)


def run_text_llm_runner(folder: pathlib.Path, prompt: str, max_new_tokens: int) -> RunnerAnswer:
    """Greedy generation by ExecuTorch's ``TextLLMRunner`` over ``folder``'s .pte (and .ptd)."""
    pte = _folder_file(folder, ".pte", "ExecuTorch")
    data = pte.with_suffix(".ptd")
    try:
        tokenizer = str(_tokenizer_file(folder))
        with _native_output_to_null():  # the import and the load log natively too
            from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

            from ...compat.executorch import load_llm_ops
            from ...runtimes.executorch import uses_llm_ops

            if uses_llm_ops(pte):  # its kernels, which the runner's own Python module does not load
                load_llm_ops()
            runner = TextLLMRunner(str(pte), tokenizer, str(data) if data.is_file() else None)
    except Exception as exc:
        raise RuntimeLoadError(
            f"TextLLMRunner could not load {pte.name}: {exc}",
            target="xnnpack",
            hint="the file must come from export_llm's deploy folder (the cache inside, metadata methods)",
        ) from exc
    pieces: list[str] = []
    stats: list[object] = []
    config = GenerationConfig(
        echo=False, max_new_tokens=max_new_tokens, temperature=0.0, num_bos=0, num_eos=0
    )
    start = time.perf_counter()
    try:
        with _native_output_to_null():
            runner.generate(prompt, config, pieces.append, stats.append)
    except UnicodeDecodeError as exc:
        raise RuntimeExecutionError(
            f"TextLLMRunner produced a token that is part of a UTF-8 character ({exc.object!r}); its "
            "Python binding (ExecuTorch 1.4.1) cannot hand such a piece to Python",
            target="xnnpack",
            hint="a limit of the binding, not of the file: the C++ runner (llama_main) prints it; "
            "or run --runtime onnx",
        ) from exc
    except Exception as exc:
        raise RuntimeExecutionError(f"TextLLMRunner failed: {exc}", target="xnnpack") from exc
    seconds = time.perf_counter() - start
    first, decode, prompt_tokens = _stats(stats[-1] if stats else None, seconds, len(pieces))
    specials = _special_tokens(folder)
    text = "".join(p for p in pieces if p not in specials)  # as onnxruntime-genai decodes: no EOS text
    return RunnerAnswer("xnnpack", text, tuple(pieces), None, prompt_tokens, seconds, first, decode)


def _special_tokens(folder: pathlib.Path) -> set[str]:
    """The special tokens' texts of the folder's tokenizer.json (the runner's callback hands the
    end-of-sequence token's text like any other piece)."""
    import json

    try:
        data = json.loads((folder / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return set()
    return {t["content"] for t in data.get("added_tokens", []) if t.get("special")}


def _stats(stats: object, seconds: float, new: int) -> tuple[float, float, int]:
    """(time to first token, decode tokens/s, prompt tokens) from the runner's Stats (ms)."""
    if stats is None:
        return seconds, new / seconds if seconds > 0 else 0.0, 0
    start = getattr(stats, "inference_start_ms", 0)
    first_ms = getattr(stats, "first_token_ms", start) - start
    end_ms = getattr(stats, "inference_end_ms", start)
    decode_ms = end_ms - getattr(stats, "first_token_ms", start)
    rate = (new - 1) * 1000.0 / decode_ms if decode_ms > 0 and new > 1 else 0.0
    return first_ms / 1000.0, rate, int(getattr(stats, "num_prompt_tokens", 0))


def run_genai(folder: pathlib.Path, prompt: str, max_new_tokens: int) -> RunnerAnswer:
    """Greedy generation by onnxruntime-genai's ``Generator`` over ``og.Model(folder)``."""
    import numpy as np
    import onnxruntime_genai as og

    if not (folder / "genai_config.json").is_file():
        raise InputError(
            f"{folder} holds no genai_config.json", hint="pass a folder written by `dualexport export-llm`"
        )
    try:
        model = og.Model(str(folder))
        tokenizer = og.Tokenizer(model)
    except Exception as exc:
        raise RuntimeLoadError(f"onnxruntime-genai could not load {folder}: {exc}", target="onnx") from exc
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=False)
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    new: list[int] = []
    first = 0.0
    while not generator.is_done() and len(new) < max_new_tokens:
        generator.generate_next_token()
        new.append(int(generator.get_next_tokens()[0]))
        if len(new) == 1:
            first = time.perf_counter() - start
    seconds = time.perf_counter() - start
    decode = (len(new) - 1) / (seconds - first) if len(new) > 1 and seconds > first else 0.0
    text = tokenizer.decode(np.array(new, dtype=np.int32)) if new else ""
    pieces = tuple(tokenizer.decode(np.array([t], dtype=np.int32)) for t in new)
    return RunnerAnswer("onnx", text, pieces, tuple(new), len(ids), seconds, first, decode)


def run_runner(
    folder: str | os.PathLike[str], prompt: str, *, runtime: str, max_new_tokens: int
) -> RunnerAnswer:
    """The answer of ``runtime``'s own runner (one of :data:`RUNTIMES`) to ``prompt``."""
    path = pathlib.Path(folder)
    if not path.is_dir():
        raise InputError(f"{path} is not a folder", hint="pass the deploy folder export-llm wrote")
    if runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}", hint=f"one of {', '.join(RUNTIMES)}")
    if runtime == "xnnpack":
        return run_text_llm_runner(path, prompt, max_new_tokens)
    return run_genai(path, prompt, max_new_tokens)

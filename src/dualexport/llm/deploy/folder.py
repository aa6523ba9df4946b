"""The deploy folder ``export_llm`` writes by default: what the runtimes' own LLM runners load, and
nothing else.

```
<out>/model.pte             ExecuTorch's TextLLMRunner (cache inside, metadata methods)
<out>/model.ptd             its weights, when they go to a data file (large models)
<out>/model.onnx(.data)     onnxruntime-genai's og.Model(<out>)
<out>/genai_config.json
<out>/tokenizer.json, tokenizer_config.json (chat template), ...
<out>/.dualexport/          dualexport's own: the proven explicit-cache .onnx, the .pt2 and
                            inputs of the re-export cache, the weight manifest, the lock
```

Each deploy file is made from the one shared program (the .pte from the program itself, the
.onnx from the proven .onnx), proven by generation walks from disk (``proof.py``), and the
folder's files are committed as one set: a file that fails its proof is not published and the
result says why. The .pte also gets the weight proof of its own copies (``runner_weights.py``):
no explicit-cache .pte is made to carry it (``export_llm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._stages import stage
from ...errors import DualExportError
from ..layout import LlmLayout

__all__ = ["DeployFolder", "write_deploy_folder", "CACHE_FOLDER", "RUNNER_TARGETS"]

logger = logging.getLogger(__name__)

#: dualexport's own files inside a deploy folder (not shipped).
CACHE_FOLDER = ".dualexport"
#: Weights (bytes) from which the runner .pte keeps its XNNPACK weights in a ``.ptd`` beside it.
PTE_DATA_FILE_ABOVE = 2 << 30
#: A quantized program's genai file below accuracy level 4 keeps its own attention: it is held to
#: the proven file as the same graph and kernels (proof.py), which another attention kernel is not
#: (a 1e-7 change of an activation moves int8 levels: 61 dB on a 2-layer decoder, 80 needed).
QUANTIZED_ATTENTION = "the program's own: a quantized program's runner file is proven kernel for kernel"
#: Each runner file, as its stage is named.
RUNNER_FILES = {"xnnpack": "the runner .pte", "onnx": "the onnxruntime-genai .onnx"}
#: The key each deploy file's failure is reported under in ``ExportResult.errors``.
RUNNER_TARGETS = {"xnnpack": "xnnpack:runner", "onnx": "onnx:genai"}


@dataclass(frozen=True)
class DeployFolder:
    """The files a user ships (``files``), by role; the proof of each; what was not written, why."""

    folder: pathlib.Path
    pte: pathlib.Path | None = None
    onnx: pathlib.Path | None = None
    genai_config: pathlib.Path | None = None
    tokenizer: tuple[pathlib.Path, ...] = ()
    files: tuple[pathlib.Path, ...] = ()
    proofs: Mapping[str, Any] = field(default_factory=dict)
    errors: Mapping[str, DualExportError] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    #: each runner file's attention: the runtime's own LLM attention op, or the program's and why
    attention: Mapping[str, str] = field(default_factory=dict)
    #: the runner .pte's weight proof: the shared program's weights found in it, copies per status
    weights: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: the runner .pte's XNNPACK delegation (a ``DelegationReport``)
    delegation: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def write_deploy_folder(
    res: Any,
    layout: LlmLayout,
    out_dir: pathlib.Path,
    name: str,
    *,
    model: Any,
    tokenizer: Any,
    options: Any,
    targets: tuple[str, ...] | None = None,
) -> DeployFolder:
    """Make, prove and commit the deploy files of ``res`` (an ``export_llm`` result whose files
    are in ``out_dir/.dualexport``) into ``out_dir``, for ``targets`` (default: those ``res``
    exported). A target whose explicit file failed gets no deploy file; the .pte needs none (it
    is made from the shared program); a deploy file that fails is reported, not published."""
    from ...outputs.commit import recover
    from ...outputs.lock import export_lock

    cache = out_dir / CACHE_FOLDER
    cache.mkdir(parents=True, exist_ok=True)
    with export_lock(cache, f"{name}.deploy"):
        # a killed run's half-done commit is finished, its staging folders go (the lock of the
        # export's own folder, .dualexport, does that for .dualexport only)
        recover(out_dir, name)
        wanted = targets if targets is not None else (*res.artifacts, *res.errors)
        return _write(res, layout, out_dir, name, model, tokenizer, options, tuple(wanted))


def _write(
    res: Any,
    layout: LlmLayout,
    out_dir: pathlib.Path,
    name: str,
    model: Any,
    tokenizer: Any,
    options: Any,
    targets: tuple[str, ...],
) -> DeployFolder:
    import time

    from ...outputs.atomic import staging_dir
    from ...outputs.commit import ArtifactSet
    from .tokenizer import save_tokenizer, special_ids

    bos, eos, pad = special_ids(tokenizer, model)

    errors: dict[str, DualExportError] = {}
    skipped: dict[str, str] = {}
    proofs: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    roles: dict[str, Any] = {}
    attention: dict[str, str] = {}
    pte: dict[str, Any] = {}
    with staging_dir(out_dir) as staging:
        for target in ("xnnpack", "onnx"):
            if target not in targets:
                continue
            if target in res.errors:
                skipped[target] = f"its explicit-cache file failed: {res.errors[target].message}"
                continue
            if target not in res.artifacts and target != "xnnpack":  # the .pte needs none
                continue
            start = time.perf_counter()
            try:
                with stage(f"deploy: {RUNNER_FILES[target]}"):
                    made = _made(target, res, layout, staging, name, model, options, (bos, eos, pad))
                if made is None:
                    skipped[target] = "the decoder needs the whole-cache program (see the log)"
                elif target == "xnnpack":
                    roles["pte"], (proofs[target], pte), attention[target] = made
                else:
                    roles["onnx"], roles["genai_config"], proofs[target], attention[target] = made
            except Exception as exc:  # one runner file failing leaves the other and the explicit files
                error = exc if isinstance(exc, DualExportError) else _internal(target, exc)
                logger.warning("the %s deploy file was not published: %s", target, error.message)
                errors[RUNNER_TARGETS[target]] = error
                _remove_staged(staging, name, target)
            seconds[RUNNER_TARGETS[target]] = time.perf_counter() - start
        tokenizer_files: tuple[pathlib.Path, ...] = ()
        if tokenizer is not None:
            tokenizer_files = save_tokenizer(tokenizer, staging)
        tx = ArtifactSet(out_dir, name, staging)
        committed = tx.commit()

    def final(path: pathlib.Path | None) -> pathlib.Path | None:
        return None if path is None else out_dir / path.name

    return DeployFolder(
        folder=out_dir,
        pte=final(roles.get("pte")),
        onnx=final(roles.get("onnx")),
        genai_config=final(roles.get("genai_config")),
        tokenizer=tuple(out_dir / p.name for p in tokenizer_files),
        files=tuple(committed),
        proofs=proofs,
        errors=errors,
        skipped=skipped,
        seconds=seconds,
        attention=attention,
        weights={"xnnpack": pte["weights"]} if "weights" in pte else {},
        delegation={"xnnpack": pte["delegation"]} if pte.get("delegation") is not None else {},
    )


def _made(
    target: str,
    res: Any,
    layout: LlmLayout,
    staging: pathlib.Path,
    name: str,
    model: Any,
    options: Any,
    special: tuple[Any, Any, Any],
) -> Any:
    """The runner file of ``target``, proven (None: the genai file needs the rows program)."""
    if target == "xnnpack":
        return _runner_pte(res, layout, staging, name, options, special[0], special[1])
    return _genai(res, layout, staging, name, model, options, special)


def _internal(target: str, exc: BaseException) -> DualExportError:
    from ...errors import InternalError

    error = InternalError(
        f"making the {target} runner file failed: {type(exc).__name__}: {exc}",
        hint="a bug in dualexport: report it with the model; the explicit-cache files in "
        ".dualexport are unaffected",
    )
    error.__cause__ = exc
    return error


def _remove_staged(staging: pathlib.Path, name: str, target: str) -> None:
    suffixes = (".pte", ".ptd") if target == "xnnpack" else (".onnx", ".onnx.data")
    for suffix in suffixes:
        with contextlib.suppress(FileNotFoundError):
            (staging / f"{name}{suffix}").unlink()
    if target == "onnx":
        from .genai import GENAI_CONFIG

        with contextlib.suppress(FileNotFoundError):
            (staging / GENAI_CONFIG).unlink()


def _quantized(res: Any) -> bool:
    from ...exporters.onnx_quant import uses_torchao

    return bool(uses_torchao(res.program.exported_program))


def _runner_pte(
    res: Any, layout: LlmLayout, staging: pathlib.Path, name: str, options: Any, bos: Any, eos: Any
) -> tuple[pathlib.Path, tuple[Any, dict[str, Any]], str]:
    from .executorch import lower_runner_pte, runner_methods
    from .proof import prove_deploy_file
    from .runner_proof import prove_runner_by_linears
    from .runner_weights import prove_runner_weights

    opts = options
    if opts.xnnpack_external_data is None:
        # one file, as ExecuTorch's own LLM export writes and TextLLMRunner(pte, tokenizer) takes;
        # a data file (passed as the runner's data_path) only past what one file should carry
        weights = sum(t.numel() * t.element_size() for t in res.program.state_dict.values())
        opts = dataclasses.replace(opts, xnnpack_external_data=weights >= PTE_DATA_FILE_ABOVE)
    quantized = _quantized(res)
    # a float program's file is held to the shared program; a quantized one to its own graph
    reference, against = _reference(res, layout, "xnnpack", False) if not quantized else (None, "")

    def attempt(fuse: bool) -> tuple[pathlib.Path, tuple[Any, dict[str, Any]], str]:
        lowered, attention, decomposed = lower_runner_pte(
            res.program.exported_program,
            layout,
            staging,
            name,
            opts,
            runner_methods(layout, bos, eos),
            fuse=fuse,
        )
        path = lowered.files[0]
        if quantized:  # its own graph, linear by linear (runner_proof.py), whatever its attention
            proof = prove_runner_by_linears(path, decomposed, layout, res.program.exported_program)
        else:
            assert reference is not None
            proof = prove_deploy_file(path, "xnnpack", reference, against, layout, quantized)
        found = prove_runner_weights(path, res.program, lowered, decomposed)
        del decomposed
        return path, (proof, {"weights": found, "delegation": lowered.delegation}), attention

    # ExecuTorch's LLM attention ops; where that file fails (a kernel or a proof this model
    # trips), the program's own attention, saying why
    return _fused_or_own("xnnpack", staging, name, attempt)


def _fused_or_own(target: str, staging: pathlib.Path, name: str, attempt: Callable[[bool], Any]) -> Any:
    """``attempt(True)`` (the runtime's own attention op), else ``attempt(False)`` with the
    reason the fused file was not taken as its attention."""
    try:
        return attempt(True)
    except Exception as exc:  # the fallback is the file every model got before these ops
        text = exc.message if isinstance(exc, DualExportError) else f"{type(exc).__name__}: {exc}"
        first = text.splitlines()[0] if text else type(exc).__name__
        logger.warning(
            "the fused %s runner file was refused (%s); the program's own attention instead", target, first
        )
        _remove_staged(staging, name, target)
        made = attempt(False)
        return (*made[:-1], f"the program's own: the fused file was refused ({first})")


def _reference(res: Any, layout: LlmLayout, target: str, quantized: bool) -> tuple[Any, str]:
    """What a runner file is held to (proof.py's docstring), as a maker of sessions and its
    label: the shared program for a float program; for a quantized genai .onnx, the proven
    explicit .onnx fed the past of the tokens seen (a size below the explicit file's declared
    past range, which its graph takes as it is). A quantized .pte is held to its own graph
    (runner_proof.py)."""
    from ...runtimes import open_runner
    from ..session import DecoderSession
    from .proof import ProgramRunner

    if not quantized:

        def program() -> Any:
            return DecoderSession(ProgramRunner(res.program.exported_program), layout, "the shared program")

        return program, "the shared program"
    explicit = res.artifacts[target].path

    def proven() -> Any:
        runner = open_runner(target, explicit, isolated=False)
        runner.input_specs = None  # type: ignore[attr-defined]
        return DecoderSession(runner, layout, explicit.name, past_slots=lambda p: p)

    return proven, f"the proven {explicit.name} fed the past of the tokens seen"


def _kernel_reference(res: Any, layout: LlmLayout, options: Any) -> tuple[Any, Any, str] | None:
    """For a quantized program whose .onnx runs ONNX Runtime's own int8 kernel (accuracy level 4):
    sessions over the program with float activations (the reference) and over the quantized
    program (its noise), and the label; None for any other (proof.py's docstring)."""
    from ...exporters.onnx_quant import float_activations
    from ..session import DecoderSession
    from .proof import ProgramRunner

    program = res.program.exported_program
    if options is None or options.int4_level != 4:
        return None
    approximation = float_activations(program)
    if approximation is program:
        return None
    label = "the shared program with float activations into its MatMulNBits linears (accuracy level 4)"

    def reference() -> Any:
        return DecoderSession(ProgramRunner(approximation), layout, label)

    def noise() -> Any:
        return DecoderSession(ProgramRunner(program), layout, "the shared program")

    return reference, noise, label


def _genai(
    res: Any,
    layout: LlmLayout,
    staging: pathlib.Path,
    name: str,
    model: Any,
    options: Any,
    special: tuple[Any, Any, Any],
) -> tuple[pathlib.Path, pathlib.Path, Any, str] | None:
    from .genai import GENAI_CONFIG, bake_session_config, genai_config, genai_onnx, write_config
    from .genai_packing import builder_fusions
    from .proof import prove_deploy_file

    if layout.cache != "rows":
        logger.warning(
            "no onnxruntime-genai file: %s exports with the whole cache (its attention asks the "
            "cache for more than the new rows), which onnxruntime-genai cannot feed",
            layout.model,
        )
        return None
    explicit = res.artifacts["onnx"].path
    path = staging / f"{name}.onnx"
    quantized = _quantized(res)
    bos, eos, pad = special
    kernel = _kernel_reference(res, layout, options) if quantized else None
    noise = None
    if kernel is not None:  # held to the criterion its explicit file was proven by
        reference, noise, against = kernel
    else:
        reference, against = _reference(res, layout, "onnx", quantized)

    def attempt(fuse: bool) -> tuple[pathlib.Path, pathlib.Path, Any, str]:
        if quantized:  # written aside, then baked with its session entries (bake_session_config)
            aside = staging / ".genai"
            aside.mkdir(exist_ok=True)
            try:
                made = genai_onnx(explicit, aside / path.name, layout, fuse=fuse)
                bake_session_config(aside / path.name, path)
            finally:
                shutil.rmtree(aside, ignore_errors=True)
        else:
            made = genai_onnx(explicit, path, layout, fuse=fuse)
        attention = made.attention
        if made.fused and builder_fusions(path)[0]:  # one projection per layer, as genai's builder
            attention += " (packed QKV)"
        config = genai_config(
            layout,
            filename=path.name,
            model_config=getattr(model, "config", None),
            bos_token_id=bos,
            eos_token_ids=eos,
            pad_token_id=pad,
            share_buffer=made.fused,
        )
        # written first: the proof drives the file as onnxruntime-genai does with this config
        written = write_config(staging / GENAI_CONFIG, config)
        proof = prove_deploy_file(path, "onnx", reference, against, layout, quantized, noise)
        return path, written, proof, attention

    if quantized and kernel is None:
        # a quantized file is held to the proven file as the same graph and kernels (proof.py),
        # which another attention kernel is not
        return (*attempt(False)[:-1], QUANTIZED_ATTENTION)
    result: tuple[pathlib.Path, pathlib.Path, Any, str] = _fused_or_own("onnx", staging, name, attempt)
    return result

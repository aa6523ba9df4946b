"""``dx.export_llm``: a decoder's cache-aware program, traced once, through the usual export.

Why through ``dx.export``: the wrapper is an ordinary module with four tensor inputs, so the one
trace, the shared passes, both targets, the proofs from disk, the weight manifest and the cache of
previous sets all apply as they are; this module only builds the wrapper, its example and its
dynamic dim, and asks each file to record the cache layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .._stages import recording, stage
from ..errors import CaptureError, DualExportError, InputError, typed_errors
from ..exporters import ExportOptions
from ..exporters.registry import normalize_targets
from .deploy.folder import CACHE_FOLDER

__all__ = ["export_llm", "MIN_SEQ_LEN", "QUANTIZE_KEY"]

logger = logging.getLogger(__name__)

#: The shortest window worth a program: a prefill of at least 2 tokens plus decode room.
MIN_SEQ_LEN = 4
#: File metadata key: the weight quantization of a quantized decoder (its description).
QUANTIZE_KEY = "dualexport.llm_quantize"


def _check_max_seq_len(model: nn.Module, max_seq_len: Any) -> int:
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < MIN_SEQ_LEN:
        raise InputError(
            f"max_seq_len must be an int >= {MIN_SEQ_LEN}, got {max_seq_len!r}",
            hint="pass the longest prompt plus new tokens a generate call will need, e.g. max_seq_len=512",
        )
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None) if config is not None else None
    if isinstance(limit, int) and max_seq_len > limit:
        raise InputError(
            f"max_seq_len={max_seq_len} is past the model's {limit} positions (max_position_embeddings)",
            hint=f"pass max_seq_len <= {limit}",
        )
    return max_seq_len


def export_llm(
    model: nn.Module | str | os.PathLike[str],
    *,
    max_seq_len: int,
    out_dir: str | os.PathLike[str] = "dualexport_out",
    name: str = "model",
    target: str | Sequence[str] = ("onnx", "xnnpack"),
    quantize: str | None = None,
    strict: bool = False,
    optimize: bool = True,
    options: ExportOptions | None = None,
    deploy: bool = True,
    tokenizer: Any = None,
    explicit_pte: bool = False,
) -> Any:
    """Export a decoder for generation to ONNX and ExecuTorch/XNNPACK from one trace.

    ``model``: a transformers causal LM, a user's module with the same forward
    (``forward(input_ids, position_ids=..., past_key_values=cache)``, each attention layer calling
    ``cache.update(key, value, layer_idx)``), or a reference :func:`~dualexport.llm.load_decoder`
    takes (a config .json, a model folder, ``MODULE:ATTR``). The program is
    ``forward(input_ids[1,S], cache_position[S], *past) -> (logits, new_k, new_v)`` with
    ``1 <= S < max_seq_len`` (prefill and decode), ``past`` each layer's keys then values. Returns the usual
    :class:`~dualexport.api.ExportResult`; ``dx.generate`` runs either file.

    ``optimize=False`` exports the plain design: the model's own attention, the cache written with
    ``index_copy``, no dualexport pass (what the libraries lower by themselves, for comparison).

    ``quantize="int4"`` (group 32, asymmetric through group offsets, the output head 8-bit per
    channel: holds real weights), ``"int4-sym"`` (symmetric, group 32: faster, less accurate) or
    ``"int8"`` (symmetric, per channel) rewrites every linear
    of the one program into 8-bit dynamic activations and quantized weights (``llm/quantize.py``):
    one set of codes and scales, proven in both files; linears whose in_features the group does
    not divide stay float32 (logged). Parity of a quantized result is against the quantized
    program (``generation_parity``).

    ``deploy=True`` (default): ``out_dir`` is a deploy folder (``llm/deploy/``): ``<name>.pte``
    for ExecuTorch's ``TextLLMRunner`` (the cache inside the program, the runner's metadata
    methods), ``<name>.onnx`` with ``genai_config.json`` for onnxruntime-genai's ``og.Model``,
    and the tokenizer's files (``tokenizer``: a transformers tokenizer, a folder or a .gguf file;
    by default the model's own, found where it was loaded from); the explicit-cache .onnx above
    (the genai file is made from it), proven first, and the re-export cache go to
    ``out_dir/.dualexport`` (``res.artifacts``). The .pte is made from the shared program alone,
    with its value proof and the weight proof of its own copies (``res.deploy.weights``): no
    explicit-cache .pte is made beside it unless the export targets XNNPACK alone or
    ``explicit_pte=True`` asks for it (``dx.generate``'s explicit layout on ExecuTorch, the
    manifest's per-copy record of the .pte).
    ``res.deploy`` lists the deploy files and their proofs. ``deploy=False`` writes only the
    explicit-cache files (both targets), into ``out_dir``.
    """
    with typed_errors("export_llm"):
        resolved, label = _resolve_model(model)
        folder = pathlib.Path(out_dir)
        tok = _deploy_tokenizer(tokenizer, model, resolved) if deploy else None
        targets = normalize_targets(target)
        layouts: list[Any] = []  # the layout of the last export: the .pte's when no file was proven
        with recording() as timings:
            res = _export_llm(
                resolved,
                label,
                max_seq_len=max_seq_len,
                out_dir=folder / CACHE_FOLDER if deploy else folder,
                name=name,
                target=_explicit_targets(targets, deploy and not explicit_pte),
                quantize=quantize,
                strict=strict,
                optimize=optimize,
                options=options,
                layouts=layouts,
            )
            if deploy:
                last = layouts[-1] if layouts else None
                res = _with_deploy_folder(res, resolved, tok, folder, name, options, quantize, targets, last)
        return dataclasses.replace(res, timings=tuple(timings))


def _deploy_tokenizer(tokenizer: Any, model: Any, resolved: nn.Module) -> Any:
    """The tokenizer to ship, refused before the export (not after) when given wrongly."""
    from .deploy.tokenizer import resolve_tokenizer

    return resolve_tokenizer(tokenizer, model if isinstance(model, (str, os.PathLike)) else None, resolved)


def _explicit_targets(targets: tuple[str, ...], deploy: bool) -> tuple[str, ...]:
    """The targets of the explicit-cache files. A deploy folder's .pte is made from the shared
    program itself (deploy/executorch.py) and proven, weights included, on its own: an
    explicit-cache .pte beside it would be lowered and proven (a whole-model XNNPACK lowering,
    a third of the export) and never shipped. The .onnx stays: the genai file is made from it."""
    if deploy and "xnnpack" in targets and "onnx" in targets:
        return tuple(t for t in targets if t != "xnnpack")
    return targets


def _with_deploy_folder(
    res: Any,
    model: nn.Module,
    tokenizer: Any,
    folder: pathlib.Path,
    name: str,
    options: ExportOptions | None,
    quantize: str | None,
    targets: tuple[str, ...],
    exported: Any,
) -> Any:
    """``res`` with its deploy folder written (see ``export_llm``); a deploy file that failed
    is one more error of the result. ``exported``: the layout the program was exported with,
    for a .pte made when no explicit file was published (the .onnx failed)."""
    from .deploy import write_deploy_folder
    from .layout import read_layout

    if res.artifacts:
        layout = read_layout(next(iter(res.artifacts.values())).path)
    elif "xnnpack" in targets and exported is not None and res.program is not None:
        layout = exported
    else:
        return res
    opts = options or ExportOptions()
    if quantize is not None:
        opts = _quantized_opset(opts)
    deployed = write_deploy_folder(
        res, layout, folder, name, model=model, tokenizer=tokenizer, options=opts, targets=targets
    )
    errors = {**res.errors, **deployed.errors}
    seconds = {**res.seconds, **deployed.seconds}
    return dataclasses.replace(res, deploy=deployed, errors=errors, seconds=seconds)


def _export_llm(
    model: nn.Module,
    label: str,
    *,
    max_seq_len: int,
    out_dir: str | os.PathLike[str],
    name: str,
    target: str | Sequence[str],
    quantize: str | None,
    strict: bool,
    optimize: bool,
    options: ExportOptions | None,
    layouts: list[Any],
) -> Any:
    from .. import api
    from .attention import exported_attention
    from .wrapper import DecoderWithCache, dynamic_shapes, example_inputs, past_step, probe_layout

    scheme = _checked_scheme(quantize, optimize)
    max_seq_len = _check_max_seq_len(model, max_seq_len)
    was_training = model.training
    model.eval()
    try:
        with stage("decoder layout probe"):
            layout = probe_layout(model, max_seq_len, label or type(model).__name__)
        args = example_inputs(layout)
        logger.info("decoder layout: %s", layout)
        attention = exported_attention(model) if optimize else contextlib.nullcontext()
        transforms = _decoder_transforms(optimize, scheme)
        with torch.no_grad(), attention:
            step = past_step(layout.max_seq_len) if optimize else 0
            with stage("eager checks (cache layout)"):
                if optimize:
                    wrapper = _rows_or_dense(
                        model, layout.with_past_step(step), args, label or type(model).__name__
                    )
                else:
                    wrapper = DecoderWithCache(model, layout.sliding, "index_copy").eval()
                    prefill = _dry_run(wrapper, args, label or type(model).__name__)
                    _check_against_model(model, wrapper, prefill, args, layout, label or type(model).__name__)

            def export(wrapped: DecoderWithCache, step: int) -> Any:
                kind = "rows" if wrapped.mode == "rows" else "explicit"
                lay = layout.with_past_step(step).with_cache(kind)
                layouts.append(lay)
                return api.export(
                    wrapped,
                    args,
                    target=target,
                    out_dir=out_dir,
                    name=name,
                    dynamic_shapes=dynamic_shapes(lay),
                    transforms=transforms,
                    strict=strict,
                    optimize=optimize,
                    options=_decoder_options(options, lay, scheme),
                )

            def run(wrapped: DecoderWithCache) -> Any:
                return _with_prefix_or_whole(export, wrapped, step if wrapped.mode == "rows" else 0)

            return _run_with_mask_retry(run, wrapper, model, args, label or type(model).__name__)
    finally:
        model.train(was_training)


def _with_prefix_or_whole(export: Any, wrapper: Any, step: int) -> Any:
    """Export with the cache passed by prefixes of ``step`` slots (a dynamic past length: each
    call reads the positions used, not all ``max_seq_len`` slots); a decoder that cannot be
    traced or lowered so (a guard on the past length, an op a target takes only with static
    sizes) is exported again with all slots."""
    if not step:
        return export(wrapper, 0)
    try:
        res = export(wrapper, step)
    except CaptureError as exc:
        logger.info("the cache travels whole: a dynamic past length does not trace (%s)", str(exc)[:300])
        return export(wrapper, 0)
    if res.ok:
        return res
    logger.info("the cache travels whole: with a dynamic past length %s", dict(res.errors))
    return export(wrapper, 0)


def _run_with_mask_retry(
    run: Any, wrapper: Any, model: nn.Module, args: tuple[torch.Tensor, ...], label: str
) -> Any:
    """Export the wrapper; a decoder that sizes its own default mask by the past length (a traced
    value: torch.export cannot guard on it) is traced again with the mask given, all ones over the
    cache (no padding, the same meaning). The first error is the one reported if that fails too."""
    from .wrapper import DecoderWithCache, takes_attention_mask

    try:
        return run(wrapper)
    except CaptureError as exc:
        if "data-dependent" not in str(exc) or not takes_attention_mask(model):
            raise
        logger.info("capture needs a static attention mask (%s); retrying with one", str(exc)[:200])
        mode = "dense" if wrapper.mode == "rows" else wrapper.mode  # a padding mask needs the whole cache
        masked = DecoderWithCache(model, wrapper.sliding, mode, padding_mask=True).eval()
        _dry_run(masked, args, label)
        try:
            return run(masked)
        except CaptureError:
            raise exc from None


def _rows_or_dense(model: nn.Module, layout: Any, args: tuple[torch.Tensor, ...], label: str) -> Any:
    """The ``"rows"`` wrapper (the program returns the new rows only) when the decoder computes
    with it what it computes with the whole cache, else the ``"dense"`` one. Checked eagerly on
    the example prefill and one decode step after it: logits and the cache rows written must
    agree. A decoder that asks the cache for what only the whole cache serves (a padding mask, a
    second update of a layer) raises ``RowsUnsupported`` and gets the dense wrapper."""
    from .cache import RowsUnsupported
    from .wrapper import DecoderWithCache

    dense = DecoderWithCache(model, layout.sliding, "dense").eval()
    prefill = _dry_run(dense, args, label)
    _check_against_model(model, dense, prefill, args, layout, label)
    rows = DecoderWithCache(model, layout.sliding, "rows").eval()
    try:
        # the decode step at position n gets a prefix longer than n (noise in the extra slots):
        # any prefix of at least n slots must give the same logits
        n = args[0].shape[1]
        slots = (
            min(layout.max_seq_len, layout.past_length(n) + layout.past_step) if layout.past_step else None
        )
        why = _rows_disagree(dense, prefill, rows, args, layout, slots)
    except RowsUnsupported as exc:
        why = str(exc)
    except Exception as exc:  # the model's own error under the rows cache: the dense one runs
        why = f"{type(exc).__name__}: {exc}"
    if why:
        logger.info("the cache travels whole (dense): the new-rows program %s", why)
        return dense
    return rows


def _check_against_model(
    model: nn.Module, wrapper: Any, prefill: Any, args: tuple[torch.Tensor, ...], layout: Any, label: str
) -> None:
    """Refuse a decoder that computes other logits with the fixed-length cache than its own
    forward without a cache, on the example prefill and one decode step: its attention sizes a
    mask or bias by the tokens seen (GPT-Neo's local attention slices its causal bias by the
    key length, which is the cache's ``max_seq_len`` here), so the files would generate other
    tokens than the model. ``wrapper`` returns the whole cache; ``prefill`` is its output on
    ``args``. A forward that cannot run without a cache is not checked (logged). Tolerance:
    1e-3 of the logits' scale (two attention implementations of the same function)."""
    from .wrapper import _accepted_kwargs, _logits

    ids = args[0]
    n = ids.shape[1]
    logits, present_k, present_v = prefill
    nxt = logits[:, -1:].argmax(-1)
    try:
        plain = _accepted_kwargs(model, {"use_cache": False})
        want = _logits(model(input_ids=ids, **plain))
        want_step = _logits(model(input_ids=torch.cat([ids, nxt], 1), **plain))[:, -1:]
    except Exception as exc:  # a forward that needs its cache: nothing to compare with
        logger.info("not compared with the model's uncached forward: %s: %s", type(exc).__name__, exc)
        return
    step = _logits(wrapper(nxt, torch.tensor([n]), *layout.past_args(present_k, present_v))[0])
    for what, got, ref in (("the prompt", logits, want), ("the next token", step, want_step)):
        bound = 1e-3 * max(1.0, float(ref.abs().max()))
        err = float((got.float() - ref.float()).abs().max()) if got.shape == ref.shape else float("inf")
        if not err <= bound:
            raise InputError(
                f"{label} computes other logits for {what} with export_llm's fixed-length cache "
                f"than its own forward without a cache (max abs {err:.3g}, bound {bound:.3g}): its "
                "attention sizes a mask or bias by the tokens seen, not by the cache positions",
                hint="export_llm needs a decoder whose mask comes from the cache (transformers' "
                "create_causal_mask); GPT-Neo's local attention bias is sliced by the key length: "
                "export the model as a stateless forward with dx.export",
            )


def _rows_disagree(
    dense: Any,
    prefill: Any,
    rows: Any,
    args: tuple[torch.Tensor, ...],
    layout: Any,
    slots: int | None = None,
) -> str:
    """Why the rows wrapper does not compute the dense one's values on a prefill (``prefill``:
    the dense wrapper's outputs on ``args``) then a decode step ('' when it does), the step
    given the cache's first ``slots`` slots (what a session passes there; None: all). Tolerance:
    float32 round-off of the same ops (the two sum the same keys in another order only through
    the mask's extra columns, which are zeros)."""
    ids = args[0]
    n = ids.shape[1]
    logits_d, present_k, present_v = prefill
    logits_r, new_k, new_v = rows(*args)
    # the slots not written yet hold noise: the rows program must mask them (the dense one
    # overwrites or masks them itself)
    noise = torch.Generator().manual_seed(0)
    written_k = torch.randn(present_k.shape, generator=noise).to(present_k.dtype)
    written_v = torch.randn(present_v.shape, generator=noise).to(present_v.dtype)
    written_k[:, :, :, :n], written_v[:, :, :, :n] = new_k, new_v
    step = (ids[:, -1:], torch.tensor([n]))
    logits_d2, _, _ = dense(*step, *layout.past_args(present_k, present_v))
    logits_r2, _, _ = rows(*step, *layout.past_args(written_k, written_v, slots))
    checks = {
        "prefill logits": (logits_r, logits_d),
        "cache rows": (written_k[:, :, :, :n], present_k[:, :, :, :n]),
        "decode logits": (logits_r2, logits_d2),
    }
    for what, (got, want) in checks.items():
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=1e-4, atol=1e-4):
            return f"computes other {what} than the whole-cache program"
    return ""


def _dry_run(wrapper: nn.Module, args: tuple[torch.Tensor, ...], label: str) -> Any:
    """One eager call of the cache wrapper on the example inputs before the trace (its outputs
    returned): a decoder that cannot run with a fixed-length cache fails here with its own error,
    named as such, and not later as a program that does not run on inputs the user never chose."""
    try:
        return wrapper(*args)
    except DualExportError:
        raise
    except Exception as exc:
        raise InputError(
            f"{label} does not run with export_llm's fixed-length cache (keys and values of "
            f"max_seq_len positions, {args[0].shape[1]} new tokens): {type(exc).__name__}: {exc}",
            hint="export_llm needs a decoder whose attention mask and position bias come from the "
            "cache and cache_position (transformers' create_causal_mask and rotary or learned "
            "positions); a bias sized by the tokens seen so far (Falcon with alibi=True) is not "
            "supported: use dx.export on the model without a cache",
        ) from exc


def _resolve_model(model: nn.Module | str | os.PathLike[str]) -> tuple[nn.Module, str]:
    """Load a referenced decoder and keep its reference as the label the layout probe reports."""
    from .loading import load_decoder

    label = ""
    if isinstance(model, (str, os.PathLike)):
        label = str(model)
        model = load_decoder(model)
    if not isinstance(model, nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module or a reference to one, got {type(model).__name__}",
            hint="pass a transformers causal LM, a config .json, a model folder or MODULE:ATTR",
        )
    return model, label


def _checked_scheme(quantize: Any, optimize: bool) -> Any:
    """The quantization scheme, refused without optimize: the quantization is a dualexport pass."""
    scheme = _scheme(quantize)
    if scheme is not None and not optimize:
        raise InputError(
            f"quantize={quantize!r} with optimize=False: the plain export runs no dualexport pass, "
            "and the weight quantization is one",
            hint="drop optimize=False to quantize, or quantize=None for the plain comparison",
        )
    return scheme


def _decoder_options(options: ExportOptions | None, layout: Any, scheme: Any) -> ExportOptions:
    """Options whose files record the cache layout (and the quantization, at a quantized opset)."""
    from .layout import LAYOUT_KEY

    extra: tuple[tuple[str, str], ...] = ((LAYOUT_KEY, layout.to_json()),)
    if scheme is not None:
        extra += ((QUANTIZE_KEY, scheme.describe()),)
    opts = _with_metadata(options or ExportOptions(), extra)
    if scheme is not None:
        opts = _quantized_opset(opts)
    return opts


def _decoder_transforms(optimize: bool, scheme: Any) -> list[Any]:
    """The decoder's program transforms: canonicalizations when optimizing, then the quantization."""
    from ..shared_state import ProgramTransform
    from .canonical import DECODER_CANONICALIZATIONS

    transforms = (
        [ProgramTransform(f, f"llm:{f.__name__}") for f in DECODER_CANONICALIZATIONS] if optimize else []
    )
    if scheme is not None:
        from .quantize import quantization_transform

        transforms.append(ProgramTransform(quantization_transform(scheme), f"llm:{scheme.describe()}"))
    return transforms


def _scheme(quantize: Any) -> Any:
    if quantize is None:
        return None
    from .quantize import SCHEMES

    if quantize not in SCHEMES:
        raise InputError(
            f"quantize={quantize!r} is not a decoder quantization",
            hint=f"pass quantize=None, {' or '.join(repr(s) for s in SCHEMES)}",
        )
    return SCHEMES[quantize]


def _quantized_opset(options: ExportOptions) -> ExportOptions:
    """Quantized weights are INT4 / blocked DequantizeLinear in the .onnx: opset 21 or later;
    and, unless the options say, ``MatMulNBits`` at accuracy level 4: ONNX Runtime's own int8
    kernel, what onnxruntime-genai's builder writes and its sessions run (2.7x a level-0 linear;
    the .onnx is proven against the program with the kernel's activation quantization)."""

    from ..exporters.onnx_quant import MIN_OPSET

    if options.onnx_int4_accuracy_level is None:
        options = dataclasses.replace(options, onnx_int4_accuracy_level=4)
    if options.onnx_opset is None:
        return dataclasses.replace(options, onnx_opset=MIN_OPSET)
    if options.onnx_opset < MIN_OPSET:
        raise InputError(
            f"quantized decoders need ONNX opset {MIN_OPSET} or later, the options ask for {options.onnx_opset}",
            hint=f"leave onnx_opset unset or pass onnx_opset={MIN_OPSET}",
        )
    return options


def _with_metadata(options: ExportOptions, extra: tuple[tuple[str, str], ...]) -> ExportOptions:

    keys = {k for k, _ in extra}
    kept = tuple((k, v) for k, v in options.file_metadata if k not in keys)
    return dataclasses.replace(options, file_metadata=kept + extra)

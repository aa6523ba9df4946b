"""The .onnx and ``genai_config.json`` that onnxruntime-genai's ``og.Model(folder)`` loads.

onnxruntime-genai (0.18) feeds a decoder by name: ``input_ids [1, S]``, ``position_ids [1, S]``
when the graph declares it (``attention_mask`` likewise; ours does not: the mask comes from the
positions), ``past_key_values.<l>.key/.value [1, Hkv, P, D]`` holding exactly the ``P`` tokens
seen (``P = 0`` at the prompt), and reads ``logits`` and ``present.<l>.key/.value
[1, Hkv, P + S, D]``, which it feeds back as the next past (``past_present_share_buffer: false``).

The proven ``"rows"`` program computes all of that already: its past may hold any number of
slots (a slot from the first position written on is masked), and each layer attends over
``Concat(past, new rows)``, which is the present. So the file is the proven file with its inputs
renamed, ``cache_position`` read from ``position_ids``, each layer's concatenation returned under
the present's name, and the program's new-rows outputs dropped (onnxruntime-genai reads the
presents): a rewrite of names and outputs (onnx-ir), no new arithmetic. For a float program each
layer's attention then becomes ``GroupQueryAttention`` where it computes the same
(genai_attention.py): the past and present are then one buffer of ``T`` slots that
onnxruntime-genai shares (``past_present_share_buffer``).
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ArtifactFormatError
from ..layout import LAYOUT_KEY, LlmLayout

__all__ = [
    "genai_onnx",
    "genai_config",
    "GENAI_CONFIG",
    "past_names",
    "present_names",
    "genai_layout",
    "bake_session_config",
    "genai_names",
    "GenaiNames",
    "GenaiFile",
]

logger = logging.getLogger(__name__)

GENAI_CONFIG = "genai_config.json"
_PAST = ("past_key_values.%d.key", "past_key_values.%d.value")
_PRESENT = ("present.%d.key", "present.%d.value")
#: The ranges metadata key of dualexport's .onnx files (shared_state.contract.RANGES_METADATA).
_RANGES = "dualexport.input_ranges"


def past_names(layers: int) -> list[str]:
    """The cache inputs in the program's order: each layer's keys, then each layer's values."""
    return [_PAST[0] % i for i in range(layers)] + [_PAST[1] % i for i in range(layers)]


def present_names(layers: int) -> list[str]:
    return [_PRESENT[0] % i for i in range(layers)] + [_PRESENT[1] % i for i in range(layers)]


@dataclass(frozen=True)
class GenaiNames:
    """The names onnxruntime-genai binds: from a ``genai_config.json`` or its defaults."""

    input_ids: str
    position_ids: str
    logits: str
    past: tuple[str, ...]  # each layer's keys, then each layer's values
    present: tuple[str, ...]


def genai_names(layers: int, config: Mapping[str, Any] | None = None) -> GenaiNames:
    """What onnxruntime-genai feeds and reads for a decoder of ``layers`` layers: the name
    patterns of ``config`` (a parsed ``genai_config.json``), else onnxruntime-genai's defaults
    (the same as the ones dualexport writes)."""
    decoder = (config or {}).get("model", {}).get("decoder", {})
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    pk, pv = inputs.get("past_key_names", _PAST[0]), inputs.get("past_value_names", _PAST[1])
    ok, ov = outputs.get("present_key_names", _PRESENT[0]), outputs.get("present_value_names", _PRESENT[1])
    return GenaiNames(
        input_ids=inputs.get("input_ids", "input_ids"),
        position_ids=inputs.get("position_ids", "position_ids"),
        logits=outputs.get("logits", "logits"),
        past=tuple([pk % i for i in range(layers)] + [pv % i for i in range(layers)]),
        present=tuple([ok % i for i in range(layers)] + [ov % i for i in range(layers)]),
    )


def genai_layout(layout: LlmLayout) -> LlmLayout:
    """The layout a genai file records: the cache travels as onnxruntime-genai's (exact past in,
    present out), inputs by their new names."""
    import dataclasses

    names = ("input_ids", "position_ids", *past_names(layout.layers))
    return dataclasses.replace(layout, cache="genai", inputs=names, past_step=0)


@dataclass(frozen=True)
class GenaiFile:
    """A written genai .onnx: its files, and whether its attention is ``GroupQueryAttention``
    (which takes onnxruntime-genai's shared past/present buffer of ``T`` slots)."""

    files: tuple[pathlib.Path, ...]
    fused: bool
    #: what its attention is: ``GroupQueryAttention`` or the program's own, and why
    attention: str = ""


def genai_onnx(source: pathlib.Path, dest: pathlib.Path, layout: LlmLayout, fuse: bool = True) -> GenaiFile:
    """Write ``dest`` (and ``<dest>.data`` for its weights) from the proven ``"rows"`` file
    ``source``: see the module docstring; with ``fuse``, each layer's attention as ONNX Runtime's
    ``GroupQueryAttention`` where it computes the same (genai_attention.py)."""
    import numpy as np
    import onnx_ir as ir

    if layout.cache != "rows":
        raise ArtifactFormatError(
            f"{source.name} returns the whole cache ({layout.cache!r}): onnxruntime-genai feeds the "
            "past of the tokens seen and reads it back grown by the new ones",
            hint="this decoder needs the whole-cache program (its attention asks the cache for "
            "more than the new rows); run the .onnx with dx.generate",
        )
    model = ir.load(source)
    graph = model.graph
    inputs = list(graph.inputs)
    layers = layout.layers
    if len(inputs) != 2 + 2 * layers or len(graph.outputs) != 3:
        raise ArtifactFormatError(
            f"{source.name} has {len(inputs)} inputs and {len(graph.outputs)} outputs; a decoder "
            f"of {layers} layers takes {2 + 2 * layers} and returns 3",
            hint="re-export it with dx.export_llm",
        )
    cache_position = inputs[1]
    seq = cache_position.shape[0] if cache_position.shape is not None else "seq"
    position_ids = ir.Value(name="position_ids", type=cache_position.type, shape=ir.Shape([1, seq]))
    flat = ir.Value(name="dx_cache_position", type=cache_position.type, shape=cache_position.shape)
    minus_one = ir.Value(name="dx_flat_shape")
    nodes = [
        ir.node("Constant", [], {"value": ir.tensor(np.array([-1], dtype=np.int64))}, outputs=[minus_one]),
        ir.node("Reshape", [position_ids, minus_one], outputs=[flat]),
    ]
    graph.insert_before(graph[0], nodes)
    cache_position.replace_all_uses_with(flat)
    graph.inputs[1] = position_ids

    pasts, presents = past_names(layers), present_names(layers)
    new_rows = [graph.outputs[1], graph.outputs[2]]
    for i, value in enumerate(inputs[2:]):
        value.name = pasts[i]
        concat = _layer_concat(value)
        if concat is None:  # not found as such: the concatenation of past and new rows, written
            concat = _concat_rows(ir, np, graph, value, new_rows[i // layers], i % layers)
        # the attention's own concatenation is the present, by name: no Identity (a copy of the
        # whole past per layer and step)
        concat.name = presents[i]
        graph.outputs.append(concat)
    graph.outputs[0].name = "logits"
    # the new rows (the program's own outputs 1 and 2): onnxruntime-genai reads the presents
    del graph.outputs[1:3]
    why = ["off"]
    if fuse:
        from .genai_attention import fuse_group_query_attention

        why = fuse_group_query_attention(model, layers, layout.kv_heads, layout.head_dim, layout.max_seq_len)
        if why:
            logger.info("genai .onnx: the program's own attention (%s)", "; ".join(why))
    if why:  # nothing reads the rest of the program's graph past the presents and the logits
        from onnx_ir.passes.common import RemoveUnusedNodesPass

        RemoveUnusedNodesPass()(model)
    record = genai_layout(layout)
    model.metadata_props[LAYOUT_KEY] = record.to_json()
    model.metadata_props[_RANGES] = json.dumps(_ranges(record, model.metadata_props.get(_RANGES)))
    data = dest.with_name(dest.name + ".data")
    ir.save(model, dest, external_data=data.name, size_threshold_bytes=1024)
    files = (dest, data) if data.is_file() else (dest,)
    attention = "com.microsoft::GroupQueryAttention" if not why else "the program's own: " + "; ".join(why)
    return GenaiFile(files, fused=not why, attention=attention)


def bake_session_config(source: pathlib.Path, dest: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """Write ``source`` to ``dest`` with what its session entries decide made part of the graph.

    Why: a quantized file records the session entry it is proven with
    (``session.qdq_matmulnbits_accuracy_level``: the accuracy of the ``MatMulNBits`` ONNX Runtime
    fuses at load), and dualexport's runner applies it; onnxruntime-genai's config has no place
    for session entries, so its session would fuse at ONNX Runtime's default (level 4: other
    numerics). So ONNX Runtime itself writes the graph it fuses with those entries (level
    EXTENDED: the fusions, nothing tied to this machine's instruction set), ``MatMulNBits``
    nodes carrying their accuracy level. Constant folding stays off: it would store the int8
    head's dequantized float32 copy (4x its bytes) in the file; the session folds it at load, as
    it does for the proven file. A file without session entries is copied as it is."""
    import shutil

    import onnxruntime as ort

    from ...runtimes.ort import SESSION_CONFIG_KEY

    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    entries = json.loads(session.get_modelmeta().custom_metadata_map.get(SESSION_CONFIG_KEY, "{}"))
    del session
    data = dest.with_name(dest.name + ".data")
    if not entries:
        shutil.copyfile(source, dest)
        src_data = source.with_name(source.name + ".data")
        if src_data.is_file():
            shutil.copyfile(src_data, data)
        return (dest, data) if data.is_file() else (dest,)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.log_severity_level = 3
    for key, value in entries.items():
        opts.add_session_config_entry(str(key), str(value))
    opts.optimized_model_filepath = str(dest)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", data.name)
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(
        str(source), opts, providers=["CPUExecutionProvider"], disabled_optimizers=["ConstantFolding"]
    )
    return (dest, data) if data.is_file() else (dest,)


def _layer_concat(past: Any) -> Any:
    """The value ``Concat(past, new, axis=2)`` a layer attends over, if the graph has it."""
    for node, index in past.uses():
        if node.op_type != "Concat" or index != 0 or len(node.inputs) != 2:
            continue
        axis = node.attributes.get("axis")
        if axis is not None and axis.as_int() in (2, -2):
            return node.outputs[0]
    return None


def _concat_rows(ir: Any, np: Any, graph: Any, past: Any, rows: Any, layer: int) -> Any:
    """``Concat(past, rows[layer], axis=2)`` appended to ``graph`` (``rows``: ``[L, 1, Hkv, S, D]``)."""
    index = ir.Value(name=f"dx_layer_{past.name}")
    picked = ir.Value(name=f"dx_rows_{past.name}")
    joined = ir.Value(name=f"dx_present_{past.name}")
    graph.extend(
        [
            ir.node("Constant", [], {"value": ir.tensor(np.array(layer, dtype=np.int64))}, outputs=[index]),
            ir.node("Gather", [rows, index], {"axis": 0}, outputs=[picked]),
            ir.node("Concat", [past, picked], {"axis": 2}, outputs=[joined]),
        ]
    )
    return joined


def _ranges(layout: LlmLayout, recorded: str | None) -> list[dict[str, Any]]:
    """The ranges the genai file takes: ``S`` as the program's, the past from 0 to ``T``."""
    specs: list[dict[str, Any]] = json.loads(recorded) if recorded else []
    if len(specs) != 2 + 2 * layout.layers:
        return specs
    seq = specs[0]["dims"][1]
    specs[1] = {"dtype": specs[1]["dtype"], "dims": [1, seq]}
    for spec in specs[2:]:  # the tokens seen, or all T slots of a shared buffer
        spec["dims"][2] = [0, layout.max_seq_len]
    return specs


def genai_config(
    layout: LlmLayout,
    *,
    filename: str,
    model_config: Any = None,
    bos_token_id: int | None = None,
    eos_token_ids: tuple[int, ...] = (),
    pad_token_id: int | None = None,
    share_buffer: bool = False,
) -> dict[str, Any]:
    """``genai_config.json`` for the file: the generic decoder-only type (``"llama"``: standard
    I/O names, no model-specific inputs), head counts and sizes, the context, greedy search
    defaults, and the special ids. ``share_buffer``: the file's attention takes the past as one
    buffer of ``T`` slots and writes the new rows into it (``GroupQueryAttention``), so
    onnxruntime-genai binds one buffer as past and present and copies nothing per step."""
    heads = _config_int(model_config, "num_attention_heads", layout.kv_heads)
    hidden = _config_int(model_config, "hidden_size", heads * layout.head_dim)
    eos = list(eos_token_ids or layout.eos_token_ids)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    decoder: dict[str, Any] = {
        "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
        "filename": filename,
        "head_size": layout.head_dim,
        "hidden_size": hidden,
        "inputs": {
            "input_ids": "input_ids",
            "position_ids": "position_ids",
            "past_key_names": _PAST[0],
            "past_value_names": _PAST[1],
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": _PRESENT[0],
            "present_value_names": _PRESENT[1],
        },
        "num_attention_heads": heads,
        "num_hidden_layers": layout.layers,
        "num_key_value_heads": layout.kv_heads,
    }
    model: dict[str, Any] = {
        "bos_token_id": int(bos_token_id) if bos_token_id is not None else pad,
        "context_length": layout.max_seq_len,
        "decoder": decoder,
        "eos_token_id": eos if len(eos) != 1 else eos[0],
        "pad_token_id": int(pad),
        "type": "llama",
        "vocab_size": layout.vocab,
    }
    search = {
        "diversity_penalty": 0.0,
        "do_sample": False,
        "early_stopping": True,
        "length_penalty": 1.0,
        "max_length": layout.max_seq_len,
        "min_length": 0,
        "no_repeat_ngram_size": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share_buffer,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    return {"model": model, "search": search}


def _config_int(config: Any, key: str, default: int) -> int:
    if config is None:
        return default
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, key, None)
    return int(value) if isinstance(value, int) else default


def write_config(path: pathlib.Path, config: Mapping[str, Any]) -> pathlib.Path:
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path

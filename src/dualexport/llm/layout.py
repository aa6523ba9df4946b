"""The cache layout of an exported decoder: what ``generate`` needs to drive a file, written into the
file itself (ONNX ``metadata_props``, a .pte constant method) and read back from it.

Why in the file: a .onnx or .pte handed to someone else must say how to feed it (how many
layers, heads, slots, which input is which) without the Python object that made it.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import ArtifactFormatError

__all__ = [
    "LlmLayout",
    "LAYOUT_KEY",
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "ROWS_OUTPUT_NAMES",
    "CACHE_KINDS",
    "PAST_INPUTS",
    "input_names",
    "read_layout",
]

#: The key of the layout: ONNX ``metadata_props[LAYOUT_KEY]`` and the .pte constant method of that
#: name (returning the JSON's UTF-8 bytes as ints: a constant method returns numbers only).
LAYOUT_KEY = "dualexport_llm"
#: The wrapper's inputs and outputs, in order (the ONNX graph's names, the .pte's positions):
#: ``past_0 .. past_{L-1}`` are the layers' keys and ``past_L .. past_{2L-1}`` their values
#: (:func:`input_names`); files of layout version 2 took the whole cache as ``past_k``, ``past_v``.
INPUT_NAMES = ("input_ids", "cache_position", "past_k", "past_v")
OUTPUT_NAMES = ("logits", "present_k", "present_v")
#: The outputs of a ``"rows"`` program: the new rows, which the caller writes at cache_position.
ROWS_OUTPUT_NAMES = ("logits", "new_k", "new_v")
#: How the cache travels: the whole cache in and out ("explicit"), or the whole cache in and the
#: new rows out ("rows", version 2); in a deploy folder (llm/deploy/): kept inside the program in
#: mutable buffers, the .pte ExecuTorch's LLM runner loads ("buffers"), or the past of the tokens
#: seen in and the present out, onnxruntime-genai's protocol ("genai").
CACHE_KINDS = ("explicit", "rows", "buffers", "genai")
#: How the cache goes in: one ``[L, 1, Hkv, T, D]`` tensor each for keys and values (``"stacked"``,
#: versions 1-2), or one ``[1, Hkv, P, D]`` tensor per layer (``"layers"``, version 3).
PAST_INPUTS = ("stacked", "layers")
_VERSION = 3


def input_names(layers: int) -> tuple[str, ...]:
    """The inputs of a version-3 program of ``layers`` layers (the names torch.export gives the
    wrapper's ``*past``)."""
    return ("input_ids", "cache_position", *(f"past_{i}" for i in range(2 * layers)))


@dataclass(frozen=True)
class LlmLayout:
    """The cache is ``[layers, 1, kv_heads, max_seq_len, head_dim]`` for keys (``v_head_dim`` for
    values), slot ``p`` holding position ``p``; ``input_ids[1, S]`` and ``cache_position[S]``
    with ``1 <= S <= max_seq_len - 1``; logits ``[1, S, vocab]``. ``past_inputs``: how the cache
    goes in (one of :data:`PAST_INPUTS`; ``"layers"``: each layer's ``[1, kv_heads, P, D]``, keys
    then values, so a step reads no other layer's slots). ``cache``: ``"explicit"`` returns the
    updated cache, ``"rows"`` the new rows ``[layers, 1, kv_heads, S, head_dim]`` for the caller
    to write at ``cache_position``."""

    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    max_seq_len: int
    vocab: int
    dtype: str  # the cache's dtype, e.g. "float32"
    sliding: tuple[bool, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    model: str = ""
    inputs: tuple[str, ...] = INPUT_NAMES
    outputs: tuple[str, ...] = OUTPUT_NAMES
    cache: str = "explicit"  # how the cache travels: one of CACHE_KINDS
    version: int = field(default=_VERSION)
    past_inputs: str = "layers"  # how the cache goes in: one of PAST_INPUTS
    #: ``"rows"`` only: > 0 when the program takes the cache's first ``P`` slots, ``P`` the
    #: position rounded up to a multiple of this (at least this, at most ``max_seq_len``), so a
    #: step reads the positions used rather than all ``max_seq_len`` slots; 0: all slots. A reader
    #: that ignores it passes all slots, which the program also takes (``P = max_seq_len``).
    past_step: int = 0
    #: the file returns each call's last position's logits only (``[1, 1, vocab]``): ExecuTorch's
    #: LLM runner reads no other row (``"buffers"`` files)
    last_logits: bool = False

    def past_length(self, position: int) -> int:
        """How many cache slots a call at ``position`` passes (see ``past_step``)."""
        t, step = self.max_seq_len, self.past_step
        if step <= 0:
            return t
        return min(t, max(step, -(-position // step) * step))

    def with_cache(self, kind: str) -> LlmLayout:
        """This layout for a program whose cache travels as ``kind`` (one of :data:`CACHE_KINDS`)."""
        if kind not in CACHE_KINDS:
            raise ValueError(f"cache kind {kind!r} is not one of {CACHE_KINDS}")
        outputs = ROWS_OUTPUT_NAMES if kind == "rows" else OUTPUT_NAMES
        step = self.past_step if kind == "rows" else 0
        return replace(
            self,
            cache=kind,
            outputs=outputs,
            inputs=input_names(self.layers),
            past_inputs="layers",
            version=_VERSION,
            past_step=step,
        )

    def with_past_step(self, step: int) -> LlmLayout:
        """This layout with the cache passed by prefixes of ``step`` slots (0: all slots)."""
        return replace(self, past_step=max(0, int(step)))

    @property
    def max_prompt(self) -> int:
        """The longest prefill the program takes in one call."""
        return self.max_seq_len - 1

    def cache_shape(self, values: bool = False) -> tuple[int, int, int, int, int]:
        return (self.layers, 1, self.kv_heads, self.max_seq_len, self.v_head_dim if values else self.head_dim)

    def past_args(self, past_k: Any, past_v: Any, slots: int | None = None) -> list[Any]:
        """The program's cache inputs from the whole cache (``[L, 1, Hkv, T, D]`` each): the two
        tensors (``"stacked"``), or each layer's keys then each layer's values, their first
        ``slots`` slots (views: no copy here)."""
        if self.past_inputs == "stacked":
            return [past_k, past_v]
        n = self.max_seq_len if slots is None else slots
        return [past_k[i, :, :, :n] for i in range(self.layers)] + [
            past_v[i, :, :, :n] for i in range(self.layers)
        ]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "the file") -> LlmLayout:
        try:
            data: Mapping[str, Any] = json.loads(text)
            fields: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v
                for k, v in data.items()
                if k in cls.__dataclass_fields__
            }
            if int(fields.get("version", 1)) < 3:  # before per-layer inputs
                fields.setdefault("past_inputs", "stacked")
            layout = cls(**fields)
        except (ValueError, TypeError) as exc:
            raise ArtifactFormatError(
                f"{source} has an unreadable decoder layout: {exc}",
                hint="re-export it with dx.export_llm",
            ) from exc
        if (
            layout.version > _VERSION
            or layout.cache not in CACHE_KINDS
            or layout.past_inputs not in PAST_INPUTS
        ):
            raise ArtifactFormatError(
                f"{source} was written by a newer dualexport (layout version {layout.version}, "
                f"cache {layout.cache!r})",
                hint="upgrade dualexport",
            )
        return layout

    def to_method(self) -> list[int]:
        """The JSON as the list of byte values a .pte constant method returns."""
        return list(self.to_json().encode())


def read_layout(path: pathlib.Path, runner: Any = None) -> LlmLayout:
    """The layout recorded in ``path`` (a .onnx or .pte written by ``export_llm``); ``runner`` is
    an already open runner of the file, whose metadata is read instead of opening it again."""
    path = pathlib.Path(path)
    text: str | None = None
    if path.suffix == ".onnx":
        if runner is not None:
            text = runner.session.get_modelmeta().custom_metadata_map.get(LAYOUT_KEY)
        else:
            import onnx

            model = onnx.load(str(path), load_external_data=False)
            text = next((p.value for p in model.metadata_props if p.key == LAYOUT_KEY), None)
    elif path.suffix == ".pte":
        from executorch.runtime import Runtime

        program = Runtime.get().load_program(str(path))
        if LAYOUT_KEY in set(program.method_names):
            text = bytes(int(v) for v in program.load_method(LAYOUT_KEY).execute([])).decode()
    else:
        raise ArtifactFormatError(
            f"{path.name} is neither .onnx nor .pte", hint="pass the .onnx or .pte that export_llm wrote"
        )
    if text is None:
        raise ArtifactFormatError(
            f"{path.name} records no decoder layout: it was not written by dx.export_llm",
            hint="export the model with dx.export_llm (or `dualexport export-llm`)",
        )
    return LlmLayout.from_json(text, path.name)

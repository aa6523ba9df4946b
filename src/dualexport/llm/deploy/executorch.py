"""The .pte that ExecuTorch's own LLM runner loads: ``forward(input_ids[1,S], cache_position[S])
-> logits[1,S,V]`` with each layer's keys and values in mutable buffers, and the constant methods
its runner reads first.

Why this signature: ``TextLLMRunner`` (``extension/llm/runner/`` in ExecuTorch 1.4.1, the runner
of the Android and iOS apps and ``llama_main``) calls ``forward(tokens, positions)`` and, when the
second input's planned size is above one, passes every position ``start..start+S-1``, which is the
shared program's own ``cache_position``. It reads one output (the logits) and keeps no cache of
its own, so the cache lives in the program.

Why a wrapper around the shared program and not a second trace of the model: the wrapper calls
``exported_program.module()`` (the one trace, its parameters the holder's tensors), hands it the
buffers as the cache (all ``T`` slots: the largest past the program declares, and the slots from
the first position written on are masked there) and writes the new rows back at
``cache_position`` in place. Capturing that wrapper is the target's pass: the graph is the shared
program's, plus the reads and writes of the buffers.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from ...compat.torch import backed_size_oblivious
from ...errors import XnnpackLoweringError
from ..layout import LlmLayout

__all__ = [
    "CacheInBuffers",
    "runner_program",
    "runner_methods",
    "lower_runner_pte",
    "RUNNER_METHODS",
    "FUSED_ATTENTION",
]

logger = logging.getLogger(__name__)

#: The runner .pte's attention when it is ExecuTorch's LLM ops (cached_attention.py).
FUSED_ATTENTION = "llama::update_cache + llama::custom_sdpa"

#: The constant methods ExecuTorch's text runner reads (extension/llm/runner/constants.h, 1.4.1):
#: ``get_max_seq_len`` is required; the BOS id and the vocabulary size it takes from the
#: tokenizer, the rest from here.
RUNNER_METHODS = (
    "get_max_seq_len",
    "get_max_context_len",
    "use_kv_cache",
    "use_sdpa_with_kv_cache",
    "enable_dynamic_shape",
    "get_bos_id",
    "get_eos_ids",
    "get_vocab_size",
)


class CacheInBuffers(nn.Module):
    """The shared program with its cache kept inside: ``k_cache_<i>``/``v_cache_<i>``
    ``[1, Hkv, T, D]`` buffers (not persistent: they are state, not weights), read whole as the
    program's past and written at ``cache_position`` after each call (``"rows"`` programs return
    the new rows; whole-cache programs the updated cache)."""

    def __init__(self, program: ExportedProgram, layout: LlmLayout, fuse: bool = True) -> None:
        super().__init__()
        # the fused graph takes the caches in another layout than the program's past inputs: no
        # guards of the program's input shapes (they restate its ranges, which its proof covers)
        module: Any = program.module(check_guards=not fuse)
        self.program = module
        self.layers = layout.layers
        self.rows = layout.cache == "rows"
        #: each layer's attention is ExecuTorch's update_cache + custom_sdpa on [1, T, Hkv, D]
        #: caches (cached_attention.py); else the program's own over the whole [1, Hkv, T, D] cache
        self.fused = False
        self.unfused_because: list[str] = ["off"] if not fuse else []
        if fuse and self.rows:
            from ...compat.executorch import load_llm_ops
            from .cached_attention import fuse_cached_attention

            load_llm_ops()
            pasts = [n.name for n in self.program.graph.nodes if n.op == "placeholder"][2:]
            self.fused, self.unfused_because = fuse_cached_attention(module, pasts, layout.layers)
            if not self.fused:  # a fresh copy: a fusion given up half-way leaves its copy unusable
                module = program.module(check_guards=False)
                self.program = module
            module.validate_inputs = not self.fused
        elif fuse:
            self.unfused_because = ["the program returns the whole cache, not the new rows"]
        if not self.fused:
            logger.info("runner .pte: the program's own attention (%s)", "; ".join(self.unfused_because))
        from .last_logits import last_position_logits

        why_all = last_position_logits(self.program)
        #: the logits of each call's last position only ([1, 1, V]), what ExecuTorch's runner reads
        self.last_logits: bool = why_all is None
        if why_all is not None:
            logger.info("runner .pte: logits at every position (%s)", why_all)
        dtype = getattr(torch, layout.dtype)
        t = layout.max_seq_len
        for i in range(layout.layers):
            k_shape = (
                (1, t, layout.kv_heads, layout.head_dim)
                if self.fused
                else (1, layout.kv_heads, t, layout.head_dim)
            )
            v_shape = (
                (1, t, layout.kv_heads, layout.v_head_dim)
                if self.fused
                else (1, layout.kv_heads, t, layout.v_head_dim)
            )
            self.register_buffer(f"k_cache_{i}", torch.zeros(k_shape, dtype=dtype), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(v_shape, dtype=dtype), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        keys = [getattr(self, f"k_cache_{i}") for i in range(self.layers)]
        values = [getattr(self, f"v_cache_{i}") for i in range(self.layers)]
        logits, new_k, new_v = self.program(input_ids, cache_position, *keys, *values)
        if self.fused:  # the attention wrote its rows
            return logits
        for i in range(self.layers):
            if self.rows:
                keys[i].index_copy_(2, cache_position, new_k[i])
                values[i].index_copy_(2, cache_position, new_v[i])
            else:
                keys[i].copy_(new_k[i])
                values[i].copy_(new_v[i])
        return logits


def runner_program(
    program: ExportedProgram, layout: LlmLayout, fuse: bool = True
) -> tuple[ExportedProgram, LlmLayout, str]:
    """Capture :class:`CacheInBuffers` over ``program`` with ``S`` in ``1..T-1`` (prefill and
    decode), as the shared program declares it. Its parameters are the holder's tensors. Also
    returns the layout the file records and its attention: ExecuTorch's LLM ops (``fuse``, where
    they compute it) or why not."""
    wrapper = CacheInBuffers(program, layout, fuse=fuse)
    seq = torch.export.Dim("seq", min=1, max=layout.max_prompt)
    n = min(4, layout.max_prompt)
    args = (torch.zeros(1, n, dtype=torch.long), torch.arange(n, dtype=torch.long))
    # The program's own ops are traced again: a size question its kernels ask (the experts of a
    # mixture sort tokens into groups: min(256 + 8 S, 512 + 16 S)) must not become a guard that
    # narrows S; the shared program already holds for the whole range.
    with torch.no_grad(), backed_size_oblivious():
        captured = torch.export.export(
            wrapper,
            args,
            dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}},
            strict=False,
            prefer_deferred_runtime_asserts_over_guards=True,
        )
    _drop_runtime_asserts(captured)
    record = dataclasses.replace(
        layout,
        cache="buffers",
        inputs=("input_ids", "cache_position"),
        outputs=("logits",),
        last_logits=wrapper.last_logits,
    )
    if wrapper.fused:
        return captured, record, FUSED_ATTENTION
    return captured, record, "the program's own: " + "; ".join(wrapper.unfused_because)


def _with_layout(options: Any, layout: LlmLayout) -> Any:
    """``options`` whose file metadata records ``layout`` (in place of the program's)."""
    from ..layout import LAYOUT_KEY

    kept = tuple((k, v) for k, v in options.file_metadata if k != LAYOUT_KEY)
    return dataclasses.replace(options, file_metadata=kept + ((LAYOUT_KEY, layout.to_json()),))


def _drop_runtime_asserts(program: ExportedProgram) -> None:
    """Remove the runtime asserts the capture deferred (and the size arithmetic only they read):
    each restates a fact of the shared program's own range, which its proof covers, and
    ExecuTorch's edge verifier refuses the symbolic ops they are made of."""
    from ...shared_state.fingerprint import find_shape_env

    env = find_shape_env(program)
    if env is not None:  # the program's shape env: decompositions re-insert its asserts
        env.deferred_runtime_asserts.clear()
    graph = program.graph
    asserts = [
        n
        for n in graph.nodes
        if n.op == "call_function" and n.target is torch.ops.aten._assert_scalar.default
    ]
    for node in asserts:
        graph.erase_node(node)
    if asserts:
        graph.eliminate_dead_code()
        program.graph_module.recompile()


def _check_mutations(decomposed: ExportedProgram, layout: LlmLayout) -> None:
    """Each cache buffer must be written back (a functional program lists it as mutated: the
    capture keeps ``index_copy_`` in place, the decomposition makes it a mutation)."""
    written = set(decomposed.graph_signature.buffers_to_mutate.values())
    want = {f"{kv}_cache_{i}" for kv in "kv" for i in range(layout.layers)}
    if not want <= written:
        raise XnnpackLoweringError(
            f"the runner program does not write back the cache buffers {sorted(want - written)}",
            target="xnnpack",
            hint="report the model: its cache update did not become a buffer mutation",
        )


def runner_methods(layout: LlmLayout, bos_id: int | None, eos_ids: tuple[int, ...]) -> dict[str, Any]:
    """The constant methods of :data:`RUNNER_METHODS` but ``use_sdpa_with_kv_cache`` (set by
    :func:`lower_runner_pte`, which knows the attention): the context is the cache's ``T`` slots,
    the longest call ``T`` too (the runner treats a shorter one as a ring buffer and stops
    counting positions; the program takes ``S <= T-1``, and the runner refuses a prompt that
    leaves no room, so no call reaches ``T``)."""
    eos = list(eos_ids or layout.eos_token_ids)
    methods: dict[str, Any] = {
        "get_max_seq_len": layout.max_seq_len,
        "get_max_context_len": layout.max_seq_len,
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
        "get_vocab_size": layout.vocab,
    }
    if bos_id is not None:
        methods["get_bos_id"] = int(bos_id)
    if eos:
        methods["get_eos_ids"] = [int(e) for e in eos]
    return methods


def lower_runner_pte(
    program: ExportedProgram,
    layout: LlmLayout,
    staging: pathlib.Path,
    name: str,
    options: Any,
    methods: Mapping[str, Any],
    fuse: bool = True,
) -> tuple[Any, str, ExportedProgram]:
    """Capture the runner program, decompose it as the XNNPACK target does (its pipeline of
    rewrites included) and lower it with the runner's constant methods; the file is
    ``staging/<name>.pte`` (and ``<name>.ptd`` when the weights go to a data file). Returns the
    target's ``LoweredTarget``, the attention it computes (``fuse``: ExecuTorch's LLM ops
    where they compute the program's) and the decomposed program it was lowered from."""
    from ...exporters.xnnpack import XnnpackExporter

    exporter = XnnpackExporter()
    captured, record, attention = runner_program(program, layout, fuse=fuse)
    options = _with_layout(options, record)
    decomposed = exporter.decompose(captured, options)
    del captured
    _drop_runtime_asserts(decomposed)  # the decomposition may re-insert them from its shape env
    _check_mutations(decomposed, layout)
    from ...runtimes.executorch import LLM_OPS_METHOD  # "use_sdpa_with_kv_cache": set here alone

    methods = {**methods, LLM_OPS_METHOD: attention == FUSED_ATTENTION}
    return exporter.lower(decomposed, staging, name, options, methods=methods), attention, decomposed

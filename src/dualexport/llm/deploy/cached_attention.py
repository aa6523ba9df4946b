"""The runner .pte's attention as ExecuTorch's own LLM ops: each layer's new keys and values
written into its cache by ``llama::update_cache``, and attention over the cache's first
``start + S`` positions by ``llama::custom_sdpa`` (``executorch.extension.llm.custom_ops``, the ops
ExecuTorch's own LLM export and optimum-executorch use).

Why: the shared program attends over ``concat(past, new)``. Fed the whole cache (``T`` slots, what
keeps the XNNPACK delegate's shapes fixed from one decode step to the next), that is a copy of the
whole cache and a product over all ``T`` keys per layer and token, most of them masked. With these
ops the delegate's shapes stay fixed, nothing is copied but the new rows, and each token reads only
the positions written so far. (A past narrowed to the positions written, ``cache[:start]``, changes
the delegate's shapes every step: XNNPACK re-plans its whole runtime per token, half the speed.)

How: a pass on the target's copy of the program's graph (``exported_program.module()``, whose
parameters stay the holder's tensors), matching the attention :func:`dualexport.llm.attention.dualexport_attention`
writes: ``bmm(q, concat(past_k, k)^T) * scale + mask``, ``softmax``, ``bmm(., concat(past_v, v))``,
the heads back to ``[1, S, H, D]``. It is taken only where it is exactly what ``custom_sdpa``
computes: a causal mask (the model's mask function is ``kv <= q``, no window, no chunks), no
soft-capping, keys and values of one head size. Anything else keeps the program's own attention,
over the whole cache; the deploy proof holds either form to the shared program.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import torch
from torch import fx

__all__ = ["CachedAttention", "match_cached_attention", "fuse_cached_attention", "cached_attention"]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
#: ops that only carry a value along (dtype casts to the same dtype, the export's metadata asserts)
_PASS_THROUGH = {_aten.to.dtype, _aten.to.dtype_layout, _aten.clone.default, _aten.alias.default}


@dataclasses.dataclass(frozen=True)
class CachedAttention:
    """One layer's attention in the program's graph: the nodes the fused form reads and the node
    whose value it replaces."""

    layer_k: int  # index of the past key input (``past_<i>``)
    layer_v: int
    query: fx.Node  # [1, H, S, D], after the rotary embedding
    key: fx.Node  # [1, Hkv, S, D], the new rows
    value: fx.Node
    scale: float
    output: fx.Node  # [1, S, H, D]


def _through(node: Any) -> Any:
    """``node`` with the value-carrying ops in front of it skipped (backwards)."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _PASS_THROUGH:
        node = node.args[0]
    return node


def _only_user(node: fx.Node) -> fx.Node | None:
    """The one real user of ``node`` (metadata asserts aside), through value-carrying ops."""
    while True:
        users = [u for u in node.users if u.target is not _aten._assert_tensor_metadata.default]
        if len(users) != 1:
            return None
        user = users[0]
        if user.op == "call_function" and user.target in _PASS_THROUGH:
            node = user
            continue
        return user


def _is(node: Any, *targets: Any) -> TypeGuard[fx.Node]:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _past_concat(node: Any, pasts: dict[str, int]) -> tuple[int, fx.Node] | None:
    """``reshape(concat([past_i, new], 2))`` -> (i, new)."""
    node = _through(node)
    if _is(node, _aten.reshape.default, _aten.view.default):
        node = _through(node.args[0])
    if not _is(node, _aten.cat.default):
        return None
    parts: Any = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else 0
    if len(parts) != 2 or dim not in (2, -2):
        return None
    past, new = parts
    if not (isinstance(past, fx.Node) and past.op == "placeholder" and past.name in pasts):
        return None
    return pasts[past.name], new


def _causal_allowed(node: Any) -> bool:
    """``node`` is ``(allowed - 1) * max`` (or its rows stacked for the query heads of a group)
    with ``allowed = (kv_position <= q_position)``: transformers' causal mask function alone."""
    node = _through(node)
    parts: Any = node.args[0] if _is(node, _aten.cat.default) else [node]
    for part in parts:
        part = _through(part)
        if not _is(part, _aten.mul.Tensor) or not _is(part.args[0], _aten.sub.Tensor):
            return False
        allowed = _through(part.args[0].args[0])
        if not _is(allowed, _aten.le.Tensor):
            return False
    return bool(parts)


def match_cached_attention(graph: fx.Graph, pasts: Sequence[str]) -> tuple[list[CachedAttention], list[str]]:
    """Every attention of ``graph`` that reads a past input whole and that ``custom_sdpa``
    computes exactly; and why each other ``bmm`` over a past was not taken (the ``check`` of a
    rewriter rule)."""
    index = {name: i for i, name in enumerate(pasts)}
    found: list[CachedAttention] = []
    refused: list[str] = []
    for node in graph.nodes:
        if not _is(node, _aten.bmm.default):
            continue
        keys = node.args[1]
        if not _is(keys, _aten.transpose.int):
            continue
        k = _past_concat(keys.args[0], index)
        if k is None:
            continue
        why, match = _match_layer(node, k, index)
        if match is None:
            refused.append(f"{node.name}: {why}")
        else:
            found.append(match)
    return found, refused


def _match_layer(
    scores: fx.Node, k: tuple[int, fx.Node], index: dict[str, int]
) -> tuple[str, CachedAttention | None]:
    query = _through(scores.args[0])
    if _is(query, _aten.reshape.default, _aten.view.default):
        query = _through(query.args[0])
    qval, kval = query.meta.get("val"), k[1].meta.get("val")
    if qval is None or kval is None or qval.dim() != 4 or kval.dim() != 4:
        return "the query or the new keys are not [1, heads, S, D]", None
    scaled = _only_user(scores)
    if not _is(scaled, _aten.mul.Tensor) or not isinstance(scaled.args[1], float):
        return "the scores are not scaled by a constant", None
    masked = _only_user(scaled)
    if not _is(masked, _aten.add.Tensor):
        return "no additive mask after the scaling (soft-capping or another form)", None
    if not _causal_allowed(masked.args[1]):
        return "the mask is not the causal mask alone (a window, chunks or padding)", None
    soft = _only_user(masked)
    if not _is(soft, _aten.softmax.int, _aten._softmax.default):
        return "no softmax over the masked scores", None
    out = _only_user(soft)
    if not _is(out, _aten.bmm.default) or out.args[0] is not _only_user_source(soft, out):
        return "the weights are not multiplied by the values", None
    v = _past_concat(out.args[1], index)
    if v is None:
        return "the values are not the past values and the new ones", None
    # [Hkv, rep * S, Dv] -> [Hkv, rep, S, Dv] -> [S, Hkv, rep, Dv] -> [1, S, H, Dv]
    split = _only_user(out)
    permute = _only_user(split) if _is(split, _aten.reshape.default, _aten.view.default) else None
    if not _is(permute, _aten.permute.default) or list(permute.args[1]) != [2, 0, 1, 3]:  # type: ignore[arg-type]
        return "the output heads are not laid out as [1, S, H, D]", None
    final = _only_user(permute)
    if not _is(final, _aten.reshape.default, _aten.view.default):
        return "the output heads are not laid out as [1, S, H, D]", None
    fval, vval = final.meta.get("val"), v[1].meta.get("val")
    if fval is None or vval is None or fval.dim() != 4 or vval.shape[-1] != kval.shape[-1]:
        return "keys and values of different head sizes (custom_sdpa takes one)", None
    return "", CachedAttention(k[0], v[0], query, k[1], v[1], float(scaled.args[1]), final)


def _only_user_source(soft: fx.Node, out: fx.Node) -> Any:
    """The node through which ``out`` reads ``soft`` (a cast between them is allowed)."""
    arg = out.args[0]
    return arg if _through(arg) is soft else None


def cached_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cache_position: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``query [1, H, S, D]``, new ``key``/``value [1, Hkv, S, D]``, caches ``[1, T, Hkv, D]``:
    write the new rows at ``cache_position[0]``, attend causally over the first ``start + S``
    positions; ``[1, S, H, D]``."""
    from ...compat.torch import check_fact

    start = cache_position[0].item()
    check_fact(start >= 0)
    check_fact(start < key_cache.shape[1])
    check_fact(start + query.shape[2] <= key_cache.shape[1])
    torch.ops.llama.update_cache(key.transpose(1, 2).contiguous(), key_cache, start)
    torch.ops.llama.update_cache(value.transpose(1, 2).contiguous(), value_cache, start)
    q = query.transpose(1, 2).contiguous()
    return torch.ops.llama.custom_sdpa(q, key_cache, value_cache, start, None, 0.0, True, scale)


def fuse_cached_attention(
    module: fx.GraphModule, pasts: Sequence[str], layers: int
) -> tuple[bool, list[str]]:
    """Rewrite ``module`` (a copy of the program's graph) so that every layer's attention is
    :func:`cached_attention` over its past inputs, which then take the caches ``[1, T, Hkv, D]``.
    All layers or none: returns (whether it did, why not). When not, the graph is unchanged,
    except after a fusion that left another reader of a past input: then it is unusable."""
    graph = module.graph
    found, refused = match_cached_attention(graph, pasts)
    keys = sorted(m.layer_k for m in found)
    values = sorted(m.layer_v for m in found)
    if refused or keys != list(range(layers)) or values != list(range(layers, 2 * layers)):
        why = refused or [f"{len(found)} of {layers} layers' attention matched"]
        return False, why
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    cache_position = placeholders.get("cache_position")
    if cache_position is None:
        return False, ["the program has no cache_position input"]
    for m in found:
        with graph.inserting_before(m.output):
            fused = graph.call_function(
                cached_attention,
                (
                    m.query,
                    m.key,
                    m.value,
                    placeholders[pasts[m.layer_k]],
                    placeholders[pasts[m.layer_v]],
                    cache_position,
                    m.scale,
                ),
            )
        fused.meta = dict(m.output.meta)
        m.output.replace_all_uses_with(fused)
    _erase_dead(graph)
    stray = _past_readers(graph, placeholders, pasts)
    if stray:  # the module is a copy, now unusable: the caller makes another
        return False, [f"after fusing, the past inputs are still read by {', '.join(stray[:4])}"]
    module.recompile()
    return True, []


def _erase_dead(graph: fx.Graph) -> None:
    """Dead code removal that also drops the metadata asserts of dead values."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if node.op in ("placeholder", "output") or node.users:
                continue
            if node.op == "call_function" and node.target is _aten._assert_tensor_metadata.default:
                source = node.args[0]
                if isinstance(source, fx.Node) and len(source.users) == 1:
                    graph.erase_node(node)
                    changed = True
                continue
            if node.op == "call_function" and node.target is cached_attention:
                continue
            if node.is_impure() and node.target is not operator.getitem:
                continue
            graph.erase_node(node)
            changed = True


def _past_readers(graph: fx.Graph, placeholders: dict[str, fx.Node], pasts: Sequence[str]) -> list[str]:
    keep: Callable[[fx.Node], bool] = lambda u: u.op == "call_function" and u.target is cached_attention  # noqa: E731
    return [f"{u.name} ({u.target})" for p in pasts for u in placeholders[p].users if not keep(u)]

"""transformers models traced as deployed (shared_state/hf_trace.py).

Mixture-of-experts decoders as transformers builds them (its default experts kernel,
``grouped_mm``, which on a CPU float32 model is the custom op ``transformers::grouped_mm_fallback``
fed by a ``histc``): both targets from one trace, parity against the user's eager model on its own
kernel, the experts' stacked weights proven in both files, and the user's setting untouched."""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dualexport as dx
from dualexport.shared_state.hf_trace import EXPORTED_EXPERTS, exportable_experts, no_cache_output
from helpers_copies import assert_every_read_weight_exact

VOCAB = 100
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
#: name -> (config class, model class, config kwargs): experts stacked as one 3-D parameter per
#: projection (Mixtral), beside a shared expert with its own gate (Qwen2-MoE)
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **TINY,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
        },
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {**TINY, "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 8},
    ),
}


def make(arch: str, use_cache: bool = False) -> nn.Module:
    import transformers

    cfg_name, cls_name, kwargs = ARCHS[arch]
    config = getattr(transformers, cfg_name)(**kwargs)
    config.use_cache = use_cache
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config).eval()


def _kernel(model: nn.Module) -> Any:
    return model.config._experts_implementation  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "arch", ["mixtral", *(pytest.param(a, marks=pytest.mark.slow) for a in ("qwen2_moe", "gpt_oss"))]
)
def test_moe_decoder_exports_to_both_targets_with_parity_and_weights(
    arch: str, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    model = make(arch)
    assert _kernel(model) == "grouped_mm"  # transformers' default: neither runtime takes it
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    res = dx.export(model, (ids,), out_dir=tmp_path, name=arch)
    assert res.ok, dict(res.errors)
    assert set(res.artifacts) == {"onnx", "xnnpack"}
    assert _kernel(model) == "grouped_mm"  # the user's setting is restored
    # the constants our own passes fold for XNNPACK (rotary tables) are no warning
    ours = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dualexport")]
    assert not ours, caplog.text

    with torch.no_grad():
        logits = model(ids).logits
    assert logits.std() > 1e-2  # not flat: the routing and the experts reach the logits
    report = dx.compare(res)
    assert report.ok, report

    assert_every_read_weight_exact(res, "xnnpack")
    check = res.verify_weights()
    assert check.exact["onnx"] + check.transformed["onnx"] + check.not_stored["onnx"] == check.entries
    # every expert's stacked weight is an entry with a copy in each file
    experts = [e for e in res.manifest.entries if any(".experts." in n for n in e.names)]
    assert len(experts) >= 2 * ARCHS[arch][2]["num_hidden_layers"]
    for entry in experts:
        assert set(entry.copies) == {"onnx", "xnnpack"}, entry.name


class _Config:
    """A config-like object: what transformers' experts modules read."""

    def __init__(self, kernel: str | None) -> None:
        self._experts_implementation = kernel


class _Experts(nn.Module):
    def __init__(self, config: _Config) -> None:
        super().__init__()
        self.config = config


@pytest.mark.parametrize("kernel", ["grouped_mm", "eager"])
def test_an_unexportable_kernel_is_swapped_for_the_trace_and_restored(kernel: str) -> None:
    config = _Config(kernel)
    model = nn.Sequential(_Experts(config), _Experts(config))
    with exportable_experts(model):
        assert config._experts_implementation == EXPORTED_EXPERTS
    assert config._experts_implementation == kernel
    with pytest.raises(RuntimeError), exportable_experts(model):
        raise RuntimeError("a failed trace")
    assert config._experts_implementation == kernel


@pytest.mark.parametrize("kernel", [None, "batched_mm", "my_registered_kernel"])
def test_other_kernels_are_left_alone(kernel: str | None) -> None:
    config = _Config(kernel)
    with exportable_experts(_Experts(config)):
        assert config._experts_implementation == kernel
    with exportable_experts(nn.Linear(2, 2)):  # no config at all
        pass


@pytest.mark.slow
def test_moe_decoder_generates_transformers_tokens_on_both_files(tmp_path: pathlib.Path) -> None:
    """export_llm: the fixed-length cache wrapper around the experts, greedy tokens on ONNX Runtime
    and ExecuTorch identical to transformers' own generate (on its own experts kernel)."""
    model = make("mixtral", use_cache=True)
    res = dx.export_llm(model, max_seq_len=32, out_dir=tmp_path, name="mixtral")
    assert res.ok, dict(res.errors)
    assert _kernel(model) == "grouped_mm"
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=8, do_sample=False)[0, 8:].tolist()
    assert len(set(expected)) > 1  # not one repeated token
    for target, artifact in res.artifacts.items():
        tokens = torch.as_tensor(dx.generate(artifact.path, prompt, max_new_tokens=8)).reshape(-1)[-8:]
        assert tokens.tolist() == expected, target
    res.verify_weights()


def test_a_causal_lm_as_built_exports_without_its_cache(tmp_path: pathlib.Path) -> None:
    """``LlamaForCausalLM(config)`` called with ``input_ids`` alone: transformers' default
    ``use_cache=True`` returns a ``DynamicCache``, which torch.export refused ("Found DynamicCache
    in output"). The trace runs without it; the logits are the model's (checked here against the
    model itself, on both files)."""
    import transformers

    config = transformers.LlamaConfig(**TINY)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    assert config.use_cache is True
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    res = dx.export(model, (ids,), out_dir=tmp_path, name="llama", target="onnx")
    assert res.ok, dict(res.errors)
    assert config.use_cache is True  # restored
    with torch.no_grad():
        expected = model(ids).logits
    import onnxruntime as ort

    session = ort.InferenceSession(str(res.artifacts["onnx"].path), providers=["CPUExecutionProvider"])
    (got, *rest) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    assert not rest  # the logits alone: no cache tensors
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-4)


def test_a_call_that_manages_its_cache_is_left_alone() -> None:
    config = _Config(None)
    config.use_cache = True  # type: ignore[attr-defined]
    with no_cache_output(_Experts(config), {"use_cache": True}):
        assert config.use_cache is True  # type: ignore[attr-defined]
    with no_cache_output(_Experts(config), None):
        assert config.use_cache is False  # type: ignore[attr-defined]
    assert config.use_cache is True  # type: ignore[attr-defined]

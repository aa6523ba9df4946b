"""Real architectures nobody here wrote: Hugging Face transformers models built from tiny configs
with random weights (no download: HF_HUB_OFFLINE=1, ``from_config`` only).

Each model is wrapped in a small ``nn.Module`` that takes plain tensors and returns a tensor or a
tuple of tensors (``return_dict=False``-style), because the HF ``ModelOutput`` dataclasses and
cache objects are not what a deployment artifact should return; ``use_cache=False`` keeps decoder
models free of cache objects. The wrappers change nothing inside the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from dualexport.loading import HFWrapper

from .case import Case, InputSet

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

__all__ = ["HF_CASES"]


def _build(
    config_cls: str,
    model_cls: str,
    input_names: tuple[str, ...],
    n_out: int = 1,
    attention: str | None = None,
    **config: Any,
) -> Callable[[], nn.Module]:
    """A factory: import lazily (transformers is heavy), build from config as users get it:
    transformers' own attention (SDPA wherever the model supports it) unless ``attention``
    names one (``"eager"``: the extra cases)."""

    def factory() -> nn.Module:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        cfg.use_cache = False
        if attention is not None:
            cfg._attn_implementation = attention
        model = getattr(transformers, model_cls)(cfg).eval()
        return HFWrapper(model, input_names, n_out)

    return factory


def _ids(vocab: int, b: int = 2, s: int = 8) -> torch.Tensor:
    return torch.randint(0, vocab, (b, s))


def _mask(b: int = 2, s: int = 8) -> torch.Tensor:
    m = torch.ones(b, s, dtype=torch.long)
    m[1, s - 3 :] = 0  # second sequence padded
    return m


#: Ops that carry the weights: XNNPACK must take every one of them (glue ops may stay outside).
_LINEAR = frozenset({"aten_linear_default"})
_CONV = frozenset({"aten_convolution_default"})

_TEXT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    vocab_size=100,
    max_position_embeddings=32,
)

#: Sequence length 3..32 (max_position_embeddings): the wrapper's ``*inputs`` takes one spec per
#: tensor, nested in a tuple for the var-positional parameter.
_SEQ = Dim("seq", min=3, max=32)


def _bert_seq_sets() -> list[InputSet]:
    """Sequence length at its min, a middle value and its max."""
    return [((_ids(100, 2, s), _mask(2, s)), {}) for s in (3, 17, 32)]


def _gpt2_seq_sets() -> list[InputSet]:
    return [((_ids(100, 2, s),), {}) for s in (3, 17, 32)]


HF_CASES: tuple[Case, ...] = (
    Case(
        "hf_bert",
        _build("BertConfig", "BertModel", ("input_ids", "attention_mask"), 2, **_TEXT),
        lambda: ((_ids(100), _mask()), {}),
        description="BertModel (2 layers, hidden 32) with a padding mask; outputs "
        "last_hidden_state and pooler_output",
        onnx_ops=frozenset({"LayerNormalization", "Softmax", "Gather"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_gpt2",
        _build(
            "GPT2Config",
            "GPT2LMHeadModel",
            ("input_ids",),
            1,
            n_embd=32,
            n_layer=2,
            n_head=2,
            vocab_size=100,
            n_positions=32,
        ),
        lambda: ((_ids(100),), {}),
        description="GPT2LMHeadModel (2 layers, n_embd 32), causal mask, tied LM head; logits",
        onnx_ops=frozenset({"LayerNormalization", "Softmax"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_vit",
        _build(
            "ViTConfig",
            "ViTModel",
            ("pixel_values",),
            1,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            image_size=32,
            patch_size=8,
            num_channels=3,
        ),
        lambda: ((torch.randn(1, 3, 32, 32),), {}),
        description="ViTModel (2 layers, 32x32 image, patch 8); last_hidden_state",
        onnx_ops=frozenset({"Conv", "Softmax"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR | _CONV,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_llama",
        _build("LlamaConfig", "LlamaForCausalLM", ("input_ids",), 1, **_TEXT, num_key_value_heads=1),
        lambda: ((_ids(100),), {}),
        description="LlamaForCausalLM (2 layers, GQA 2:1, rotary inv_freq buffer, RMSNorm); logits",
        onnx_ops=frozenset({"Softmax", "Cos", "Sin"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_bert_eager",
        _build("BertConfig", "BertModel", ("input_ids", "attention_mask"), 2, attention="eager", **_TEXT),
        lambda: ((_ids(100), _mask()), {}),
        description="hf_bert with eager attention (attn_implementation='eager', the extra case)",
        onnx_ops=frozenset({"LayerNormalization", "Softmax", "Gather"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_llama_eager",
        _build(
            "LlamaConfig",
            "LlamaForCausalLM",
            ("input_ids",),
            1,
            attention="eager",
            **_TEXT,
            num_key_value_heads=1,
        ),
        lambda: ((_ids(100),), {}),
        description="hf_llama with eager attention (attn_implementation='eager', the extra case)",
        onnx_ops=frozenset({"Softmax", "Cos", "Sin"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_resnet",
        _build(
            "ResNetConfig",
            "ResNetModel",
            ("pixel_values",),
            2,
            num_channels=3,
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="basic",
        ),
        lambda: ((torch.randn(1, 3, 32, 32),), {}),
        description="ResNetModel (basic blocks, 2 stages) with BatchNorm; last_hidden_state "
        "and pooler_output",
        onnx_ops=frozenset({"Conv", "MaxPool"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=frozenset(),
        xnnpack_must_delegate=_CONV,
        slow=False,
        group="hf",
    ),  # the one HF case in the default run: ~3 s
    Case(
        "hf_wav2vec2",
        _build(
            "Wav2Vec2Config",
            "Wav2Vec2Model",
            ("input_values",),
            1,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=(16, 16),
            conv_stride=(5, 2),
            conv_kernel=(10, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            feat_extract_norm="group",
        ),
        lambda: ((torch.randn(1, 400),), {}),
        description="Wav2Vec2Model (audio: conv feature encoder with GroupNorm, positional conv, "
        "2 transformer layers) on 400 raw samples",
        onnx_ops=frozenset({"Conv", "Softmax"}),
        xnnpack_subgraphs=3,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_whisper_encoder",
        _build(
            "WhisperConfig",
            "WhisperForAudioClassification",
            ("input_features",),
            1,
            d_model=32,
            encoder_layers=2,
            encoder_attention_heads=2,
            decoder_layers=1,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            num_mel_bins=16,
            max_source_positions=16,
            vocab_size=100,
            num_labels=3,
        ),
        lambda: ((torch.randn(1, 16, 32),), {}),
        description="Whisper encoder + classification head (audio: log-mel 16 bins x 32 frames, "
        "conv stem, 2 layers); logits",
        onnx_ops=frozenset({"Conv", "Softmax"}),
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR | _CONV,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_bert_dynamic_seq",
        _build("BertConfig", "BertModel", ("input_ids", "attention_mask"), 2, **_TEXT),
        lambda: ((_ids(100), _mask()), {}),
        description="hf_bert with a dynamic sequence length 3..32, compared at 3, 17 and 32",
        # keyed by forward's parameter name: the var-positional ``inputs`` takes a tuple of specs
        dynamic_shapes=lambda: {"inputs": ({1: _SEQ}, {1: _SEQ})},
        extra_inputs=_bert_seq_sets,
        onnx_ops=frozenset({"LayerNormalization", "Softmax", "Gather"}),
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_gpt2_dynamic_seq",
        _build(
            "GPT2Config",
            "GPT2LMHeadModel",
            ("input_ids",),
            1,
            n_embd=32,
            n_layer=2,
            n_head=2,
            vocab_size=100,
            n_positions=32,
        ),
        lambda: ((_ids(100),), {}),
        description="hf_gpt2 with a dynamic sequence length 3..32, compared at 3, 17 and 32; "
        "the spec is the positional tuple form (one entry for ``*inputs``)",
        # positional form: one entry per forward parameter, the var-positional one a tuple
        dynamic_shapes=lambda: (({1: _SEQ},),),
        extra_inputs=_gpt2_seq_sets,
        onnx_ops=frozenset({"LayerNormalization", "Softmax"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_t5_encoder",
        _build(
            "T5Config",
            "T5EncoderModel",
            ("input_ids",),
            1,
            d_model=64,
            d_kv=16,
            num_heads=4,
            d_ff=128,
            num_layers=2,
            vocab_size=100,
        ),
        lambda: ((_ids(100, 1, 16),), {}),
        description="T5 encoder (2 layers, d_model 64, SDPA attention with relative position bias); "
        "plain torch.onnx fails on it (tests/test_canonical.py)",
        onnx_ops=frozenset({"Softmax"}),
        xnnpack_subgraphs=2,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
    Case(
        "hf_mobilebert",
        _build(
            "MobileBertConfig",
            "MobileBertModel",
            ("input_ids", "attention_mask"),
            1,
            hidden_size=64,
            embedding_size=32,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=32,
        ),
        lambda: ((_ids(100), _mask()), {}),
        description="MobileBERT (2 layers, bottlenecks 32, NoNorm, padding mask); last_hidden_state",
        onnx_ops=frozenset({"Softmax", "Gather"}),
        xnnpack_subgraphs=1,
        xnnpack_allowed_non_delegated=None,
        xnnpack_must_delegate=_LINEAR,
        slow=True,
        group="hf",
    ),
)

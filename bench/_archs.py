"""46 transformers architectures as users build them: tiny configs, random weights, transformers'
own attention (SDPA wherever the model supports it), called the way their model cards show
(``input_ids`` + ``attention_mask``, ``pixel_values``, ``input_values``). Data for
bench_coverage.py (and the slow test that runs a few of them).

Each architecture says how to build it, its example inputs, and its serving-style dynamic shapes:
decoders a dynamic sequence (batch 1), text encoders a dynamic batch and sequence, vision and
speech a dynamic batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

__all__ = ["Arch", "ARCHS", "FAMILIES", "by_name"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

FAMILIES = ("decoders", "encoders", "speech encoders", "vision", "seq2seq encoders")

_TEXT: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=100,
    max_position_embeddings=64,
)
_GQA: dict[str, Any] = dict(_TEXT, num_key_value_heads=2)
_VISION: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    image_size=32,
    num_channels=3,
)
_AUDIO: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
)
SEQ, BATCH = 8, 2
SEQ_RANGE, BATCH_RANGE = (2, 32), (1, 8)


@dataclass(frozen=True)
class Arch:
    """One architecture: its config and model classes, its inputs, its dynamic dims."""

    name: str
    family: str
    config: str
    model: str
    inputs: str  # "ids" (decoders), "ids+mask" (encoders), "pixels", "audio"
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: the model object to export, from the built model (e.g. Bart's encoder)
    pick: Callable[[nn.Module], nn.Module] | None = None
    #: the least dynamic sequence length the model takes (MobileBERT's trigram embedding slices
    #: ``[:, 1:]``: a length of 2 leaves 1, which torch.export specializes; dx.export names the range)
    seq_min: int = SEQ_RANGE[0]

    def build(self, attention: str | None = None) -> nn.Module:
        """The wrapped model, eval mode, seeded random weights."""
        from dualexport.loading import HFWrapper, allow_torchvision

        allow_torchvision()
        import transformers

        cfg = getattr(transformers, self.config)(**self.kwargs)
        cfg.use_cache = False
        if attention is not None:
            cfg._attn_implementation = attention
        torch.manual_seed(0)
        model = getattr(transformers, self.model)(cfg).eval()
        if self.pick is not None:
            model = self.pick(model).eval()
        if self.family == "vision":  # BatchNorm statistics from data, not the init's (0, 1)
            from dualexport.loading import settle_batchnorm

            g = torch.Generator().manual_seed(1)
            settle_batchnorm(model, [(torch.randn(4, 3, 32, 32, generator=g),) for _ in range(2)])
        names = {
            "ids": ("input_ids",),
            "ids+mask": ("input_ids", "attention_mask"),
            "pixels": ("pixel_values",),
            "audio": ("input_values",),
        }[self.inputs]
        return HFWrapper(model, names, 1).eval()

    def example(self) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        if self.inputs == "ids":
            return (torch.randint(0, 100, (1, SEQ), generator=g),)
        if self.inputs == "ids+mask":
            mask = torch.ones(BATCH, SEQ, dtype=torch.long)
            mask[1, SEQ - 3 :] = 0  # the second sequence padded
            return torch.randint(0, 100, (BATCH, SEQ), generator=g), mask
        if self.inputs == "pixels":
            return (torch.randn(BATCH, 3, 32, 32, generator=g),)
        return (torch.randn(BATCH, 400, generator=g),)

    def dynamic_shapes(self) -> Any:
        """Serving-style: decoders the sequence, text encoders batch and sequence, the rest batch."""
        from torch.export import Dim

        seq = Dim("seq", min=self.seq_min, max=SEQ_RANGE[1])
        batch = Dim("batch", min=BATCH_RANGE[0], max=BATCH_RANGE[1])
        if self.inputs == "ids":
            return {"inputs": ({1: seq},)}
        if self.inputs == "ids+mask":
            return {"inputs": ({0: batch, 1: seq}, {0: batch, 1: seq})}
        return {"inputs": ({0: batch},)}

    def dynamic_label(self) -> str:
        return {"ids": "seq", "ids+mask": "batch+seq"}.get(self.inputs, "batch")


def _d(name: str, config: str, model: str, **kw: Any) -> Arch:
    return Arch(name, "decoders", config, model, "ids", kw)


def _e(name: str, config: str, model: str, **kw: Any) -> Arch:
    return Arch(name, "encoders", config, model, "ids+mask", kw)


def _v(name: str, config: str, model: str, **kw: Any) -> Arch:
    return Arch(name, "vision", config, model, "pixels", kw)


ARCHS: tuple[Arch, ...] = (
    # ------------------------------------------------------------------------- decoders (21)
    _d("llama", "LlamaConfig", "LlamaForCausalLM", **_GQA),
    _d("mistral", "MistralConfig", "MistralForCausalLM", **_GQA),
    _d("qwen2", "Qwen2Config", "Qwen2ForCausalLM", **_GQA),
    _d("qwen3", "Qwen3Config", "Qwen3ForCausalLM", **_GQA, head_dim=8),
    _d("gemma", "GemmaConfig", "GemmaForCausalLM", **_GQA, head_dim=8),
    _d("gemma2", "Gemma2Config", "Gemma2ForCausalLM", **_GQA, head_dim=8, sliding_window=16),
    _d("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", **_GQA, head_dim=8, sliding_window=16),
    _d("phi", "PhiConfig", "PhiForCausalLM", **_TEXT),
    _d("phi3", "Phi3Config", "Phi3ForCausalLM", **_GQA, pad_token_id=0),
    _d(
        "gpt2",
        "GPT2Config",
        "GPT2LMHeadModel",
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=100,
        n_positions=64,
    ),
    _d(
        "gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        **_TEXT,
    ),
    _d(
        "gptj",
        "GPTJConfig",
        "GPTJForCausalLM",
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=100,
        n_positions=64,
        rotary_dim=4,
    ),
    _d(
        "opt",
        "OPTConfig",
        "OPTForCausalLM",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        vocab_size=100,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    ),
    _d("bloom", "BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=2, n_head=4, vocab_size=100),
    _d(
        "falcon",
        "FalconConfig",
        "FalconForCausalLM",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=100,
    ),
    _d("stablelm", "StableLmConfig", "StableLmForCausalLM", **_GQA),
    _d("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", **_GQA),
    _d("olmo", "OlmoConfig", "OlmoForCausalLM", **_GQA),
    _d("olmo2", "Olmo2Config", "Olmo2ForCausalLM", **_GQA),
    _d("cohere", "CohereConfig", "CohereForCausalLM", **_GQA),
    _d("granite", "GraniteConfig", "GraniteForCausalLM", **_GQA),
    # --------------------------------------------------------------------- encoders (10)
    _e("bert", "BertConfig", "BertModel", **_TEXT),
    _e("roberta", "RobertaConfig", "RobertaModel", **dict(_TEXT, max_position_embeddings=70)),
    _e(
        "distilbert",
        "DistilBertConfig",
        "DistilBertModel",
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        vocab_size=100,
        max_position_embeddings=64,
    ),
    _e("albert", "AlbertConfig", "AlbertModel", **_TEXT, embedding_size=16),
    _e("electra", "ElectraConfig", "ElectraModel", **_TEXT, embedding_size=16),
    _e("xlm_roberta", "XLMRobertaConfig", "XLMRobertaModel", **dict(_TEXT, max_position_embeddings=70)),
    _e("deberta_v2", "DebertaV2Config", "DebertaV2Model", **_TEXT),
    replace(
        _e(
            "mobilebert",
            "MobileBertConfig",
            "MobileBertModel",
            hidden_size=64,
            embedding_size=32,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=100,
            max_position_embeddings=64,
        ),
        seq_min=3,
    ),
    _e(
        "modernbert",
        "ModernBertConfig",
        "ModernBertModel",
        **_TEXT,
        global_attn_every_n_layers=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    ),
    # rotary positions counted from the padding (an input), queries scaled before rotary
    _e("esm", "EsmConfig", "EsmModel", **_TEXT, position_embedding_type="rotary", pad_token_id=1),
    # ------------------------------------------------------------------ speech encoders (3)
    Arch(
        "wav2vec2",
        "speech encoders",
        "Wav2Vec2Config",
        "Wav2Vec2Model",
        "audio",
        dict(_AUDIO, feat_extract_norm="group"),
    ),
    Arch(
        "hubert",
        "speech encoders",
        "HubertConfig",
        "HubertModel",
        "audio",
        dict(_AUDIO, feat_extract_norm="group"),
    ),
    Arch(
        "wavlm",
        "speech encoders",
        "WavLMConfig",
        "WavLMModel",
        "audio",
        dict(_AUDIO, feat_extract_norm="group"),
    ),
    # ------------------------------------------------------------------------- vision (10)
    _v("vit", "ViTConfig", "ViTModel", **_VISION, patch_size=8),
    _v("deit", "DeiTConfig", "DeiTModel", **_VISION, patch_size=8),
    _v("beit", "BeitConfig", "BeitModel", **_VISION, patch_size=8, use_relative_position_bias=True),
    _v("dinov2", "Dinov2Config", "Dinov2Model", **_VISION, patch_size=8),
    _v(
        "swin",
        "SwinConfig",
        "SwinModel",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    _v(
        "convnext",
        "ConvNextConfig",
        "ConvNextModel",
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_stages=2,
        num_channels=3,
    ),
    _v(
        "resnet",
        "ResNetConfig",
        "ResNetModel",
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        layer_type="basic",
    ),
    _v(
        "regnet",
        "RegNetConfig",
        "RegNetModel",
        embedding_size=8,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        groups_width=8,
    ),
    _v(
        "levit",
        "LevitConfig",
        "LevitModel",
        image_size=32,
        patch_size=16,
        hidden_sizes=[32, 48],
        num_attention_heads=[2, 2],
        depths=[1, 1],
        key_dim=[8, 8],
        mlp_ratio=[2, 2],
        attention_ratio=[2, 2],
        down_ops=[["Subsample", 8, 2, 2, 2, 2]],
    ),
    _v(
        "segformer",
        "SegformerConfig",
        "SegformerModel",
        hidden_sizes=[8, 16, 16, 32],
        depths=[1, 1, 1, 1],
        num_attention_heads=[1, 1, 2, 2],
        decoder_hidden_size=32,
    ),
    # ---------------------------------------------------------------- seq2seq encoders (2)
    Arch(
        "t5_encoder",
        "seq2seq encoders",
        "T5Config",
        "T5EncoderModel",
        "ids+mask",
        dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, vocab_size=100),
    ),
    Arch(
        "bart_encoder",
        "seq2seq encoders",
        "BartConfig",
        "BartModel",
        "ids+mask",
        dict(
            d_model=32,
            encoder_layers=2,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            vocab_size=100,
            max_position_embeddings=64,
        ),
        pick=lambda m: m.get_encoder(),
    ),
)


def by_name(name: str) -> Arch:
    for arch in ARCHS:
        if arch.name == name:
            return arch
    raise KeyError(name)

"""Generative decoders (issue 19, step 1): ``dx.export_llm`` on seven transformers architectures
(tiny configs, seeded random weights), both targets from one trace; ``dx.generate`` on each file
against transformers' own ``generate``; teacher-forced logits; refusal past ``max_seq_len``; the
weight proof; the CLI. One export per architecture, shared by its checks; all but two
architectures run in the slow suite."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dualexport as dx
from dualexport.errors import ArtifactFormatError, DualExportError, InputError
from dualexport.llm import DecoderSession, SequenceTooLongError, read_layout
from dualexport.llm.parity import StepTolerance, generation_parity

T = 32  # max_seq_len of every test export
NEW = 8  # new tokens per prompt
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
#: name -> (config class, model class, config kwargs); each exercises something the others do not
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", COMMON),  # GQA, rotary, RMSNorm
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", COMMON),  # q/k/v bias
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**COMMON, "head_dim": 16}),  # q/k norm
    "mistral": ("MistralConfig", "MistralForCausalLM", {**COMMON, "sliding_window": 8}),  # window < T
    "gemma3": (  # sliding and full layers, scaled embeddings, query_pre_attn_scalar
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            **COMMON,
            "head_dim": 16,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**COMMON, "pad_token_id": 0}),  # fused qkv, fused gate_up
    # learned positions, tied head, MHA; the default init (0.02) gives one repeated token
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2),
    ),
}
FAST = ("llama", "gemma3")


def make_model(arch: str, seed: int = 0) -> torch.nn.Module:
    from dualexport.loading import allow_torchvision

    allow_torchvision()
    import transformers

    cfg_name, cls_name, kwargs = ARCHS[arch]
    config = getattr(transformers, cfg_name)(**kwargs)
    torch.manual_seed(seed)
    return getattr(transformers, cls_name)(config).eval()


def prompts() -> list[list[int]]:
    """Two prompt lengths: a short prefill and a long one (NEW tokens still fit in T)."""
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, T - NEW)]


def hf_tokens(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0]]


@dataclasses.dataclass(frozen=True)
class Exported:
    arch: str
    model: torch.nn.Module
    res: Any
    report: Any


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One export (and one parity report) per architecture for the whole module."""
    done: dict[str, Exported] = {}

    def get(arch: str) -> Exported:
        if arch not in done:
            model = make_model(arch)
            res = dx.export_llm(model, max_seq_len=T, out_dir=tmp_path_factory.mktemp(arch), name=arch)
            assert res.ok, dict(res.errors)
            report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
            done[arch] = Exported(arch, model, res, report)
        return done[arch]

    return get


@pytest.fixture(params=[pytest.param(a, marks=() if a in FAST else pytest.mark.slow) for a in ARCHS])
def llm(request: pytest.FixtureRequest, exports: Any) -> Exported:
    return exports(request.param)


# ------------------------------------------------------------------------ generation parity
def test_greedy_tokens_identical_to_transformers_generate(llm: Exported) -> None:
    """fp32: ONNX Runtime, ExecuTorch and the shared program generate transformers' tokens,
    for a short and a long prompt; the tokens are not one repeated id."""
    report = llm.report
    assert report.reference == "transformers.generate"
    assert set(report.runtimes) == {"eager", "onnx", "xnnpack"}
    assert len(report.prompts) == 2
    new_ids: set[int] = set()
    for p in report.prompts:
        assert len(p.reference) == NEW
        new_ids |= set(p.reference)
        for rt, toks in p.tokens.items():
            assert toks == p.reference, (llm.arch, rt, len(p.prompt), toks, p.reference)
            assert p.first_divergence[rt] is None
    assert len(new_ids) >= 3, f"{llm.arch}: flat generation {new_ids}"


def test_teacher_forced_logits_within_tolerance(llm: Exported) -> None:
    tol = StepTolerance()
    for p in llm.report.prompts:
        for rt in ("onnx", "xnnpack"):
            m = p.teacher_forced[rt]
            assert m.steps == NEW
            assert m.within(tol), (llm.arch, rt, m)
            assert m.top1_agreement == 1.0 and m.max_kl <= 1e-5 and m.max_abs <= 1e-3
    assert llm.report.ok
    assert '"ok": true' in llm.report.to_json()


def test_generate_api_both_files(llm: Exported) -> None:
    """dx.generate picks the runtime by file; tokens as transformers returns them (prompt + new),
    and the logits that chose each new token (non-flat)."""
    prompt = prompts()[0]
    want = hf_tokens(llm.model, prompt, 5)
    for target, art in llm.res.artifacts.items():
        tokens, logits = dx.generate(art.path, prompt, max_new_tokens=5, return_logits=True)
        assert tokens.tolist() == [want], target
        assert tuple(logits.shape) == (5, 256)
        assert float(logits.std()) > 1e-2
        assert logits.argmax(-1).tolist() == want[len(prompt) :]


def test_refuses_past_max_seq_len(llm: Exported) -> None:
    """Prompt + new tokens up to max_seq_len runs (the cache's last slot is written); one more
    is refused before anything runs, with what to try."""
    prompt = prompts()[1]
    for art in llm.res.artifacts.values():
        session = DecoderSession.open(art.path)
        gen = session.generate(prompt, T - len(prompt), stop_at_eos=False)
        assert gen.tokens.shape == (1, T)
        with pytest.raises(SequenceTooLongError) as err:
            dx.generate(art.path, prompt, max_new_tokens=T - len(prompt) + 1)
        assert isinstance(err.value, DualExportError)
        assert f"max_seq_len of {T}" in str(err.value) and err.value.hint
        with pytest.raises(SequenceTooLongError):
            session.step([1] * T)  # one call holds at most T - 1 tokens


def test_weights_proven_and_layout_recorded(llm: Exported) -> None:
    check = llm.res.verify_weights()
    assert check.exact["xnnpack"] > 0 and check.exact["onnx"] > 0
    layouts = {t: read_layout(a.path) for t, a in llm.res.artifacts.items()}
    assert layouts["onnx"] == layouts["xnnpack"]
    layout = layouts["onnx"]
    config = llm.model.config
    assert (layout.layers, layout.max_seq_len, layout.vocab, layout.dtype) == (2, T, 256, "float32")
    assert layout.kv_heads == getattr(config, "num_key_value_heads", 4)
    sliding = tuple(t == "sliding_attention" for t in getattr(config, "layer_types", None) or [])
    assert layout.sliding == (sliding or (False, False))


# --------------------------------------------------------------------- one architecture only
@pytest.fixture
def llama(exports: Any) -> Exported:
    return exports("llama")


def test_compare_runs_on_an_llm_result(llama: Exported) -> None:
    """dx.compare on the cache-taking program: example, and every edge of S (1, T-2, T-1)."""
    report = dx.compare(llama.res)
    assert report.ok, report.to_markdown()
    assert report.outputs and all(set(o.metrics) == {"onnx", "xnnpack"} for o in report.outputs)


def test_generation_stops_at_eos(llama: Exported) -> None:
    """Like transformers: the end-of-sequence id is emitted, then generation stops."""
    prompt = prompts()[0]
    free = hf_tokens(llama.model, prompt, 6)[len(prompt) :]
    session = DecoderSession.open(llama.res.artifacts["onnx"].path)
    session.layout = dataclasses.replace(session.layout, eos_token_ids=(free[2],))
    stop = free.index(free[2]) + 1
    assert session.generate(prompt, 6).new_tokens == free[:stop]
    assert session.generate(prompt, 6, stop_at_eos=False).new_tokens == free


def test_refusals_before_tracing(tmp_path: pathlib.Path) -> None:
    gpt2 = make_model("gpt2")
    with pytest.raises(InputError, match="max_position_embeddings"):
        dx.export_llm(gpt2, max_seq_len=128, out_dir=tmp_path / "a")
    with pytest.raises(InputError, match="max_seq_len"):
        dx.export_llm(gpt2, max_seq_len=2, out_dir=tmp_path / "b")
    with pytest.raises(InputError, match="int4"):
        dx.export_llm(gpt2, max_seq_len=16, out_dir=tmp_path / "c", quantize="int4")
    with pytest.raises(InputError, match="past_key_values"):
        dx.export_llm(torch.nn.Linear(4, 4), max_seq_len=16, out_dir=tmp_path / "d")
    assert not any((tmp_path / d).exists() for d in "abcd")
    (tmp_path / "x.onnx").write_bytes(b"")
    with pytest.raises(InputError):
        dx.generate(tmp_path / "missing.onnx", [1], max_new_tokens=1)
    with pytest.raises(InputError, match="neither"):
        dx.generate(tmp_path / "x.bin", [1], max_new_tokens=1)


def test_generate_refuses_a_file_without_layout(tmp_path: pathlib.Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
        tmp_path / "m.onnx",
    )
    with pytest.raises(ArtifactFormatError, match="export_llm"):
        dx.generate(tmp_path / "m.onnx", [1], max_new_tokens=1)

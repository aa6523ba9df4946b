"""Generative decoders (issue 19, step 1): ``dx.export_llm`` on eleven transformers architectures
(tiny configs, seeded random weights), both targets from one trace; ``dx.generate`` on each file
against transformers' own ``generate``; teacher-forced logits; refusal past ``max_seq_len``; the
weight proof; XNNPACK delegation; the CLI. One export per architecture, shared by its checks;
all but Llama run in the slow suite."""

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
    # learned positions sized by the cache length (a value read only an assertion keeps)
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
            init_std=0.2,  # the default (0.02) gives one repeated token
            eos_token_id=255,  # OPT's default end of sequence (2) ends a prompt's 8 tokens early
        ),
    ),
    # soft-capped attention and logits, alternating sliding layers (window < T); transformers'
    # generate leaves the model's own uncached forward on long prompts
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**COMMON, "head_dim": 16, "sliding_window": 8}),
    # interleaved rotary (x[..., ::2], x[..., 1::2] stacked) and an RMSNorm epsilon of 1e-8, which
    # onnxscript's no-op rule took for 0 (NaN logits in the .onnx before the exact identities)
    "helium": ("HeliumConfig", "HeliumForCausalLM", {**COMMON, "head_dim": 16, "pad_token_id": 0}),
    # LayerNorm with bias, transformers' gelu_pytorch_tanh: the GELU that ExecuTorch's visitor
    # wrote as the exact one (logits off by 1.3e-3 in the .pte before the partitioner fix)
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**COMMON, "initializer_range": 0.2}),
    # learned positions, tied head, MHA; the default init (0.02) gives one repeated token
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2),
    ),
}
#: In the default run (one export, ~1.5 min of CPU on 2 cores); the others run in `make test-slow`.
FAST = ("llama",)


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
            # the deploy folder of the default run's llama is test_deploy.py's; the other architectures
            # prove theirs here (sliding windows, soft caps, learned positions in the runner files)
            res = dx.export_llm(
                model,
                max_seq_len=T,
                out_dir=tmp_path_factory.mktemp(arch),
                name=arch,
                deploy=arch not in FAST,
            )
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
    runners = {"xnnpack:runner", "onnx:genai"} if llm.res.deploy is not None else set()
    if llm.res.deploy is not None and llm.res.deploy.onnx is None:  # a whole-cache program
        runners.discard("onnx:genai")
    # the slow architectures export deploy folders: their runner files generate the same tokens
    # (and a deploy export's only .pte is its runner file)
    explicit = {"onnx", "xnnpack"} if llm.res.deploy is None else {"onnx"}
    assert set(llm.res.artifacts) == explicit
    assert set(report.runtimes) == {"eager"} | explicit | runners
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
        for rt in sorted({*llm.res.artifacts, *({"xnnpack:runner"} & set(p.teacher_forced))}):
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
    assert check.exact["onnx"] > 0
    if llm.res.deploy is None:
        assert check.exact["xnnpack"] > 0
    else:  # the runner .pte's own weight proof, read back from the file when it was made
        found = llm.res.deploy.weights["xnnpack"]
        assert found.get("exact", 0) > 0 and not {"missing", "mismatch"} & set(found), found
    layouts = {t: read_layout(a.path) for t, a in llm.res.artifacts.items()}
    assert layouts.get("xnnpack", layouts["onnx"]) == layouts["onnx"]
    layout = layouts["onnx"]
    config = llm.model.config
    assert (layout.layers, layout.max_seq_len, layout.vocab, layout.dtype) == (2, T, 256, "float32")
    assert layout.kv_heads == getattr(config, "num_key_value_heads", 4)
    # Mistral: a window on every layer; Gemma2 and Gemma3: sliding then full (their layer_types)
    sliding = {"mistral": (True, True), "gemma2": (True, False), "gemma3": (True, False)}
    assert layout.sliding == sliding.get(llm.arch, (False, False))


def test_xnnpack_one_delegate_per_program(llm: Exported) -> None:
    """Issue 19's bar: at least 90% of the nodes delegated, in at most L + 2 subgraphs (a plain
    export of the same tiny Llama: 25 subgraphs, 49.5%). Fused projections included (Phi-3's
    qkv_proj and gate_up_proj, GPT-2's c_attn): their slices of a dynamic tensor were strict
    xfails until the slow run of 2026-12-02 showed both inside the bar."""
    res = llm.res
    if res.deploy is not None:
        # a deploy export's only .pte is its runner file: ExecuTorch's LLM ops (or the cache
        # writes into its buffers) and the position read sit between the delegates, as in
        # ExecuTorch's own LLM files (88-89% of a 2-layer model's compute ops delegated); none of
        # the model's projections, norms, activations or attention math is left outside (an add
        # may be: OPT's learned positions add an offset to the integer cache position)
        d = res.deploy.delegation["xnnpack"]
        assert d.subgraphs <= 2 + 2 and d.delegated_share >= 0.85, d.to_markdown()
        model_ops = {"linear", "mean_dim", "rsqrt", "softmax", "bmm", "layer_norm", "gelu", "sigmoid", "relu"}
        outside = set(d.non_delegated_ops())
        assert not {op for op in outside if any(m in op for m in model_ops)}, d.to_markdown()
        return
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs <= 2 + 2, d.to_markdown()
    assert d.delegated_share >= 0.90, d.to_markdown()
    assert not {"aten_index_put_default", "aten_any_dim", "aten_mean_dim"} & set(d.non_delegated_ops())


def test_files_return_only_the_new_rows(llm: Exported) -> None:
    """Every architecture above takes the "rows" cache (the eager check against the whole-cache
    program passes): both files return ``[L, 1, Hkv, S, D]`` new rows, never the whole cache, and
    the .onnx writes nothing into the cache it reads (no Scatter of any kind)."""
    import onnx

    path = llm.res.artifacts["onnx"].path
    layout = read_layout(path)
    assert layout.cache == "rows" and layout.outputs == ("logits", "new_k", "new_v"), layout
    graph = onnx.load(str(path), load_external_data=False).graph
    assert not [n.op_type for n in graph.node if n.op_type.startswith("Scatter")]
    for out in graph.output[1:]:
        dims = out.type.tensor_type.shape.dim
        assert [d.dim_value for d in dims[:3]] == [layout.layers, 1, layout.kv_heads], out
        assert dims[3].dim_param and not dims[3].dim_value, f"{out.name}: the rows axis is not S"


def test_stale_cache_slots_never_count(llm: Exported) -> None:
    """The slots at and after the position a call writes may hold anything (a previous, longer
    generation): both files mask them. Noise there leaves prefill and decode logits as they were."""
    prompt = prompts()[0]
    for target, art in llm.res.artifacts.items():
        clean = DecoderSession.open(art.path)
        dirty = DecoderSession.open(art.path)
        noise = torch.Generator().manual_seed(5)
        dirty.past_k.copy_(torch.randn(dirty.past_k.shape, generator=noise) * 10)
        dirty.past_v.copy_(torch.randn(dirty.past_v.shape, generator=noise) * 10)
        for ids in (prompt, [7], [11]):
            want, got = clean.step(ids), dirty.step(ids)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (llm.arch, target, ids)


def test_each_call_reads_only_the_positions_used(llm: Exported) -> None:
    """The rows program takes each layer's keys and values as inputs of their own, the cache's
    first P slots (P dynamic, the position rounded up to the layout's ``past_step``): a session
    passes that prefix, and any longer one, noise in the extra slots included, gives the same
    logits on both files."""
    import onnx

    prompt = prompts()[0]
    for target, art in llm.res.artifacts.items():
        layout = read_layout(art.path)
        assert layout.past_step == T // 4, layout  # 8 slots per prefix step at T = 32
        assert layout.past_inputs == "layers" and len(layout.inputs) == 2 + 2 * layout.layers, layout
        if target == "onnx":
            graph = onnx.load(str(art.path), load_external_data=False).graph
            assert [i.name for i in graph.input] == list(layout.inputs)
            for past in graph.input[2:]:
                dims = past.type.tensor_type.shape.dim
                assert [d.dim_value for d in dims[:2]] == [1, layout.kv_heads], past.name
                assert dims[2].dim_param, f"{past.name}: the past length is not dynamic"
        session = DecoderSession.open(art.path)
        session.step(prompt)
        pos = session.position
        noise = torch.Generator().manual_seed(3)
        session.past_k[:, :, :, pos:] = torch.randn(session.past_k[:, :, :, pos:].shape, generator=noise) * 10
        session.past_v[:, :, :, pos:] = torch.randn(session.past_v[:, :, :, pos:].shape, generator=noise) * 10
        ids, where = torch.tensor([[7]]), torch.tensor([pos])
        outs = {
            slots: session.runner.run([ids, where, *layout.past_args(session.past_k, session.past_v, slots)])[
                0
            ]
            for slots in sorted(
                {layout.past_length(pos), min(T, layout.past_length(pos) + layout.past_step), T}
            )
        }
        assert min(outs) == layout.past_length(pos) < T
        want = outs[T]
        for slots, got in outs.items():
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (llm.arch, target, slots)


# --------------------------------------------------------------------- one architecture only
@pytest.fixture
def llama(exports: Any) -> Exported:
    return exports("llama")


def test_compare_runs_on_an_llm_result(llama: Exported) -> None:
    """dx.compare on the cache-taking program: example, and every edge of S (1, T-2, T-1)."""
    report = dx.compare(llama.res)
    assert report.ok, report.to_markdown()
    assert report.outputs and all(set(o.metrics) == {"onnx", "xnnpack"} for o in report.outputs)


def test_rms_norms_fuse_in_onnx_runtime(llama: Exported, tmp_path: pathlib.Path) -> None:
    """Every RMSNorm of the .onnx (2 per layer and the final one) is one
    SimplifiedLayerNormalization in ONNX Runtime's optimized session: the file writes
    ``x * rsqrt(a)`` as ``x / Sqrt(a)``, the form ORT's fusion recognises (onnx_passes.py)."""
    import onnx
    import onnxruntime as ort

    path = llama.res.artifacts["onnx"].path
    assert not any(
        n.op_type == "Reciprocal" for n in onnx.load(str(path), load_external_data=False).graph.node
    )
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node]
    layers = llama.model.config.num_hidden_layers
    assert ops.count("SimplifiedLayerNormalization") == 2 * layers + 1, sorted(set(ops))
    assert "Sqrt" not in ops


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
    with pytest.raises(InputError, match="int2"):
        dx.export_llm(gpt2, max_seq_len=16, out_dir=tmp_path / "c", quantize="int2")
    with pytest.raises(InputError, match="past_key_values"):
        dx.export_llm(torch.nn.Linear(4, 4), max_seq_len=16, out_dir=tmp_path / "d")
    assert not any((tmp_path / d).exists() for d in "abcd")
    (tmp_path / "x.onnx").write_bytes(b"")
    with pytest.raises(InputError):
        dx.generate(tmp_path / "missing.onnx", [1], max_new_tokens=1)
    with pytest.raises(InputError, match="neither"):
        dx.generate(tmp_path / "x.bin", [1], max_new_tokens=1)


def test_a_decoder_that_cannot_run_is_refused_as_the_models_problem(tmp_path: pathlib.Path) -> None:
    """A config whose sizes disagree fails on the layout probe, a decoder whose bias is sized by
    the tokens seen (Falcon with ALiBi) fails the dry run with a fixed-length cache, and one that
    runs with it but computes other logits than its own uncached forward (GPT-Neo) is refused
    too: all as InputError naming the model's problem, before any trace, nothing written."""
    import transformers

    torch.manual_seed(0)
    bad = transformers.StableLmForCausalLM(
        transformers.StableLmConfig(**{**COMMON, "num_key_value_heads": 32})  # 32 kv heads, 4 heads
    ).eval()
    with pytest.raises(InputError, match="two-token forward.*RuntimeError"):
        dx.export_llm(bad, max_seq_len=16, out_dir=tmp_path / "a")
    alibi = transformers.FalconForCausalLM(
        transformers.FalconConfig(
            vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, alibi=True
        )
    ).eval()
    with pytest.raises(InputError, match="fixed-length cache") as info:
        dx.export_llm(alibi, max_seq_len=16, out_dir=tmp_path / "b")
    assert "alibi" in info.value.hint
    # GPT-Neo slices its causal bias by the key length (the cache's T here, not the tokens seen):
    # it runs, and computes other logits than its own uncached forward, so it is refused
    neo = transformers.GPTNeoForCausalLM(
        transformers.GPTNeoConfig(
            vocab_size=256,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            max_position_embeddings=64,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
        )
    ).eval()
    with pytest.raises(InputError, match="without a cache") as info:
        dx.export_llm(neo, max_seq_len=16, out_dir=tmp_path / "c")
    assert "dx.export" in info.value.hint
    assert not any((tmp_path / d).exists() for d in "abc")


def test_reference_sides_with_the_models_uncached_forward() -> None:
    """When transformers.generate's cache leaves the model's own forward (Gemma2's sliding
    layers), the reference is the uncached forward and the report says so; when generate agrees
    with the program, it stays the reference."""
    from types import SimpleNamespace

    from dualexport.llm.parity import _hf_reference

    class Toy(torch.nn.Module):
        """Next token = (last token + 1) % 5; ``generate`` adds 2 from its second step on."""

        def forward(self, input_ids: torch.Tensor, use_cache: bool = True) -> Any:
            nxt = (input_ids[0, -1] + 1) % 5
            return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, 5).float().expand(1, 1, 5))

        def generate(self, ids: torch.Tensor, max_new_tokens: int, **_: Any) -> torch.Tensor:
            out = ids[0].tolist()
            for i in range(max_new_tokens):
                out.append((out[-1] + (1 if i == 0 else 2)) % 5)
            return torch.tensor([out])

    uncached = [2, 3, 4]
    ref, note = _hf_reference(Toy(), [1], 3, eager=uncached)
    assert ref == uncached and "step 1" in note
    hf = Toy().generate(torch.tensor([[1]]), 3)[0, 1:].tolist()
    assert _hf_reference(Toy(), [1], 3, eager=hf) == (hf, "")
    # the uncached reference stops after an end-of-sequence id, as the sessions do (Ernie 4.5,
    # eos 2, compared 8 uncached tokens with the files' 6 and failed with every token equal)
    ref, note = _hf_reference(Toy(), [1], 3, eager=[2, 3], eos=(3,))
    assert ref == [2, 3] and "step 1" in note


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


def test_an_and_with_true_is_the_mask() -> None:
    """transformers' ``and_masks`` starts from ``q_idx.new_ones((), dtype=bool)``: the
    canonicalization drops that ``&`` (an op outside the XNNPACK delegate) and keeps the mask."""
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    from dualexport.llm.canonical import true_and_as_identity

    mask_function = and_masks(causal_mask_function, sliding_window_overlay(4))

    class Mask(torch.nn.Module):
        def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return mask_function(0, 0, q.view(-1, 1), kv.view(1, -1)).float()

    seq = torch.export.Dim("seq", min=2, max=32)
    args = (torch.arange(5), torch.arange(9))
    program = torch.export.export(Mask(), args, dynamic_shapes=({0: seq}, {0: seq + 4}))
    ands = (torch.ops.aten.__and__.Tensor, torch.ops.aten.bitwise_and.Tensor)

    def count() -> int:
        return sum(n.target in ands for n in program.graph.nodes)

    assert count() == 2
    program = true_and_as_identity(program)
    assert count() == 1  # causal & window remain
    for q, kv in ((torch.arange(5), torch.arange(9)), (torch.arange(3, 20), torch.arange(21))):
        torch.testing.assert_close(program.module()(q, kv), Mask()(q, kv), rtol=0, atol=0)


def test_layout_versions() -> None:
    """A version-1 layout (whole cache out and in as two stacked tensors) still reads and is fed
    so; a cache kind or version this dualexport does not know is refused, saying to upgrade."""
    import json

    from dualexport.llm.layout import LlmLayout

    v1 = dict(layers=2, kv_heads=2, head_dim=16, v_head_dim=16, max_seq_len=32, vocab=256, dtype="float32")
    v1 |= dict(outputs=["logits", "present_k", "present_v"], cache="explicit", version=1)
    old = LlmLayout.from_json(json.dumps(v1))
    assert old.cache == "explicit" and old.version == 1 and old.past_inputs == "stacked"
    past_k, past_v = torch.zeros(old.cache_shape()), torch.ones(old.cache_shape(values=True))
    assert [tuple(t.shape) for t in old.past_args(past_k, past_v)] == [(2, 1, 2, 32, 16)] * 2
    rows = old.with_cache("rows")
    assert (rows.cache, rows.outputs[1:], rows.version) == ("rows", ("new_k", "new_v"), 3)
    assert rows.inputs == ("input_ids", "cache_position", "past_0", "past_1", "past_2", "past_3")
    split = rows.past_args(past_k, past_v, 8)  # each layer's keys, then values, first 8 slots
    assert [tuple(t.shape) for t in split] == [(1, 2, 8, 16)] * 4 and [float(t.sum()) for t in split] == [
        0.0,
        0.0,
        256.0,
        256.0,
    ]
    assert LlmLayout.from_json(rows.to_json()) == rows
    # a layout without past_step (written before the prefix cache) passes all slots
    assert rows.past_step == 0 and rows.past_length(5) == 32
    prefix = old.with_past_step(8).with_cache("rows")
    assert [prefix.past_length(p) for p in (0, 1, 8, 9, 31)] == [8, 8, 8, 16, 32]
    assert prefix.with_cache("explicit").past_step == 0  # the whole cache out: all slots in
    assert LlmLayout.from_json(prefix.to_json()) == prefix
    for bad in ({**v1, "cache": "paged"}, {**v1, "version": 99}, {**v1, "past_inputs": "paged"}):
        with pytest.raises(ArtifactFormatError, match="newer dualexport"):
            LlmLayout.from_json(json.dumps(bad))


# ------------------------------------------------------------------ a user's own decoder module
class UserBlock(torch.nn.Module):
    """Attention with learned positions and SDPA, written against the cache protocol only:
    ``cache.update(k, v, layer_idx)`` returns every slot, the mask compares slot and position."""

    def __init__(self, dim: int, heads: int, layer: int) -> None:
        super().__init__()
        self.heads, self.layer = heads, layer
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim)
        )
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = cache.update(k, v, self.layer)
        slots = torch.arange(k.shape[2])
        mask = slots.view(1, -1) <= position_ids.view(-1, 1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.norm2(x))


class UserDecoder(torch.nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 32, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.blocks = torch.nn.ModuleList(UserBlock(dim, heads, i) for i in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values: Any
    ) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, position_ids, past_key_values)
        return self.head(x)


def user_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """The module's own greedy loop on a growing transformers DynamicCache (no dualexport)."""
    from transformers import DynamicCache

    cache, ids, pos = DynamicCache(), list(prompt), 0
    with torch.no_grad():
        feed = prompt
        for _ in range(n):
            positions = torch.arange(pos, pos + len(feed)).unsqueeze(0)
            logits = model(torch.tensor([feed]), position_ids=positions, past_key_values=cache)
            pos += len(feed)
            feed = [int(logits[0, -1].argmax())]
            ids.append(feed[0])
    return ids


@pytest.mark.parametrize("target", ["onnx", pytest.param("xnnpack", marks=pytest.mark.slow)])
def test_users_own_decoder_module(target: str, tmp_path: pathlib.Path) -> None:
    """Not transformers: a module with the same forward exports and generates its own tokens.
    Its mask compares slot indices with positions, which holds only for the whole cache: the
    eager check before the trace sends it to the dense program (the rows one would attend to the
    empty slots at the new positions), and the file says so."""
    torch.manual_seed(3)
    model = UserDecoder().eval()
    # the slow case also makes the runner .pte of a whole-cache (dense) program
    res = dx.export_llm(
        model, max_seq_len=24, out_dir=tmp_path, name="user", target=target, deploy=target == "xnnpack"
    )
    assert res.ok, dict(res.errors)
    layout = read_layout(res.artifacts[target].path)
    assert (layout.layers, layout.kv_heads, layout.head_dim, layout.vocab) == (2, 2, 16, 96)
    assert (layout.cache, layout.outputs) == ("explicit", ("logits", "present_k", "present_v"))
    for prompt in ([5, 9, 1], list(range(40, 56))):
        want = user_greedy(model, prompt, 6)
        assert len(set(want[len(prompt) :])) >= 3
        assert dx.generate(res.artifacts[target].path, prompt, max_new_tokens=6).tolist() == [want]
        if res.deploy is not None:  # the runner .pte, its whole cache in buffers
            assert dx.generate(res.deploy.pte, prompt, max_new_tokens=6).tolist() == [want]
    res.verify_weights()


# --------------------------------------------------------------------------------------- CLI
def test_cli_generate(llama: Exported, capsys: pytest.CaptureFixture[str]) -> None:
    """`dualexport generate FILE --ids ... -n ...` prints the tokens dx.generate returns; past
    max_seq_len it exits 2 and says what to try."""
    from dualexport.cli import main

    for art in llama.res.artifacts.values():
        capsys.readouterr()
        assert main(["generate", str(art.path), "--ids", "1,2,3", "-n", "5", "--no-eos"]) == 0
        want = dx.generate(art.path, [1, 2, 3], max_new_tokens=5, stop_at_eos=False)[0, 3:].tolist()
        assert f"new:    {want}" in capsys.readouterr().out
        assert main(["generate", str(art.path), "--ids", "1,2,3", "-n", str(T)]) == 2
        printed = capsys.readouterr().out
        assert "max_seq_len" in printed and "What to try" in printed


@pytest.mark.slow
def test_cli_export_llm_from_a_config_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dualexport export-llm CONFIG.json --compare` (the README's command): a folder the
    generate command runs, generation parity written beside it."""
    import json

    from dualexport.cli import main

    out = tmp_path / "out"
    config = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tiny_llama.json"
    code = main(["export-llm", str(config), "--max-seq-len", "16", "--out", str(out), "--compare"])
    assert code == 0, capsys.readouterr().out
    # the runner files at the top (a config file has no tokenizer: none ships), dualexport's own
    # files (the weight manifest, the parity report) in .dualexport
    assert {"model.onnx", "model.pte", "genai_config.json"} <= {p.name for p in out.iterdir()}
    own = out / ".dualexport"
    assert {"model.weights.json", "model.generation.json"} <= {p.name for p in own.iterdir()}
    assert json.loads((own / "model.generation.json").read_text())["ok"] is True
    capsys.readouterr()
    assert main(["generate", str(out / "model.pte"), "--ids", "1,2,3", "-n", "5"]) == 0
    assert "new:" in capsys.readouterr().out


def test_export_llm_attention_option_reaches_transformers(tmp_path: pathlib.Path) -> None:
    """`--attention` (and ``load_decoder(attention=)``): the reference model of a config file runs
    the implementation asked for; without it, transformers' own default (SDPA), as users get it; a
    name transformers does not know and a module of the user's own are refused."""
    from dualexport.cli import build_parser
    from dualexport.errors import InputError
    from dualexport.llm import load_decoder

    config = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tiny_llama.json"
    assert load_decoder(config).config._attn_implementation == "sdpa"
    assert load_decoder(config, attention="eager").config._attn_implementation == "eager"
    with pytest.raises(InputError, match="flash"):
        load_decoder(config, attention="flash")
    with pytest.raises(InputError, match="module of your own"):
        load_decoder("dualexport.examples:TinyMLP", attention="eager")
    ns = build_parser().parse_args(["export-llm", str(config), "--max-seq-len", "8", "--attention", "eager"])
    assert ns.attention == "eager"
    assert build_parser().parse_args(["export-llm", str(config), "--max-seq-len", "8"]).attention is None


def test_a_decoder_that_sizes_its_own_mask_by_the_past_exports(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """BioGPT builds ``torch.ones(batch, past + S)`` when no ``attention_mask`` is given, the past
    length being the cache's (a traced ``cache_position[0]``): torch.export cannot capture that
    size. export_llm retries the trace with the mask given, all ones over the cache (the same
    meaning: no padding), and both files generate transformers' tokens in one delegate. Measured
    2026-12-05: 1 subgraph, 89.3% of compute ops (the padding mask's ``and``/``where`` and the
    learned positions' lookup stay outside)."""
    import logging

    import transformers

    caplog.set_level(logging.INFO, logger="dualexport.llm.export")
    config = transformers.BioGptConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = transformers.BioGptForCausalLM(config).eval()
    res = dx.export_llm(model, max_seq_len=T, out_dir=tmp_path, name="biogpt", deploy=False)
    assert res.ok, dict(res.errors)
    assert "retrying with one" in caplog.text  # the fallback ran (the plain trace fails)
    d = res.artifacts["xnnpack"].delegation
    assert d.subgraphs <= 2 + 2 and d.delegated_share >= 0.85, d.to_markdown()
    report = generation_parity(res, model, prompts=prompts(), max_new_tokens=NEW)
    assert report.ok, report
    for p in report.prompts:
        for rt, toks in p.tokens.items():
            assert toks == p.reference, (rt, toks, p.reference)
    res.verify_weights()

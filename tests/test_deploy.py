"""Deploy folders (issue 50): ``export_llm`` writes what the runtimes' own LLM runners load, from
one trace. A tiny Llama (seeded random weights) with a byte-level BPE tokenizer trained here on a
license text (its alphabet the text's ASCII characters, so every token is whole UTF-8: ExecuTorch's
Python binding cannot hand a partial character to its callback); ExecuTorch's ``TextLLMRunner``
and onnxruntime-genai's ``Generator`` each answer text prompts with transformers' greedy tokens;
``dx.generate`` and ``dualexport generate FOLDER --prompt`` on the same folder; and a deploy file
wired wrongly (caches swapped between layers, a cache write dropped) is refused by its proof and
not published. One export for the module."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dualexport as dx
from dualexport.errors import ProofMismatchError

T = 48
NEW = 8
TEXT = pathlib.Path("/usr/share/common-licenses/Apache-2.0")
PROMPTS = ("the License", "Copyright notice")
CHAT = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def trained_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dualexport.loading import allow_torchvision

    allow_torchvision()
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator([TEXT.read_text()], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.chat_template = CHAT
    return fast


@dataclasses.dataclass(frozen=True)
class Deployed:
    model: Any
    tokenizer: Any
    res: Any
    folder: pathlib.Path


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    import transformers

    tokenizer = trained_tokenizer()
    from test_llm import COMMON

    config = transformers.LlamaConfig(
        **{**COMMON, "vocab_size": len(tokenizer)}, bos_token_id=None, eos_token_id=None
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("deploy")
    res = dx.export_llm(model, max_seq_len=T, out_dir=folder, tokenizer=tokenizer)
    assert res.ok, dict(res.errors)
    return Deployed(model, tokenizer, res, folder)


def hf_new_tokens(d: Deployed, text: str, n: int = NEW) -> list[int]:
    ids = d.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        out = d.model.generate(ids, max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, ids.shape[1] :]]


def test_folder_holds_what_the_runners_load(deployed: Deployed) -> None:
    """The runner files, the config and the tokenizer at the top; dualexport's own files (the
    proven explicit-cache files, the re-export cache, the lock) in .dualexport; each runner file
    proven by generation walks."""
    folder, deploy = deployed.folder, deployed.res.deploy
    shipped = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert {
        "model.pte",
        "model.onnx",
        "genai_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= shipped
    assert not any(n.endswith((".pt2", ".npz", ".lock")) for n in shipped)
    assert not (folder / ".model.lock").exists()
    cache = folder / ".dualexport"
    assert (cache / "model.pt2").is_file() and (cache / "model.inputs.npz").is_file()
    assert {p.name for p in deploy.files} == shipped
    assert set(deploy.proofs) == {"xnnpack", "onnx"}
    for proof in deploy.proofs.values():
        assert len(proof.walks) == 3 and proof.worst_snr_db > 100, proof
    # one .pte: made from the shared program, no explicit-cache .pte lowered beside it (issue 51)
    assert set(deployed.res.artifacts) == {"onnx"} and not (cache / "model.pte").exists()
    found = deploy.weights["xnnpack"]  # the weight proof of its own copies, read from disk
    assert found.get("exact", 0) >= 2 * 7 + 2 and not {"missing", "mismatch"} & set(found), found
    assert deploy.delegation["xnnpack"].subgraphs >= 1
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx" and decoder["num_hidden_layers"] == 2
    assert config["model"]["context_length"] == T and decoder["num_key_value_heads"] == 2
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == CHAT


def test_runner_files_use_each_runtimes_own_llm_attention(deployed: Deployed) -> None:
    """A float decoder with a causal mask: the .pte's attention is ExecuTorch's update_cache +
    custom_sdpa on caches inside the program (said by the constant method its runner reads), the
    .onnx's is GroupQueryAttention with onnxruntime-genai's shared past/present buffer and the
    rotary embedding inside the op: no Softmax, MatMul by a rotation or Concat of the past left."""
    import onnx

    from dualexport.llm.deploy.executorch import FUSED_ATTENTION
    from dualexport.llm.layout import read_layout
    from dualexport.runtimes.executorch import uses_llm_ops

    folder, deploy = deployed.folder, deployed.res.deploy
    packed = "com.microsoft::GroupQueryAttention (packed QKV)"
    assert deploy.attention == {"xnnpack": FUSED_ATTENTION, "onnx": packed}
    assert uses_llm_ops(folder / "model.pte")
    # and, as ExecuTorch's own LLM export, only the last position's logits (what its runner reads)
    assert (
        read_layout(folder / "model.pte").last_logits and not read_layout(folder / "model.onnx").last_logits
    )
    graph = onnx.load(folder / "model.onnx", load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("GroupQueryAttention") == 2 and "Softmax" not in ops and "Concat" not in ops, ops
    gqa = next(n for n in graph.node if n.op_type == "GroupQueryAttention")
    assert {a.name: a.i for a in gqa.attribute if a.type == onnx.AttributeProto.INT}["do_rotary"] == 1
    # one projection per layer feeds GQA's packed QKV input (its key and value inputs empty), as
    # onnxruntime-genai's builder writes it: 2 layers x (q|k|v, o, gate, up, down) + the head
    assert list(gqa.input[1:3]) == ["", ""] and ops.count("MatMul") == 2 * 5 + 1, ops
    assert [o.name for o in graph.output] == ["logits"] + [
        f"present.{i}.{kv}" for kv in ("key", "value") for i in range(2)
    ]
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is True


def test_text_llm_runner_answers_as_transformers(deployed: Deployed) -> None:
    """ExecuTorch's own runner over the folder's .pte: the text of each new token is the text of
    transformers' greedy token."""
    from dualexport.llm.deploy.runners import run_runner

    for text in PROMPTS:
        want = [deployed.tokenizer.decode([t]) for t in hf_new_tokens(deployed, text)]
        answer = run_runner(deployed.folder, text, runtime="xnnpack", max_new_tokens=NEW)
        assert list(answer.pieces) == want, (text, answer)


def test_genai_generator_answers_as_transformers(deployed: Deployed) -> None:
    """onnxruntime-genai's og.Model(folder) and Generator: the same token ids as transformers."""
    from dualexport.llm.deploy.runners import run_runner

    for text in PROMPTS:
        answer = run_runner(deployed.folder, text, runtime="onnx", max_new_tokens=NEW)
        assert list(answer.tokens or ()) == hf_new_tokens(deployed, text), text


def test_dx_generate_drives_the_runner_files(deployed: Deployed) -> None:
    """``dx.generate`` on the runner files themselves: token ids in, ids out; text in, text out."""
    ids = deployed.tokenizer(PROMPTS[0]).input_ids
    want = hf_new_tokens(deployed, PROMPTS[0])
    for name in ("model.pte", "model.onnx"):
        tokens = dx.generate(deployed.folder / name, ids, max_new_tokens=NEW)
        assert tokens[0, len(ids) :].tolist() == want, name
        text = dx.generate(deployed.folder / name, PROMPTS[0], max_new_tokens=NEW)
        assert text == deployed.tokenizer.decode(want, skip_special_tokens=True), name


def test_generation_parity_includes_the_runner_files(deployed: Deployed) -> None:
    from dualexport.llm.parity import generation_parity

    report = generation_parity(deployed.res, deployed.model, max_new_tokens=4)
    assert {"xnnpack:runner", "onnx:genai"} <= set(report.runtimes)
    assert report.ok, report.to_markdown()


def test_cli_generate_prints_the_same_text_on_both_runtimes(
    deployed: Deployed, capsys: pytest.CaptureFixture[str]
) -> None:
    from dualexport.cli import main

    texts = {}
    for runtime in ("xnnpack", "onnx"):
        code = main(
            [
                "generate",
                str(deployed.folder),
                "--prompt",
                "the License",
                "-n",
                str(NEW),
                "--runtime",
                runtime,
            ]
        )
        assert code == 0
        texts[runtime] = capsys.readouterr().out.splitlines()[0]
    want = deployed.tokenizer.decode(hf_new_tokens(deployed, "the License"))
    assert texts["xnnpack"] == texts["onnx"] == want.splitlines()[0], texts
    code = main(["generate", str(deployed.folder), "--prompt", "the License", "--chat", "-n", "4"])
    assert code == 0 and capsys.readouterr().out.strip()


def _redeploy(d: Deployed, folder: pathlib.Path, target: str) -> Any:
    """Write the deploy folder of ``d``'s export again, for ``target`` alone, into ``folder``."""
    from dualexport.exporters import ExportOptions
    from dualexport.llm.deploy import write_deploy_folder
    from dualexport.llm.layout import read_layout

    # the .pte is made from the shared program alone: no explicit-cache .pte in the result
    kept = {t: a for t, a in d.res.artifacts.items() if t == target}
    res = dataclasses.replace(d.res, artifacts=kept, errors={})
    layout = read_layout(d.res.artifacts["onnx"].path)
    return write_deploy_folder(
        res,
        layout,
        folder,
        "model",
        model=d.model,
        tokenizer=d.tokenizer,
        options=ExportOptions(),
        targets=(target,),
    )


def test_a_runner_pte_without_a_weight_of_the_program_is_refused_naming_it(deployed: Deployed) -> None:
    """The .pte's weight proof: a weight whose bytes the file does not hold (here the program's
    digest of one projection changed, as a stale or patched copy would differ) is named."""
    import types

    from dualexport.llm.deploy.runner_weights import prove_runner_weights

    shared = deployed.res.program
    name = next(n for n in shared.state_dict if n.endswith("self_attn.q_proj.weight"))
    digests = {**shared.weight_digests(), name: "0" * 64}
    stale = types.SimpleNamespace(exported_program=shared.exported_program, weight_digests=lambda: digests)
    lowered = types.SimpleNamespace(weight_notes={}, derived_copies={})
    decomposed = types.SimpleNamespace(graph_signature=shared.exported_program.graph_signature)
    with pytest.raises(dx.WeightMismatchError, match=name.replace(".", r"\.")):
        prove_runner_weights(deployed.folder / "model.pte", stale, lowered, decomposed)


def test_the_pte_is_made_and_proven_when_the_onnx_fails(
    deployed: Deployed, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy folder's .pte needs no explicit file: an export whose .onnx failed still ships
    the .pte, proven by value and by its weights, and says why there is no .onnx."""
    from dualexport.errors import OnnxLoweringError
    from dualexport.exporters.onnx import OnnxExporter

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OnnxLoweringError("refused for this test", target="onnx")

    monkeypatch.setattr(OnnxExporter, "lower", refuse)
    res = dx.export_llm(deployed.model, max_seq_len=T, out_dir=tmp_path, tokenizer=deployed.tokenizer)
    assert set(res.errors) == {"onnx"} and not res.artifacts
    deploy = res.deploy
    assert deploy.pte == tmp_path / "model.pte" and deploy.pte.is_file() and deploy.onnx is None
    assert deploy.proofs["xnnpack"].worst_snr_db > 100 and "exact" in deploy.weights["xnnpack"]
    assert "onnx" in deploy.skipped and not (tmp_path / "model.onnx").exists()


def test_a_genai_file_with_layers_caches_swapped_is_refused(
    deployed: Deployed, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .onnx with layer 0's and layer 1's past inputs swapped (a wiring slip onnxruntime-genai
    would feed without complaint): the walks refuse it and nothing of it is published."""
    from dualexport.llm.deploy import genai

    names = genai.past_names

    def swapped(layers: int) -> list[str]:
        out = names(layers)
        out[0], out[1] = out[1], out[0]
        return out

    monkeypatch.setattr(genai, "past_names", swapped)
    folder = _redeploy(deployed, tmp_path, "onnx")
    assert isinstance(folder.errors.get("onnx:genai"), ProofMismatchError), folder.errors
    assert "decode step" in folder.errors["onnx:genai"].message
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "genai_config.json").exists()


def test_a_runner_pte_that_drops_a_cache_write_is_refused(
    deployed: Deployed, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .pte whose program forgets layer 1's values after each call: it prefills right and
    decodes wrong; the walks refuse it at the first decode step."""
    from dualexport.llm.deploy import executorch

    real = executorch.CacheInBuffers.forward

    def forgetful(self: Any, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        logits = real(self, input_ids, cache_position)
        self.v_cache_1.zero_()
        return logits

    monkeypatch.setattr(executorch.CacheInBuffers, "forward", forgetful)
    folder = _redeploy(deployed, tmp_path, "xnnpack")
    err = folder.errors.get("xnnpack:runner")
    assert isinstance(err, ProofMismatchError) and "decode step 1" in err.message, folder.errors
    assert not (tmp_path / "model.pte").exists()


def test_fused_attention_slips_are_refused_and_the_programs_own_attention_ships(
    deployed: Deployed, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtimes' own attention ops are held to the shared program like the rest: a .pte whose
    custom_sdpa scales the scores by 1/D instead of 1/sqrt(D), a .onnx whose rotary tables are
    one position late, and one whose packed projection puts the keys before the queries, are
    refused by the walks; the folder then ships each file with the program's own attention,
    proven, and says why."""
    from dualexport.llm.deploy import cached_attention, genai_attention

    real_attention = cached_attention.cached_attention

    def squared_scale(*args: Any) -> torch.Tensor:
        *rest, scale = args
        return real_attention(*rest, scale * scale)

    monkeypatch.setattr(cached_attention, "cached_attention", squared_scale)
    folder = _redeploy(deployed, tmp_path / "pte", "xnnpack")
    assert folder.ok and folder.pte is not None and folder.pte.is_file(), folder.errors
    why = folder.attention["xnnpack"]
    assert why.startswith("the program's own: the fused file was refused") and "decode step" in why, why
    assert folder.proofs["xnnpack"].worst_snr_db > 100

    real_plan = genai_attention._rotary_plan

    def late(*args: Any) -> Any:
        plan = real_plan(*args)
        assert plan is not None
        plan["tables"] = [t[[0, *range(len(t) - 1)]] for t in plan["tables"]]
        return plan

    monkeypatch.setattr(genai_attention, "_rotary_plan", late)
    folder = _redeploy(deployed, tmp_path / "onnx", "onnx")
    assert folder.ok and folder.onnx is not None, folder.errors
    assert folder.attention["onnx"].startswith("the program's own: the fused file was refused")
    config = json.loads((tmp_path / "onnx" / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is False  # the Concat graph's own I/O
    assert folder.proofs["onnx"].worst_snr_db > 100
    monkeypatch.setattr(genai_attention, "_rotary_plan", real_plan)

    from dualexport.llm.deploy import genai_packing

    real_pack = genai_packing._pack

    def key_first(ir: Any, graph: Any, gqa: Any, parts: list[Any], layer: int) -> None:
        real_pack(ir, graph, gqa, [parts[1], parts[0], parts[2]], layer)  # k|q|v: a layout slip

    monkeypatch.setattr(genai_packing, "_pack", key_first)
    folder = _redeploy(deployed, tmp_path / "packed", "onnx")
    assert folder.ok and folder.onnx is not None, folder.errors
    assert folder.attention["onnx"].startswith("the program's own: the fused file was refused")


def test_a_hub_id_loads_from_the_local_cache_with_its_tokenizer(
    deployed: Deployed, tmp_path: pathlib.Path
) -> None:
    """A model as users name it on the Hub (``org/name``), offline: read from the local Hugging
    Face cache (laid out here as the Hub client lays it out), the tokenizer with it."""
    import subprocess
    import sys

    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / "0123abc"
    deployed.model.save_pretrained(snapshot)
    deployed.tokenizer.save_pretrained(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abc")
    code = (
        "from dualexport.llm import load_decoder\n"
        "from dualexport.llm.deploy.tokenizer import resolve_tokenizer\n"
        "m = load_decoder('tiny-org/tiny-llama')\n"
        "t = resolve_tokenizer(None, 'tiny-org/tiny-llama', m)\n"
        "print(type(m).__name__, len(t), sum(p.numel() for p in m.parameters()))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    params = sum(p.numel() for p in deployed.model.parameters())
    assert out.stdout.split()[-3:] == ["LlamaForCausalLM", str(len(deployed.tokenizer)), str(params)], (
        out.stdout
    )
    missing = subprocess.run(
        [sys.executable, "-c", "from dualexport.llm import load_decoder; load_decoder('tiny-org/absent')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert missing.returncode != 0 and "offline" in missing.stderr and "InputError" in missing.stderr


def test_a_wrong_tokenizer_is_refused_before_the_export(deployed: Deployed, tmp_path: pathlib.Path) -> None:
    from dualexport.errors import InputError

    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no tokenizer"):
        dx.export_llm(deployed.model, max_seq_len=T, out_dir=tmp_path / "out", tokenizer=tmp_path / "empty")
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="transformers tokenizer or a path"):
        dx.export_llm(deployed.model, max_seq_len=T, out_dir=tmp_path / "out", tokenizer=42)

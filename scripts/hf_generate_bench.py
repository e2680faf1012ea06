#!/usr/bin/env python3
"""transformers' `generate` on the shapes `agent-r1 bench decode` runs: the baseline of
scripts/bench_gpu.sh. Same model directory (random weights from `agent-r1 init-model`), same
device and dtype, same prompt length and new tokens (no early stop), sampling at temperature
1. One JSON object per batch size on stdout."""

import argparse
import json
import sys
import time

import torch
import transformers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="a Hugging Face model directory")
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", help="float32, bf16 or auto (bf16 on CUDA)")
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {a.device}: CUDA is not available here", file=sys.stderr)
        return 2
    dtypes = {"float32": torch.float32, "bf16": torch.bfloat16}
    if a.dtype == "auto":
        dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    elif a.dtype in dtypes:
        dtype = dtypes[a.dtype]
    else:
        print(f"--dtype: got {a.dtype}; allowed: float32, bf16, auto", file=sys.stderr)
        return 2
    model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype)
    model = model.to(a.device).eval()
    vocab = model.config.vocab_size
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    for batch in [int(b) for b in a.batch_sizes.split(",")]:
        ids = torch.tensor(
            [[(e * 7919 + i * 104729) % vocab for i in range(a.prompt_len)] for e in range(batch)],
            device=a.device,
        )
        kwargs = dict(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=a.new_tokens,
            min_new_tokens=a.new_tokens,
            pad_token_id=0,
        )
        with torch.inference_mode():
            warm = {**kwargs, "max_new_tokens": 4, "min_new_tokens": 4}
            model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), **warm)
            best = None
            for _ in range(a.repeats):
                sync()
                began = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
                sync()
                wall = time.perf_counter() - began
                best = wall if best is None else min(best, wall)
        generated = (out.shape[1] - a.prompt_len) * batch
        print(json.dumps({
            "bench": "hf_generate",
            "model": a.model,
            "device": a.device,
            "dtype": str(dtype).removeprefix("torch."),
            "batch": batch,
            "prompt_len": a.prompt_len,
            "new_tokens": a.new_tokens,
            "tokens_generated": generated,
            "wall_s": best,
            "tokens_per_s": generated / best,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reference outputs from PEFT for the LoRA parity tests.

make DIR ARCH TARGETS  -> writes a tiny random float32 checkpoint of ARCH (see
                          model_reference.py) to DIR/base and a PEFT LoRA adapter on it with
                          random non-zero A and B (r=4, lora_alpha=8, TARGETS: "all-linear" or
                          comma-separated module names) to DIR/adapter, and prints JSON with the
                          adapted model's logits for a prompt and its 16 greedy tokens.
score BASE ADAPTER     -> loads BASE with transformers and ADAPTER with peft, reads
                          {"ids": [...]} on stdin and prints {"logits": [[...]]}.
"""
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_reference import build  # noqa: E402


def make(out, arch, targets):
    torch.manual_seed(4321)
    model, _, _, _ = build(arch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "embed" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.2)
    base_dir = os.path.join(out, "base")
    model.to(torch.float32).save_pretrained(base_dir, safe_serialization=True)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    target_modules = targets if targets == "all-linear" else targets.split(",")
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=target_modules,
                        init_lora_weights=False, task_type="CAUSAL_LM")
    peft = get_peft_model(base, config).eval()
    peft.save_pretrained(os.path.join(out, "adapter"))
    vocab = base.config.vocab_size
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, vocab, (1, 40), generator=g)
    with torch.no_grad():
        logits = peft(input_ids=ids).logits[0]
        gen = peft.generate(input_ids=ids, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                            pad_token_id=0, eos_token_id=None)
    print(json.dumps({
        "ids": ids[0].tolist(),
        "logits": logits.tolist(),
        "greedy": gen[0, ids.shape[1]:].tolist(),
    }))


def score(base_dir, adapter):
    ids = json.load(sys.stdin)["ids"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    print(json.dumps({"logits": logits.tolist()}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "score":
        score(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r} (make | score)")

"""Reference outputs from Hugging Face transformers for the model parity test.

make DIR ARCH  -> writes a tiny random checkpoint (ARCH: qwen2 | llama) to DIR and prints
                  JSON with reference logits, greedy generations and a padded batch.
score DIR      -> loads DIR with transformers (a checkpoint written by agent-r1), reads
                  {"ids": [...]} on stdin and prints {"logits": [[...]]}.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def make(out, arch):
    torch.manual_seed(1234)
    common = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  rms_norm_eps=1e-6)
    if arch == "qwen2":
        cfg = Qwen2Config(rope_theta=1000000.0, tie_word_embeddings=True, **common)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, **common)
        model = LlamaForCausalLM(cfg)
    model.eval()
    with torch.no_grad():
        # Default init leaves biases at zero and norms at one, and its greedy output collapses
        # into one repeated token; this scale gives varied generations, so each parameter
        # and each decode step matters to the comparison.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "embed" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (1, 40), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0]
        gen = model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        short = ids[:, :17]
        pad = ids.shape[1] - short.shape[1]
        batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=ids.dtype), short], 1), ids], 0)
        mask = torch.cat([torch.cat([torch.zeros(1, pad, dtype=ids.dtype), torch.ones_like(short)], 1),
                          torch.ones_like(ids)], 0)
        bgen = model.generate(batch, attention_mask=mask, max_new_tokens=32, min_new_tokens=32,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
    print(json.dumps({
        "ids": ids[0].tolist(),
        "logits": logits.tolist(),
        "greedy": gen[0, ids.shape[1]:].tolist(),
        "short_ids": short[0].tolist(),
        "batch_greedy": bgen[:, batch.shape[1]:].tolist(),
    }))


def score(path):
    ids = json.load(sys.stdin)["ids"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    print(json.dumps({"logits": logits.tolist()}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "score":
        score(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r} (make | score)")

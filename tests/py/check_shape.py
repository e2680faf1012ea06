"""Loads a model directory written by `agent-r1 init-model --shape` with transformers.

check_shape.py DIR [--config-only] < {"ids": [...]}  ->  prints {"architecture", "parameters",
"config" (the model config's shape fields), "tokenizer_len", "prompt_ids" (the chat template
with a tool, tokenized), "logits" (float32, for the ids; null with --config-only, which reads
no weights: the model is built from DIR's config.json on the meta device, so a directory
without weights can be checked)}.
"""
import json
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]}}}]


def main(path, with_logits):
    ids = json.load(sys.stdin)["ids"]
    if with_logits:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Who wrote Hamlet?"}]
    prompt = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                     tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    logits = None
    if with_logits:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].tolist()
    c = model.config
    print(json.dumps({
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": {k: getattr(c, k) for k in ["vocab_size", "hidden_size", "intermediate_size",
                                               "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "head_dim"]},
        "tokenizer_len": len(tok),
        "prompt_ids": [int(i) for i in prompt],
        "logits": logits,
    }))


if __name__ == "__main__":
    main(sys.argv[1], "--config-only" not in sys.argv[2:])

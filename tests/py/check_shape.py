"""Loads a model directory written by `agent-r1 init-model --shape` with transformers.

check_shape.py DIR < {"ids": [...]}  ->  prints {"architecture", "parameters", "config"
(the model config's shape fields), "tokenizer_len", "prompt_ids" (the chat template with a
tool, tokenized), "logits" (float32, for the ids)}.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]}}}]


def main(path):
    ids = json.load(sys.stdin)["ids"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Who wrote Hamlet?"}]
    prompt = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                     tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    c = model.config
    print(json.dumps({
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": {k: getattr(c, k) for k in ["vocab_size", "hidden_size", "intermediate_size",
                                               "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "head_dim"]},
        "tokenizer_len": len(tok),
        "prompt_ids": [int(i) for i in prompt],
        "logits": logits.tolist(),
    }))


if __name__ == "__main__":
    main(sys.argv[1])

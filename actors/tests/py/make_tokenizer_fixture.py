#!/usr/bin/env python3
"""Renders chat-template cases with transformers, as the reference for agent-r1's Rust renderer.

Input (JSON file): {"cases": [{"name": str, "tokenizer_dir": str, "messages": [...],
"tools": [...] or null, "add_generation_prompt": bool, "kwargs": {...} (optional: extra template
variables such as enable_thinking)}, ...]}
Output (JSON file): {"transformers": version, "results": [{"name": str, "text": str,
"ids": [int, ...]}, ...]}

Each case goes through AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template twice:
tokenize=False for the text and tokenize=True for the ids, exactly as a Python trainer would.
Used by actors/tests/chat_template_parity.rs; run it by hand with the same arguments to debug.
"""
import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", required=True, help="input JSON file")
    parser.add_argument("--out", required=True, help="output JSON file")
    args = parser.parse_args()

    import transformers
    from transformers import AutoTokenizer

    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)["cases"]

    tokenizers = {}
    results = []
    for case in cases:
        directory = case["tokenizer_dir"]
        if directory not in tokenizers:
            tokenizers[directory] = AutoTokenizer.from_pretrained(directory)
        tok = tokenizers[directory]
        kwargs = dict(
            tools=case.get("tools"),
            add_generation_prompt=case["add_generation_prompt"],
            **case.get("kwargs", {}),
        )
        text = tok.apply_chat_template(case["messages"], tokenize=False, **kwargs)
        ids = tok.apply_chat_template(case["messages"], tokenize=True, **kwargs)
        # transformers 5 returns a BatchEncoding by default, 4.x a plain list.
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        results.append({"name": case["name"], "text": text, "ids": [int(i) for i in ids]})

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "results": results}, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Loads a model directory with transformers and writes it again as transformers does
(`save_pretrained`: its config.json, safetensors layout and tokenizer files), so a test
starts from a directory as a user downloads or fine-tunes one.

    resave_with_transformers.py SRC_DIR OUT_DIR
"""

import sys

from transformers import AutoModelForCausalLM, AutoTokenizer

src, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(src)
model.save_pretrained(out)
AutoTokenizer.from_pretrained(src).save_pretrained(out)

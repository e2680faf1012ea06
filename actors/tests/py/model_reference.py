"""Reference outputs from Hugging Face transformers for the model parity tests.

make DIR ARCH  -> writes a tiny random checkpoint of ARCH to DIR and prints JSON with
                  reference logits, prompt log-probabilities, greedy generations (with their
                  log-probabilities) and a left-padded batch. ARCH:
                    qwen2    Qwen2, float32, one file, tied embeddings
                    llama    Llama, float32, untied
                    qwen3    Qwen3 (q/k norms, head_dim != hidden/heads), bfloat16 weights,
                             sharded
                    llama31  Llama 3.1 (llama3 rope scaling, tied), float16 weights; its
                             prompt is longer than original_max_position_embeddings, and
                             "unscaled_logit_diff" says how far the logits move without the
                             scaling (so the test shows the scaling is applied)
                    mistral  Mistral (no sliding window), float32, sharded
score DIR      -> loads DIR with transformers (a checkpoint written by agent-r1), reads
                  {"ids": [...]} on stdin and prints {"logits": [[...]]}.
"""
import json
import sys

import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
              rms_norm_eps=1e-6)

LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}


def build(arch):
    """(model, save dtype, max shard size, prompt length)"""
    if arch == "qwen2":
        cfg = Qwen2Config(rope_theta=1000000.0, tie_word_embeddings=True, **COMMON)
        return Qwen2ForCausalLM(cfg), torch.float32, None, 40
    if arch == "llama":
        cfg = LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                          **COMMON)
        return LlamaForCausalLM(cfg), torch.float32, None, 40
    if arch == "qwen3":
        cfg = Qwen3Config(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                          tie_word_embeddings=False, attention_bias=False, **COMMON)
        return Qwen3ForCausalLM(cfg), torch.bfloat16, "100KB", 40
    if arch == "llama31":
        cfg = LlamaConfig(rope_parameters=dict(LLAMA31_ROPE), tie_word_embeddings=True,
                          attention_bias=False, bos_token_id=None, eos_token_id=None, **COMMON)
        return LlamaForCausalLM(cfg), torch.float16, None, 200
    if arch == "mistral":
        cfg = MistralConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                            sliding_window=None, tie_word_embeddings=False, **COMMON)
        return MistralForCausalLM(cfg), torch.float32, "150KB", 40
    sys.exit(f"unknown arch {arch!r}")


def make(out, arch):
    torch.manual_seed(1234)
    model, save_dtype, shard, prompt_len = build(arch)
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
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(save_dtype).save_pretrained(out, safe_serialization=True, **kwargs)
    # The reference runs in float32 on exactly the stored weights, as agent-r1 loads them.
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (1, prompt_len), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0]
        prompt_lp = logits[:-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        gen = model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                             pad_token_id=0, eos_token_id=None, output_logits=True,
                             return_dict_in_generate=True)
        tokens = gen.sequences[0, ids.shape[1]:]
        gen_lp = [step[0].float().log_softmax(-1)[t].item() for step, t in zip(gen.logits, tokens)]
        short = ids[:, :17]
        pad = ids.shape[1] - short.shape[1]
        batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=ids.dtype), short], 1), ids], 0)
        mask = torch.cat([torch.cat([torch.zeros(1, pad, dtype=ids.dtype), torch.ones_like(short)], 1),
                          torch.ones_like(ids)], 0)
        bgen = model.generate(batch, attention_mask=mask, max_new_tokens=32, min_new_tokens=32,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
    ref = {
        "ids": ids[0].tolist(),
        "logits": logits.tolist(),
        "prompt_logprobs": prompt_lp.tolist(),
        "greedy": tokens.tolist(),
        "greedy_logprobs": gen_lp,
        "short_ids": short[0].tolist(),
        "batch_greedy": bgen[:, batch.shape[1]:].tolist(),
    }
    if arch == "llama31":
        plain = model.config.to_dict()
        plain["rope_parameters"] = {"rope_type": "default", "rope_theta": LLAMA31_ROPE["rope_theta"]}
        unscaled = LlamaForCausalLM(LlamaConfig.from_dict(plain)).eval()
        unscaled.load_state_dict(model.state_dict())
        with torch.no_grad():
            ref["unscaled_logit_diff"] = (unscaled(ids).logits[0] - logits).abs().max().item()
    print(json.dumps(ref))


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

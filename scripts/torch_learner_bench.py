#!/usr/bin/env python3
"""`agent-r1 bench learner --estimators grpo`, written in plain PyTorch + transformers.

The same synthetic batch (the LCG ids, the prompt/action/observation layout, the sampling
log-probabilities, the rewards and groups), the same update (GRPO advantages, PPO's clipped
surrogate with dual clip, token-mean aggregation, micro-batches accumulating into one AdamW
step per mini-batch, gradient clipping at a global norm of 1.0) and the same warm-up and
timed updates, on a Hugging Face model directory loaded with AutoModelForCausalLM. Its
purpose is a baseline on the same device: how fast, and in how much memory, a competent
plain-PyTorch learner does what agent-r1's learner does.

Written as a PyTorch engineer would, not as a transliteration of the Rust:
  * bf16 weights with float32 master copies and float32 AdamW moments (torch.optim.AdamW,
    fused where the device has the fused kernel, over the float32 masters);
  * attention by transformers' default, SDPA (with no padding it runs causal, i.e. flash
    attention on a GPU);
  * log-probabilities only at the action positions, in float32, `--logits-chunk-tokens`
    positions at a time, with a hand-written backward that recomputes each chunk's logits,
    so no [tokens x vocab] tensor exists (the same compute as agent-r1's token_stats: one
    projection without grad, one more per chunk in the backward).

Output (--json): one object shaped like bench learner's (`results[0]` holds `mean_update_s`,
`tokens_per_s`, `updates[*].policy_loss`, ...), plus `peak_mb` (CUDA: the caching
allocator's max_memory_allocated; CPU: the process's peak RSS), `peak_reserved_mb` (CUDA),
and the first timed update's `policy_loss` and `grad_norm` (global L2 norm before clipping).

Differences from agent-r1 that do not change the work done:
  * the mini-batch shuffle uses torch's RNG, not agent-r1's ChaCha12: with
    --mini-batch-size 0 (the whole batch in one step) the token-mean loss and the gradient
    do not depend on the order (up to float summation order);
  * the gradient-clip coefficient is applied to the float32 copy of a bf16 gradient rather
    than to the bf16 gradient (one rounding fewer; identical in float32).
"""

import argparse
import json
import math
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

# PPO clip settings and AdamW settings: agent-r1's LearnerConfig defaults.
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.2, 3.0
MAX_LOG_RATIO = 20.0
GRPO_EPS = 1e-6
LR, WEIGHT_DECAY, BETAS, ADAM_EPS, GRAD_CLIP = 1e-6, 0.01, (0.9, 0.999), 1e-8, 1.0

MASK64 = (1 << 64) - 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model directory")
    p.add_argument("--estimators", default="grpo",
                   help="only `grpo` (accepted so that bench learner's flags can be reused)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="auto", help="float32, bf16 or auto (bf16 on CUDA)")
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--action-tokens", type=int, default=48)
    p.add_argument("--observation-tokens", type=int, default=32)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--ppo-epochs", type=int, default=1)
    p.add_argument("--mini-batch-size", type=int, default=0, help="0 = the whole batch")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--logits-chunk-tokens", type=int, default=1024)
    p.add_argument("--recompute", action="store_true",
                   help="recompute each decoder layer in the backward (transformers' "
                        "gradient checkpointing), as agent-r1's --recompute")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train PEFT LoRA adapters of this rank (alpha twice the rank, every "
                        "projection: target_modules='all-linear') beside the frozen weights; "
                        "0 trains the full weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.estimators != "grpo":
        p.error("only --estimators grpo is implemented")
    for name in ("updates", "trajectories", "group_size", "steps", "action_tokens",
                 "ppo_epochs", "micro_batch_size", "logits_chunk_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return a


def placement(device, dtype):
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if dtype == "auto":
        dtype = "bf16" if device.type == "cuda" else "float32"
    kinds = {"float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if dtype not in kinds:
        sys.exit(f"--dtype: expected float32 or bf16, got {dtype}")
    return device, kinds[dtype]


# ---------------------------------------------------------------------------------------
# The synthetic batch (src/cmd/bench_learner.rs, `synthetic_batch`).
# ---------------------------------------------------------------------------------------

def synthetic_batch(args, vocab):
    """Trajectories as dicts; the ids come from the same 64-bit LCG, in the same order."""
    state = (args.seed * 6364136223846793005 + 1) & MASK64

    def tokens(n):
        nonlocal state
        out = []
        for _ in range(n):
            state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
            out.append((state >> 33) % vocab)
        return out

    # `uniform - 0.01 * (i % 7)`, every operation in float32 as in the Rust.
    uniform = -torch.tensor(float(vocab), dtype=torch.float32).log()
    i = torch.arange(args.action_tokens) % 7
    logprobs = uniform - torch.tensor(0.01, dtype=torch.float32) * i.to(torch.float32)
    batch = []
    for e in range(args.trajectories):
        prompt = tokens(args.prompt_tokens)
        steps = []
        for _ in range(args.steps):
            action = tokens(args.action_tokens)
            steps.append((action, logprobs, tokens(args.observation_tokens)))
        batch.append({
            "group_id": e // args.group_size,
            "prompt_ids": prompt,
            "steps": steps,
            "reward": float(e % 3 == 0),
        })
    return batch


def build_batch(trajectories, max_len, device):
    """Right-padded tensors (actors/src/learner/batch.rs): `ids`/`input_mask` [B, T];
    `action_mask`/`old_logprobs` [B, L = T - 1] over target positions (column j is about
    token j + 1); per-trajectory scores (outcome + process rewards) and group ids."""
    streams = []
    for t in trajectories:
        s = list(t["prompt_ids"])
        for action, _, obs in t["steps"]:
            s += action
            s += obs
        streams.append(s)
    T = max(2, max(min(len(s), max_len) for s in streams))
    B, L = len(trajectories), T - 1
    ids = torch.zeros(B, T, dtype=torch.int64)
    input_mask = torch.zeros(B, T, dtype=torch.bool)
    action_mask = torch.zeros(B, L, dtype=torch.float32)
    old = torch.zeros(B, L, dtype=torch.float32)
    for r, (t, s) in enumerate(zip(trajectories, streams)):
        n = min(len(s), max_len)
        ids[r, :n] = torch.tensor(s[:n], dtype=torch.int64)
        input_mask[r, :n] = True
        pos = len(t["prompt_ids"])
        for action, lp, obs in t["steps"]:
            # Stream positions [pos, pos + len(action)) that survive truncation, p >= 1.
            lo, hi = max(pos, 1), min(pos + len(action), n)
            if hi > lo:
                action_mask[r, lo - 1:hi - 1] = 1.0
                old[r, lo - 1:hi - 1] = lp[lo - pos:hi - pos]
            pos += len(action) + len(obs)
    # Process rewards are 0 in the synthetic batch, so a trajectory's score is its outcome.
    scores = torch.tensor([t["reward"] for t in trajectories], dtype=torch.float64)
    return {
        "ids": ids.to(device),
        "input_mask": input_mask.to(device),
        "action_mask": action_mask.to(device),
        "old_logprobs": old.to(device),
        "scores": scores.to(torch.float32).to(device),
        "group_ids": [t["group_id"] for t in trajectories],
    }


def grpo_advantages(scores, group_ids):
    """(s - mean) / (std + 1e-6) per group, unbiased std; a group of one: mean 0, std 1
    (verl's convention, as actors/src/algo/group.rs)."""
    index = {}
    idx = torch.tensor([index.setdefault(g, len(index)) for g in group_ids],
                       device=scores.device)
    counts = torch.bincount(idx, minlength=len(index)).to(scores.dtype)
    sums = torch.zeros(len(index), dtype=scores.dtype, device=scores.device)
    means = (sums.index_add(0, idx, scores) / counts)
    means = torch.where(counts > 1, means, torch.zeros_like(means))[idx]
    sq = torch.zeros_like(sums).index_add(0, idx, (scores - means).square())
    stds = (sq / (counts - 1).clamp_min(1.0)).sqrt()
    stds = torch.where(counts > 1, stds, torch.ones_like(stds))[idx]
    return (scores - means) / (stds + GRPO_EPS)


# ---------------------------------------------------------------------------------------
# Chunked log-probabilities at the action positions.
# ---------------------------------------------------------------------------------------

class ChunkedTargetLogProbs(torch.autograd.Function):
    """log p(target) [N] (and the entropy [N], without gradient) of hidden rows h [N, H]
    under the output projection `weight` [V, H], `chunk` rows at a time in float32.

    Autograd through a loop of `log_softmax(h_c @ W.T)` would keep every chunk's [C, V]
    float32 output alive until the backward, i.e. the whole [N, V]. Here the forward keeps
    only h, and the backward recomputes one chunk's logits at a time:
    d log p_t / d logits = onehot(t) - softmax(logits).
    """

    @staticmethod
    def forward(ctx, h, weight, targets, chunk):
        logps, ents = [], []
        for s in range(0, h.shape[0], chunk):
            log_p = torch.log_softmax((h[s:s + chunk] @ weight.T).float(), dim=-1)
            logps.append(log_p.gather(-1, targets[s:s + chunk, None]).squeeze(-1))
            # Entropy is reported (not trained on), as agent-r1's learner does.
            ents.append(-(log_p.exp() * log_p.clamp_min(torch.finfo(torch.float32).min))
                        .sum(-1))
            del log_p
        ctx.save_for_backward(h, weight, targets)
        ctx.chunk = chunk
        entropy = torch.cat(ents)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logps), entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        h, weight, targets = ctx.saved_tensors
        chunk = ctx.chunk
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for s in range(0, h.shape[0], chunk):
            hc, g = h[s:s + chunk], grad_logp[s:s + chunk, None]
            # d(sum g * log p_t)/d logits = g * (onehot(t) - p), built in place on p.
            d = torch.softmax((hc @ weight.T).float(), dim=-1).mul_(-g)
            d.scatter_add_(1, targets[s:s + chunk, None], g)
            d = d.to(h.dtype)
            if grad_h is not None:
                torch.mm(d, weight, out=grad_h[s:s + chunk])
            if grad_w is not None:
                grad_w.addmm_(d.T, hc)
            del d
        return grad_h, grad_w, None, None


# ---------------------------------------------------------------------------------------
# AdamW with float32 masters for low-precision parameters.
# ---------------------------------------------------------------------------------------

class MasterAdamW:
    """torch.optim.AdamW over float32 weights. A bf16 parameter trains on a float32 master
    copy (its moments are float32 too, as the optimizer's state follows the master) and is
    rounded from it after each step: at lr 1e-6 a bf16 weight alone would not move.
    A float32 parameter is its own master and is stepped in place."""

    def __init__(self, params, device):
        self.params = params
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().clone()
                        for p in params]
        # The fused kernel (one launch for all tensors, no foreach temporaries) where the
        # device has one; torch's default foreach implementation otherwise.
        fused = device.type in ("cuda", "cpu")
        self.opt = torch.optim.AdamW(self.masters, lr=LR, betas=BETAS, eps=ADAM_EPS,
                                     weight_decay=WEIGHT_DECAY, fused=fused)

    def grad_norm(self):
        """Global L2 norm of the gradients (float32 per tensor, float64 across)."""
        norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32)
                 for p in self.params if p.grad is not None]
        if not norms:
            return 0.0
        return torch.stack(norms).double().square().sum().sqrt().item()

    def zero_grad(self):
        for p, m in zip(self.params, self.masters):
            p.grad = None
            m.grad = None

    @torch.no_grad()
    def step(self, clip_coef):
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                continue
            if m is not p:
                # Free each bf16 gradient as its float32 copy is made, so the copies cost
                # the difference, not the sum.
                m.grad = p.grad.float()
                p.grad = None
            if clip_coef < 1.0:
                m.grad.mul_(clip_coef)
        self.opt.step()
        low = [(p, m) for p, m in zip(self.params, self.masters) if m is not p]
        if low:
            torch._foreach_copy_([p for p, _ in low], [m for _, m in low])
        self.zero_grad()


# ---------------------------------------------------------------------------------------
# The learner.
# ---------------------------------------------------------------------------------------

class Learner:
    def __init__(self, model, args, device):
        self.model = model
        self.args = args
        self.device = device
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            sys.exit("an output projection with a bias is not supported")
        self.head_weight = head.weight  # the embedding matrix itself when tied
        self.params = [p for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0])
                       if p.requires_grad]
        self.opt = MasterAdamW(self.params, device)
        self.max_len = args.prompt_tokens + args.steps * (args.action_tokens
                                                          + args.observation_tokens)
        self.shuffle = torch.Generator().manual_seed(args.seed)

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def update(self, trajectories):
        start = time.perf_counter()
        b = build_batch(trajectories, self.max_len, self.device)
        stats = {
            "tokens": int(b["input_mask"].sum().item()),
            "action_tokens": int(b["action_mask"].sum().item()),
        }
        advantages = grpo_advantages(b["scores"], b["group_ids"])
        n = b["ids"].shape[0]
        mini = n if self.args.mini_batch_size == 0 else min(self.args.mini_batch_size, n)
        sums = {"policy_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip": 0.0,
                "grad_norm": 0.0, "mini_batches": 0}
        steps = skipped = 0
        for _ in range(self.args.ppo_epochs):
            order = torch.randperm(n, generator=self.shuffle).tolist()
            for c in range(0, n, mini):
                applied = self.train_mini_batch(b, advantages, order[c:c + mini], sums)
                if applied is not None:
                    steps += int(applied)
                    skipped += int(not applied)
        self.sync()  # the last optimizer step's kernels belong to this update
        seconds = time.perf_counter() - start
        m = max(sums["mini_batches"], 1)
        stats.update(
            seconds=seconds,
            tokens_per_s=stats["tokens"] * self.args.ppo_epochs / seconds,
            action_tokens_per_s=stats["action_tokens"] * self.args.ppo_epochs / seconds,
            optimizer_steps=steps,
            skipped_steps=skipped,
            policy_loss=sums["policy_loss"] / m,
            entropy=sums["entropy"] / m,
            approx_kl=sums["approx_kl"] / m,
            clip_fraction=sums["clip"] / m,
            grad_norm=sums["grad_norm"] / max(steps, 1),
        )
        return stats

    def train_mini_batch(self, b, advantages, rows, sums):
        """Gradient accumulation over the micro-batches of `rows`, then one step; returns
        whether the step was applied (None: nothing to train on)."""
        index = torch.tensor(rows, device=self.device)
        mask_all = b["action_mask"].index_select(0, index)
        total = mask_all.sum(dtype=torch.float64).item()
        if total <= 0:
            return None
        self.opt.zero_grad()
        step = {"policy_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip": 0.0}
        finite = True
        micro = self.args.micro_batch_size
        for s in range(0, len(rows), micro):
            idx = index[s:s + micro]
            mask = b["action_mask"].index_select(0, idx)
            # Token-mean: a micro-batch weighs by its share of the mini-batch's action
            # tokens, so the accumulated gradient is the whole mini-batch's.
            w = mask.sum(dtype=torch.float64).item() / total
            if w == 0.0:
                continue
            ids = b["ids"].index_select(0, idx)
            hidden = self.model.model(input_ids=ids,
                                      attention_mask=b["input_mask"].index_select(0, idx),
                                      use_cache=False).last_hidden_state
            sel = mask.bool()
            h = hidden[:, :-1][sel]           # [N, H]: the states that predict actions
            targets = ids[:, 1:][sel]
            old = b["old_logprobs"].index_select(0, idx)[sel]
            adv = advantages[idx].unsqueeze(1).expand_as(mask)[sel]
            logp, entropy = ChunkedTargetLogProbs.apply(
                h, self.head_weight, targets, self.args.logits_chunk_tokens)
            # PPO clipped surrogate with dual clip (actors/src/algo/policy_loss.rs).
            log_ratio = (logp - old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
            ratio = log_ratio.exp()
            unclipped = -adv * ratio
            clipped = -adv * ratio.clamp(1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
            ppo = torch.maximum(unclipped, clipped)
            per_token = torch.where(adv < 0, torch.minimum(ppo, -adv * CLIP_C), ppo)
            count = sel.sum(dtype=torch.float32) + 1e-8  # masked_mean's denominator
            loss = per_token.sum() / count
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                finite = False
                continue
            with torch.no_grad():
                step["policy_loss"] += w * loss_value
                step["entropy"] += w * (entropy.sum() / count).item()
                step["approx_kl"] += w * ((-log_ratio).sum() / count).item()
                step["clip"] += w * ((clipped > unclipped).float().sum() / count).item()
            (loss * w).backward()
            del hidden, h, logp, entropy, loss
        norm = self.opt.grad_norm()
        if not (finite and math.isfinite(norm)):
            self.opt.zero_grad()
            return False
        self.opt.step(GRAD_CLIP / (norm + 1e-6))
        for k, v in step.items():
            sums[k] += v
        sums["grad_norm"] += norm
        sums["mini_batches"] += 1
        return True


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def main(argv=None):
    args = parse_args(argv)
    device, dtype = placement(args.device, args.dtype)
    torch.manual_seed(args.seed)
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype,
                                                 attn_implementation="sdpa")
    model.to(device).train()
    if args.recompute:
        # Every decoder layer; the name changed in transformers 5.x (the old one warns).
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_rank > 0:
        import peft
        # Injects the adapters into `model` itself (float32, as agent-r1's) and freezes the
        # rest, so the learner below trains the adapters alone.
        peft.get_peft_model(model, peft.LoraConfig(
            r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
            target_modules="all-linear"))
    vocab = model.config.vocab_size
    batch = synthetic_batch(args, vocab)
    tokens_per_trajectory = args.prompt_tokens + args.steps * (args.action_tokens
                                                               + args.observation_tokens)
    learner = Learner(model, args, device)
    # Warm-up on one micro-batch-sized slice (untimed), as bench learner: allocator growth,
    # kernel selection, and the optimizer state (moments) exists before the timed updates.
    learner.update(batch[:max(1, min(args.micro_batch_size, len(batch)))])
    runs = []
    for u in range(args.updates):
        stats = learner.update(batch)
        if stats["skipped_steps"]:
            sys.exit(f"update {u} skipped {stats['skipped_steps']} steps")
        runs.append(stats)
        if not args.json:
            print(f"grpo update {u}: {stats['seconds']:.2f} s, "
                  f"{stats['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    seconds = [r["seconds"] for r in runs]
    mean, best = sum(seconds) / len(seconds), min(seconds)
    tokens = runs[0]["tokens"] * args.ppo_epochs
    actions = runs[0]["action_tokens"] * args.ppo_epochs
    result = {
        "estimator": "grpo",
        "value_head": False,
        "mean_update_s": mean,
        "best_update_s": best,
        "tokens_per_s": tokens / mean,
        "action_tokens_per_s": actions / mean,
        "best_tokens_per_s": tokens / best,
        "peak_rss_mb": peak_rss_mb(),
        "policy_loss": runs[0]["policy_loss"],
        "grad_norm": runs[0]["grad_norm"],
        "updates": runs,
    }
    if device.type == "cuda":
        result["peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        result["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    else:
        result["peak_mb"] = result["peak_rss_mb"]
    out = {
        "bench": "learner",
        "implementation": "pytorch",
        "model": args.model,
        "parameters": sum(p.numel() for p in learner.params),
        "vocab_size": vocab,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": model.config._attn_implementation,
        "torch_threads": torch.get_num_threads(),
        "trajectories": args.trajectories,
        "tokens_per_trajectory": tokens_per_trajectory,
        "action_tokens_per_trajectory": args.steps * args.action_tokens,
        "ppo_epochs": args.ppo_epochs,
        "mini_batch_size": args.mini_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "logits_chunk_tokens": args.logits_chunk_tokens,
        "recompute": args.recompute,
        "lora_rank": args.lora_rank,
        "results": [result],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"learner throughput (PyTorch): {args.model} ({out['parameters']} parameters), "
              f"{args.trajectories} trajectories x {tokens_per_trajectory} tokens, "
              f"{device} {out['dtype']}, {out['torch_threads']} torch threads")
        print(f"{'mean s/upd':>12} {'tokens/s':>12} {'peak MB':>10} {'policy loss':>14} "
              f"{'grad norm':>12}")
        print(f"{mean:>12.3f} {result['tokens_per_s']:>12.0f} {result['peak_mb']:>10.0f} "
              f"{result['policy_loss']:>14.6g} {result['grad_norm']:>12.6g}")


if __name__ == "__main__":
    main()

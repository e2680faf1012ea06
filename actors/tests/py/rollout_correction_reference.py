"""The sampler/trainer mismatch estimators and rollout corrections, written from the
published formulas in plain PyTorch (float64, autograd for the gradient):

- k3 KL estimate (Schulman, "Approximating KL divergence"): with x ~ q and r = p(x)/q(x),
  KL(q || p) is estimated by (r - 1) - log r; here q is the sampler, p the trainer.
- truncated importance sampling (Yao et al., "Your Efficient RL Framework Secretly Brings
  You Off-Policy RL Training", 2025): each token's policy-gradient term is scaled by
  min(pi_trainer / pi_sampler, C); the sequence-level form uses the product over the
  sequence's tokens.
- masked importance sampling / rejection (verl's rollout correction, "MIS"): tokens, whole
  sequences, or sequences by their geometric-mean ratio, outside [lower, upper] leave the
  loss, its denominator included.
- the PPO clipped surrogate with dual clip (verl's compute_policy_loss_vanilla), token-mean.

Reads a JSON file of cases (inputs and agent-r1's outputs) and prints one JSON object:
{"reference": [outputs per case], "mutants": {name: [outputs per case]}}: every mutant
changes one term, so that a test can show each term matters on these batches.
"""

import json
import sys

import torch

MUTANTS = [
    "abs_mean_counts_masked_tokens",
    "abs_max_over_masked_tokens",
    "k3_sign_of_log_term",
    "k1_instead_of_k3",
    "threshold_on_ratio_not_log",
    "sequence_sum_of_abs",
    "tis_without_cap",
    "tis_ratio_inverted",
    "sequence_tis_mean_not_sum",
    "reject_without_lower",
    "reject_without_upper",
    "geometric_as_sequence",
    "rejected_stay_in_denominator",
    "weight_inside_clip",
    "no_dual_clip",
]


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def reference(case, mutant=None):
    trainer, sampler, mask = t(case["trainer"]), t(case["sampler"]), t(case["mask"]) != 0
    cfg = case["config"]
    delta = torch.where(mask, (trainer - sampler).clamp(-20, 20), torch.zeros_like(trainer))
    n = mask.sum()
    count = mask.numel() if mutant == "abs_mean_counts_masked_tokens" else n
    if mutant == "abs_max_over_masked_tokens":
        abs_max = (trainer - sampler).nan_to_num(0.0).abs().max()
    else:
        abs_max = delta.abs()[mask].max()
    rho = delta.exp()
    if mutant == "k3_sign_of_log_term":
        k3 = rho - 1 + delta
    elif mutant == "k1_instead_of_k3":
        k3 = -delta
    else:
        k3 = rho - 1 - delta
    if mutant == "threshold_on_ratio_not_log":
        over = (rho - 1).abs() > cfg["report_threshold"]
    else:
        over = delta.abs() > cfg["report_threshold"]
    seq = delta.abs().sum(1) if mutant == "sequence_sum_of_abs" else delta.sum(1).abs()
    stats = {
        "tokens": float(n),
        "abs_mean": float(delta.abs()[mask].sum() / count),
        "abs_max": float(abs_max),
        "kl_k3": float(k3[mask].sum() / n),
        "over_threshold": float((over & mask).sum() / n),
        "sequence_abs_max": float(seq.max()),
    }

    # The correction weight.
    ratio = (-delta).exp() if mutant == "tis_ratio_inverted" else rho
    cap = float("inf") if mutant == "tis_without_cap" else cfg["weight_cap"]
    lengths = mask.sum(1, keepdim=True).clamp(min=1)
    if cfg["weight"] == "token":
        weight = ratio.clamp(max=cap)
    elif cfg["weight"] == "sequence":
        log_seq = delta.sum(1, keepdim=True)
        if mutant == "sequence_tis_mean_not_sum":
            log_seq = log_seq / lengths
        weight = log_seq.clamp(max=20).exp().clamp(max=cap).expand_as(delta)
    else:
        weight = torch.ones_like(delta)
    weight = torch.where(mask, weight, torch.ones_like(weight))

    # Rejection.
    lo = 0.0 if mutant == "reject_without_lower" else cfg["reject_lower"]
    hi = float("inf") if mutant == "reject_without_upper" else cfg["reject_upper"]

    def inside(r):
        return (r >= lo) & (r <= hi)

    if cfg["reject"] == "token":
        keep = inside(rho)
    elif cfg["reject"] == "sequence" or (
        cfg["reject"] == "geometric" and mutant == "geometric_as_sequence"
    ):
        keep = inside(delta.sum(1, keepdim=True).exp()).expand_as(delta)
    elif cfg["reject"] == "geometric":
        keep = inside((delta.sum(1, keepdim=True) / lengths).exp()).expand_as(delta)
    else:
        keep = torch.ones_like(mask)
    keep = keep | ~mask

    # The corrected PPO loss around the trainer's log-probabilities, and its gradient.
    log_prob = t(case["log_prob"]).requires_grad_(True)
    adv = t(case["advantages"])
    low, high, c = cfg["clip_ratio_low"], cfg["clip_ratio_high"], cfg["clip_ratio_c"]
    r = (log_prob - trainer).clamp(-20, 20).exp()
    w = weight
    if mutant == "weight_inside_clip":
        unclipped, clipped = -adv * (w * r), -adv * (w * r).clamp(1 - low, 1 + high)
        w = torch.ones_like(w)
    else:
        unclipped, clipped = -adv * r, -adv * r.clamp(1 - low, 1 + high)
    per_token = torch.maximum(unclipped, clipped)
    if mutant != "no_dual_clip":
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * c), per_token)
    per_token = per_token * w
    loss_mask = mask if mutant == "rejected_stay_in_denominator" else mask & keep
    numer = (per_token * (mask & keep)).sum()
    # An empty loss (every token rejected) trains nothing: 0, as agent-r1 aggregates it.
    loss = numer / loss_mask.sum().clamp(min=1)
    loss.backward()
    return {
        "stats": stats,
        "weight": weight.flatten().tolist(),
        "keep": keep.to(torch.float64).flatten().tolist(),
        "loss": float(loss),
        "grad": log_prob.grad.flatten().tolist(),
    }


def finite(x):
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else 1e300
    if isinstance(x, list):
        return [finite(v) for v in x]
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    return x


def main():
    cases = json.load(open(sys.argv[1]))
    out = {
        "reference": [reference(c) for c in cases],
        "mutants": {m: [reference(c, m) for c in cases] for m in MUTANTS},
    }
    # A mutant may overflow; JSON has no inf or NaN, and such a value matches nothing.
    print(json.dumps(finite(out)))


if __name__ == "__main__":
    main()

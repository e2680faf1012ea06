# A Python mirror of agent-r1's engine decode step (same ops, same layouts) to find where a
# step's time goes on the GPU, and what flash decode, float32 sampling and a CUDA graph give.
import sys, time, torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import os
dev = os.environ.get("DEV", "cuda"); bf = torch.bfloat16
SHAPES = {"0.5b": dict(h=896, inter=4864, L=24, heads=14, kvh=2, d=64),
          "1.5b": dict(h=1536, inter=8960, L=28, heads=12, kvh=2, d=128)}
V = 151936
def model(s):
    h, inter, L, heads, kvh, d = s["h"], s["inter"], s["L"], s["heads"], s["kvh"], s["d"]
    r = lambda *sh: torch.randn(*sh, dtype=bf, device=dev) * 0.02
    layers = [dict(ln1=torch.ones(h, dtype=bf, device=dev), q=r(heads*d, h), qb=r(heads*d), k=r(kvh*d, h), kb=r(kvh*d),
                   v=r(kvh*d, h), vb=r(kvh*d), o=r(h, heads*d), ln2=torch.ones(h, dtype=bf, device=dev),
                   g=r(inter, h), u=r(inter, h), dn=r(h, inter)) for _ in range(L)]
    return dict(layers=layers, emb=r(V, h), norm=torch.ones(h, dtype=bf, device=dev),
                inv=1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev).float() / d)), **s)
def rms(x, w, eps=1e-6):
    xf = x.float(); var = xf.pow(2).mean(-1, keepdim=True); return w * (xf * (var + eps).rsqrt()).to(x.dtype)
def rot_half(x):
    hf = x.shape[3] // 2; return torch.cat([-x[..., hf:], x[..., :hf]], -1)
def step(m, cache, lens, ids, variant, statics=None):
    """One decode step as worker.rs + slots.rs + model.rs + layers.rs + sampling.rs do it."""
    L, heads, kvh, d = m["L"], m["heads"], m["kvh"], m["d"]
    rows = ids.shape[0]; cap1 = cache.shape[4]; group = heads // kvh
    if statics is None:
        # begin_chunk: one upload of positions, lens, counts, write index
        host = []
        for b in range(rows): host.append(lens[b])
        host += lens + [1] * rows
        for b in range(rows):
            for hh in range(kvh): host.append((b * kvh + hh) * cap1 + lens[b])
        up = torch.tensor(host, device=dev)
        positions = up[:rows].view(rows, 1); widx = up[3 * rows:]
        attend = max(lens) + 1
        lt = up[rows:2 * rows].view(rows, 1, 1)
        s = torch.arange(attend, device=dev).view(1, 1, attend)
        mask = (s <= lt) & (s < lt + 1)
        bias = torch.zeros(rows, 1, group, attend, dtype=bf, device=dev).masked_fill_(~mask.unsqueeze(1).repeat(1, 1, group, 1), float("-inf"))
        used = None
    else:
        positions, widx, used, cq, ck = statics; attend = cap1
    freqs = positions.float().unsqueeze(-1) * m["inv"].view(1, 1, -1)
    emb = torch.cat([freqs, freqs], -1); cos = emb.cos().to(bf).unsqueeze(1); sin = emb.sin().to(bf).unsqueeze(1)
    x = m["emb"][ids]  # [rows, 1, h]
    for l, p in enumerate(m["layers"]):
        hN = rms(x, p["ln1"])
        q = F.linear(hN, p["q"], p["qb"]).view(rows, 1, heads, d).transpose(1, 2)
        k = F.linear(hN, p["k"], p["kb"]).view(rows, 1, kvh, d).transpose(1, 2)
        v = F.linear(hN, p["v"], p["vb"]).view(rows, 1, kvh, d).transpose(1, 2)
        q = q * cos + rot_half(q) * sin; k = k * cos + rot_half(k) * sin
        K = cache[l, 0]; Vv = cache[l, 1]
        K.view(-1, d).index_copy_(0, widx, k.reshape(-1, d)); Vv.view(-1, d).index_copy_(0, widx, v.reshape(-1, d))
        if variant["attn"] == "sdpa":
            kk = K[:rows, :, :attend]; vv = Vv[:rows, :, :attend]
            o = F.scaled_dot_product_attention(q.reshape(rows, kvh, group, d), kk, vv, attn_mask=bias).reshape(rows, heads, 1, d)
        else:
            qf = q.reshape(rows * kvh * group, 1, d)
            o = torch.ops.aten._flash_attention_forward(qf, K.view(-1, 1, d), Vv.view(-1, 1, d), cq, ck, group, cap1, 0.0, False, False, seqused_k=used)[0]
            o = o.view(rows, heads, 1, d)
        o = o.transpose(1, 2).reshape(rows, 1, heads * d)
        x = x + F.linear(o, p["o"])
        h2 = rms(x, p["ln2"])
        x = x + F.linear(F.silu(F.linear(h2, p["g"])) * F.linear(h2, p["u"]), p["dn"])
    hid = rms(x, m["norm"]).squeeze(1)
    logits = hid @ m["emb"].t()
    lf = logits.float()
    draws = variant["draws"]
    if variant["sample"] == "double":
        cdf = lf.softmax(-1, dtype=torch.float64).cumsum(-1, dtype=torch.float64)
        thr = draws.double().unsqueeze(-1) * cdf[:, -1:]
        tok = torch.searchsorted(cdf, thr, right=True).squeeze(-1).clamp_max(V - 1)
    elif variant["sample"] == "float":
        cdf = lf.softmax(-1).cumsum(-1)
        thr = draws.float().unsqueeze(-1) * cdf[:, -1:]
        tok = torch.searchsorted(cdf, thr, right=True).squeeze(-1).clamp_max(V - 1)
    else:  # gumbel-max with a counter hash on the device
        g = variant["gumbel"]
        tok = (lf - torch.log(-torch.log(g))).argmax(-1)
    lp = lf.log_softmax(-1).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    return torch.stack([tok.double(), lp.double()], 1)
def run(shape, rows, variants, ctx=640, cap1=769, prof=False):
    m = model(SHAPES[shape]); L, kvh, d = m["L"], m["kvh"], m["d"]
    cache = torch.randn(L, 2, rows, kvh, cap1, d, dtype=bf, device=dev)
    lens = [ctx - (b % 7) for b in range(rows)]
    ids = torch.randint(0, V, (rows, 1), device=dev)
    draws = torch.rand(rows, device=dev)
    gumbel = torch.rand(rows, V, device=dev).clamp_min(1e-20)
    out = {}
    for name, var in variants.items():
        var = dict(var, draws=draws, gumbel=gumbel)
        statics = None
        if var["attn"] == "flash":
            positions = torch.tensor(lens, device=dev).view(rows, 1)
            widx = torch.tensor([(b * kvh + hh) * cap1 + lens[b] for b in range(rows) for hh in range(kvh)], device=dev)
            used = torch.tensor(lens, device=dev, dtype=torch.int32).add(1).repeat_interleave(kvh)
            n = rows * kvh; group = m["heads"] // kvh
            cq = torch.arange(n + 1, device=dev, dtype=torch.int32) * group; ck = torch.arange(n + 1, device=dev, dtype=torch.int32) * cap1
            statics = (positions, widx, used, cq, ck)
        f = lambda: step(m, cache, lens, ids, var, statics)
        for _ in range(3): f()
        torch.cuda.synchronize()
        if var.get("graph"):
            g = torch.cuda.CUDAGraph(); st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                f(); torch.cuda.synchronize()
                with torch.cuda.graph(g): res = f()
            torch.cuda.synchronize()
            f2 = lambda: (g.replay(), res.cpu())
        else:
            f2 = lambda: f().cpu()
        n = 20; t = time.perf_counter()
        for _ in range(n): f2()
        ms = (time.perf_counter() - t) / n * 1e3
        out[name] = ms
        print(f"{shape} rows={rows} {name}: {ms:.2f} ms/step", flush=True)
        if prof and name == "engine-today":
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                for _ in range(3): f2()
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    del cache, m; torch.cuda.empty_cache()
    return out
V_TODAY = {"engine-today": dict(attn="sdpa", sample="double"),
           "float-sampling": dict(attn="sdpa", sample="float"),
           "flash+gumbel": dict(attn="flash", sample="gumbel"),
           "flash+gumbel graph": dict(attn="flash", sample="gumbel", graph=True),
           "flash+float graph": dict(attn="flash", sample="float", graph=True)}
if __name__ == "__main__":
    torch.manual_seed(0)
    run("0.5b", 64, V_TODAY, prof=True)
    for shape, rows in [("0.5b", 1), ("0.5b", 256), ("1.5b", 256)]:
        run(shape, rows, {k: v for k, v in V_TODAY.items() if k != "float-sampling"})

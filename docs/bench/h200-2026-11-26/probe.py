# Run-1 probe: which fused attention kernels take per-row key lengths over our slot layout,
# are they right, how fast, do they capture in a CUDA graph; and what a graph of many tiny
# kernels costs per kernel.
import time, torch, traceback
dev = "cuda"
torch.manual_seed(0)
def bench(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n
print("torch", torch.__version__, torch.cuda.get_device_name())
# copy bandwidth
x = torch.empty(2**30, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x), 20); print(f"copy {2*2**30/ms/1e6:.0f} GB/s (read+write)")
del x, y
for (rows, kvh, group, d, cap) in [(256, 2, 7, 64, 1024), (256, 2, 6, 128, 1024), (64, 2, 7, 64, 1024)]:
    try:
        cache = torch.randn(rows, kvh, cap + 1, d, dtype=torch.bfloat16, device=dev)
        vcache = torch.randn_like(cache)
        lens = torch.randint(500, 800, (rows,), device=dev, dtype=torch.int32)
        q = torch.randn(rows, kvh * group, 1, d, dtype=torch.bfloat16, device=dev)  # [B, heads, t=1, D]
        # reference: grouped sdpa with bias over attend = max len
        attend = int(lens.max())
        s = torch.arange(attend, device=dev)
        bias = torch.zeros(rows, 1, group, attend, dtype=torch.bfloat16, device=dev)
        bias.masked_fill_((s[None, :] >= lens[:, None])[:, None, None, :], float("-inf"))
        def ref():
            g = q.reshape(rows, kvh, group, d)
            return torch.nn.functional.scaled_dot_product_attention(g, cache[:, :, :attend], vcache[:, :, :attend], attn_mask=bias)
        out_ref = ref().float()
        t_ref = bench(ref)
        kv_bytes = 2 * rows * kvh * float(lens.float().mean()) * d * 2
        print(f"shape rows={rows} kvh={kvh} group={group} d={d}: sdpa+bias {t_ref*1e3:.0f} us ({kv_bytes/t_ref/1e6:.0f} GB/s)")
        # flash varlen: each (row, kv head) a sequence of `group` queries, one head
        qf = q.reshape(rows * kvh * group, 1, d)
        kf = cache.view(rows * kvh * (cap + 1), 1, d); vf = vcache.view(rows * kvh * (cap + 1), 1, d)
        n = rows * kvh
        cq = (torch.arange(n + 1, device=dev, dtype=torch.int32) * group)
        ck = (torch.arange(n + 1, device=dev, dtype=torch.int32) * (cap + 1))
        used = lens.repeat_interleave(kvh).to(torch.int32)
        def fl():
            return torch.ops.aten._flash_attention_forward(qf, kf, vf, cq, ck, group, cap + 1, 0.0, False, False, seqused_k=used)[0]
        try:
            o = fl().view(rows, kvh, group, d).float()
            err = ((o - out_ref).norm() / out_ref.norm()).item()
            t = bench(fl)
            print(f"  flash varlen seqused_k: err {err:.2e}, {t*1e3:.0f} us ({kv_bytes/t/1e6:.0f} GB/s)")
        except Exception as ex:
            print("  flash varlen failed:", repr(ex)[:300])
        # efficient attention with seqlen_k: BMHK, M = group
        qe = q.reshape(rows, kvh, group, d).transpose(1, 2)  # [B, group, kvh, D] -> M=group, H=kvh
        ke = cache.transpose(1, 2); ve = vcache.transpose(1, 2)  # [B, S, H, D] strided
        def ef():
            return torch.ops.aten._efficient_attention_forward(qe, ke, ve, None, None, None, None, None, 0.0, 0, False, seqlen_k=lens)[0]
        try:
            o = ef().transpose(1, 2).float()
            err = ((o - out_ref).norm() / out_ref.norm()).item()
            t = bench(ef)
            print(f"  efficient seqlen_k: err {err:.2e}, {t*1e3:.0f} us ({kv_bytes/t/1e6:.0f} GB/s)")
        except Exception as ex:
            print("  efficient seqlen_k failed:", repr(ex)[:300])
        # graph capture of the flash call
        try:
            g = torch.cuda.CUDAGraph(); st = torch.cuda.Stream()
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                fl(); torch.cuda.synchronize()
                with torch.cuda.graph(g): outg = fl()
            lens.copy_(torch.randint(100, 1000, (rows,), device=dev, dtype=torch.int32)); used.copy_(lens.repeat_interleave(kvh))
            g.replay(); torch.cuda.synchronize()
            attend = int(lens.max()); s = torch.arange(attend, device=dev)
            bias = torch.zeros(rows, 1, group, attend, dtype=torch.bfloat16, device=dev)
            bias.masked_fill_((s[None, :] >= lens[:, None])[:, None, None, :], float("-inf"))
            r = ref().float(); err = ((outg.view(rows, kvh, group, d).float() - r).norm() / r.norm()).item()
            print(f"  flash in a CUDA graph after new lengths: err {err:.2e}, replay {bench(g.replay)*1e3:.0f} us")
        except Exception as ex:
            print("  graph failed:", repr(ex)[:300])
    except Exception:
        traceback.print_exc()
# tiny kernels: eager vs graph, per kernel
for shape in [(256, 896), (1, 896), (256, 4864)]:
    a = torch.randn(*shape, dtype=torch.bfloat16, device=dev)
    def many():
        y = a
        for _ in range(500): y = y * 1.0001
        return y
    te = bench(many, 10)
    g = torch.cuda.CUDAGraph(); st = torch.cuda.Stream(); st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        many(); torch.cuda.synchronize()
        with torch.cuda.graph(g): many()
    tg = bench(g.replay, 10)
    print(f"500 elementwise {shape}: eager (python) {te*1e3/500:.2f} us/op, graph {tg*1e3/500:.2f} us/op")
# fused rms_norm availability
try:
    h = torch.randn(256, 1, 896, dtype=torch.bfloat16, device=dev); w = torch.ones(896, dtype=torch.bfloat16, device=dev)
    o = torch.ops.aten._fused_rms_norm(h, [896], w, 1e-6)
    print("aten._fused_rms_norm ok", type(o))
except Exception as ex:
    print("_fused_rms_norm:", repr(ex)[:200])

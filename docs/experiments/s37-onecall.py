#!/usr/bin/env python3
"""s37 call 7: flash_attn_fp8_func end to end, this session's state against s36's (run once per state, alternated by
s37-call7.sh): median of 40 synced calls (CUDA events around each call, host time in) and "burst" (40 calls back to
back). 16k tokens, hidden 2048 (hdim 128: 16 heads; 256: 8)."""
import os, statistics, sys
import torch
from flashattn.fp8 import flash_attn_fp8_func


def burst(fn, iters=40):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def synced(fn, iters=40):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)


tag = sys.argv[1]
for d, s, causal in ((128, 1024, False), (128, 4096, False), (128, 4096, True), (128, 16384, False), (256, 4096, False)):
    bsz, h = 16384 // s, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fn = lambda: flash_attn_fp8_func(q, k, v, causal=causal)
    print(f"{tag} hdim {d} seqlen {s} causal {int(causal)}: synced {synced(fn) * 1000:8.1f} us  burst {burst(fn) * 1000:8.1f} us",
          flush=True)

#!/usr/bin/env python3
"""GPU time per kernel per call (torch.profiler, host time left out) of decode steps (b1/b8, 16k cache, GQA 32/8 and
MHA 32/32, contiguous and paged) and of the FP8 helpers (keys_permuted16, the quantizer with and without the
transform). A split-KV step's combine kernel is launched early (programmatic dependent launch), so its time
includes its wait for the attention kernel.

    python bench/kernel_times.py [decode|fp8|all]
"""
import os, sys, torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from bench_decode import make_problem, impl_fn
from flashattn.fp8 import keys_permuted16, quantize

def prof(name, fn, calls=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as pr:
        for _ in range(calls): fn()
        torch.cuda.synchronize()
    rows = []
    for e in pr.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0 and e.count >= calls:
            rows.append((t / calls, e.count // calls, e.key[:90]))
    rows.sort(reverse=True)
    tot = sum(r[0] for r in rows)
    print(f"{name}: {tot:.1f} us/call GPU  " + " | ".join(f"{r[2]} x{r[1]} {r[0]:.1f}" for r in rows[:4]), flush=True)

only = sys.argv[1] if len(sys.argv) > 1 else "all"
if only in ("all", "decode"):
    for b, hq, hk in ((1, 32, 8), (1, 32, 32), (8, 32, 8)):
        pr = make_problem("cuda", b, 1, 16384, hq, hk, 128, 16)
        with torch.no_grad():
            for impl in ("flashattn", "flashattn-paged"):
                prof(f"b{b} 16k h{hq}/{hk} {impl}", impl_fn(impl, pr))
if only in ("all", "fp8"):
    for d, s in ((128, 4096), (128, 16384), (256, 16384)):
        bsz, h = 16384 // s, 2048 // d
        x = torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16)
        v8, _ = quantize(x)
        prof(f"fp8 d{d} s{s} keys_permuted16", lambda: keys_permuted16(v8))
        prof(f"fp8 d{d} s{s} quantize hadamard", lambda: quantize(x, hadamard=True))
        prof(f"fp8 d{d} s{s} quantize", lambda: quantize(x))

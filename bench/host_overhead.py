#!/usr/bin/env python3
"""Host time per call on a tiny problem (the GPU work is negligible, so the loop is host-bound):
what a short-sequence call pays before any kernel runs. Ours vs torch SDPA, with and without
autograd. Usage: python bench/host_overhead.py [--device cuda|cpu] [--iters N]"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from flashattn import flash_attn_func  # noqa: E402


def per_call_us(fn, iters, sync):
    for _ in range(50):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t) / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=2000)
    a = ap.parse_args()
    dev = a.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    q, k, v = (torch.randn(1, 16, 1, 64, device=dev, dtype=dt) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = [
        ("flashattn fwd (no autograd)", lambda: flash_attn_func(q, k, v)),
        ("flashattn fwd (requires_grad)", lambda: flash_attn_func(qg, kg, vg)),
        ("flashattn fwd+bwd", lambda: flash_attn_func(qg, kg, vg).sum().backward()),
        ("torch sdpa fwd (no autograd)", lambda: sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))),
        ("torch sdpa fwd+bwd", lambda: sdpa(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2)).sum().backward()),
    ]
    print(f"host time per call, {dev}, tiny problem (1x16x1x64):")
    for name, fn in rows:
        print(f"  {name:32s} {per_call_us(fn, a.iters, sync):8.1f} us")
    if dev == "cuda":
        enqueue_vs_kernel()


def enqueue_vs_kernel():
    """Short-sequence bench shapes: host time to enqueue one call (no sync) vs GPU time per call."""
    from flashattn.interface import _flash_attn
    print("enqueue (host) vs GPU time per call, bench shapes (b = 16384/seqlen, h = 2048/d), no_grad:")
    for d, s, causal in ((128, 512, True), (128, 512, False), (128, 2048, True), (64, 1024, True)):
        q, k, v = (torch.randn(16384 // s, s, 2048 // d, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for backend in ("sm90", "sm80"):
            fn = lambda: _flash_attn(q, k, v, causal=causal, backend=backend)  # noqa: E731
            with torch.no_grad():
                fn()
                torch.cuda.synchronize()
                n = 50
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                host = (time.perf_counter() - t) / n * 1e6
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(n):
                    fn()
                e1.record()
                e1.synchronize()
                gpu = e0.elapsed_time(e1) / n * 1e3
            print(f"  d{d} s{s} causal={int(causal)} {backend}: enqueue {host:7.1f} us, back-to-back {gpu:7.1f} us/call")


if __name__ == "__main__":
    main()

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


if __name__ == "__main__":
    main()

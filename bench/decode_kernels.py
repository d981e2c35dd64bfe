#!/usr/bin/env python3
"""Where a decode step's GPU time goes: the kernels one flash_attn_with_kvcache call launches
(append/rotary prepass, attention, split-KV combine) and their durations, from torch.profiler,
for a few shapes and forced split counts. A diagnostic beside bench_decode.py (which times the
whole step): it says whether a shape is bound by the attention kernel's bandwidth, by the
extra launches, or by the combine.

    python bench/decode_kernels.py [--shapes b,cache,hq,hk ...] [--splits 0,16,32,64,128]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import flashattn  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
from flashattn import flash_attn_with_kvcache  # noqa: E402


def kernel_times(fn, reps):
    """Mean device µs per call of each kernel name fn launches (over `reps` calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time
    return {k: v / reps for k, v in total.items()}


def short(name):
    for key in ("kv_prepass", "fwd_kernel", "combine", "Memset", "memcpy", "Memcpy"):
        if key in name:
            return key
    return name[:40]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="*", default=["1,65536,32,8", "1,131072,32,8", "8,16384,32,8", "32,4096,32,8",
                                                   "1,16384,32,8"])
    p.add_argument("--splits", default="0,16,32,64,128")
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    dt = torch.bfloat16
    print(f"device: {torch.cuda.get_device_name(dev)}")
    for shape in a.shapes:
        b, cache, hq, hk = map(int, shape.split(","))
        d = a.hdim
        q = torch.randn(b, 1, hq, d, device=dev, dtype=dt)
        kc = torch.randn(b, cache + 1, hk, d, device=dev, dtype=dt)
        vc = torch.randn_like(kc)
        kn = torch.randn(b, 1, hk, d, device=dev, dtype=dt)
        vn = torch.randn_like(kn)
        sl = torch.full((b,), cache, dtype=torch.int32, device=dev)
        kv_gb = 2 * b * (cache + 1) * hk * d * 2 / 1e9
        for splits in map(int, a.splits.split(",")):
            fn = lambda: flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=sl, causal=True,  # noqa: E731
                                                 num_splits=splits)
            with torch.no_grad():
                t = kernel_times(fn, a.reps)
            parts = collections.defaultdict(float)
            for k, v in t.items():
                parts[short(k)] += v
            attn = parts.get("fwd_kernel", float("nan"))
            desc = "  ".join(f"{k} {v:7.1f}" for k, v in sorted(parts.items()))
            print(f"b{b:>3} cache {cache:>6} h{hq}/{hk} splits {splits:>3}: sum {sum(parts.values()):7.1f} us | {desc} | "
                  f"attention kernel {kv_gb / (attn * 1e-6):6.0f} GB/s")
        del q, kc, vc, kn, vn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""s37 call 7: flash_attn_fp8_func end to end, this session's state against s36's (run once per state, alternated by
s37-call7.sh): median of 40 synced calls (CUDA events around each call, host time in) and "burst" (40 calls back to
back). 16k tokens, hidden 2048 (hdim 128: 16 heads; 256: 8)."""
import os, sys
import torch
from flashattn.fp8 import flash_attn_fp8_func
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from call_timing import burst_ms, synced_ms  # noqa: E402


burst, synced = burst_ms, synced_ms  # (bench/call_timing.py)

tag = sys.argv[1]
for d, s, causal in ((128, 1024, False), (128, 4096, False), (128, 4096, True), (128, 16384, False), (256, 4096, False)):
    bsz, h = 16384 // s, 2048 // d
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fn = lambda: flash_attn_fp8_func(q, k, v, causal=causal)
    print(f"{tag} hdim {d} seqlen {s} causal {int(causal)}: synced {synced(fn) * 1000:8.1f} us  burst {burst(fn) * 1000:8.1f} us",
          flush=True)

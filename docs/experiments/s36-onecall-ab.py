#!/usr/bin/env python3
"""s36 call 5: flash_attn_fp8_func's new default (V quantized straight into keys_permuted16) against s35's (V quantized
in rows, copied to V^T by the library in its workspace), alternated in 4 rounds, median of 40 calls a round (CUDA events
around each call, host time in; and "burst": 40 calls back to back, no sync between), plus the V quantization alone
in each layout. hdim 128, 16k tokens x 16 heads."""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from flashattn import flash_attn_func
from flashattn.fp8 import flash_attn_fp8_func, quantize
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from call_timing import burst_ms, synced_ms  # noqa: E402


burst, t = burst_ms, synced_ms  # (moved to bench/call_timing.py in s37; the same code)


print(torch.cuda.get_device_name())
d, h = 128, 16
for s, causal in ((1024, False), (4096, False), (4096, True), (16384, False)):
    bsz = 16384 // s
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))

    def s35():
        q8, qs = quantize(q, hadamard=True); k8, ks = quantize(k, hadamard=True); v8, vs = quantize(v)
        return flash_attn_func(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, q_block_size=128, k_block_size=128,
                               softmax_scale=d ** -0.5, causal=causal)

    res = {"s36": [], "s35": [], "qv_rows": [], "qv_vt": [], "burst_s36": [], "burst_s35": []}
    with torch.no_grad():
        for r in range(4):
            order = [("s36", lambda: flash_attn_fp8_func(q, k, v, causal=causal)), ("s35", s35)]
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                res[name].append(t(fn))
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                res["burst_" + name].append(burst(fn))
            res["qv_rows"].append(t(lambda: quantize(v)))
            res["qv_vt"].append(t(lambda: quantize(v, layout="keys_permuted16")))
    best = {k_: min(v_) for k_, v_ in res.items()}
    print(f"seqlen {s} causal {int(causal)}: s36 {best['s36']*1e3:.1f} us, s35 {best['s35']*1e3:.1f} us "
          f"(s35/s36 {best['s35'] / best['s36']:.3f}); quantize v rows {best['qv_rows']*1e3:.1f} us, "
          f"keys_permuted16 {best['qv_vt']*1e3:.1f} us; burst s36 {best['burst_s36']*1e3:.1f} s35 "
          f"{best['burst_s35']*1e3:.1f} (s35/s36 {best['burst_s35'] / best['burst_s36']:.3f}); rounds {[[round(x * 1e3, 1) for x in v_] for v_ in res.values()]}",
          flush=True)

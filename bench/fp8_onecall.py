#!/usr/bin/env python3
"""flash_attn_fp8_func end to end and its parts, on a CUDA device: the whole call with the automatic V layout (V
quantized straight into keys_permuted16, s36), with s35's (V in rows, copied to V^T by the library) and with rows, the GPU quantizer with and without the Hadamard transform, keys_permuted16, and the FP8 kernel alone with V^T
and with rows beside our bf16 forward. 16k tokens, hidden 2048, hdim 128 and 256, seqlens 4k and 16k. Times are CUDA
events around one call (median of 30), so a short step's host time shows in it; bench/kernel_times.py gives GPU
time alone.

    python bench/fp8_onecall.py
"""
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashattn.fp8 import flash_attn_fp8_func, keys_permuted16, quantize
from flashattn import flash_attn_func
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from call_timing import synced_ms  # noqa: E402

def t(fn):
    return synced_ms(fn, iters=30)

print("hdim seqlen | fp8_func auto / s35 auto / rows ms | quant q (hadamard) / v us | keys_permuted16 us | kernel VT / rows ms (TFLOP/s) | bf16 ms (TFLOP/s)")
for d in (128, 256):
    for s in (4096, 16384):
        bsz, h = max(1, 16384 // s), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fl = 4 * bsz * h * s * s * d / 1e9
        with torch.no_grad():
            try:
                flash_attn_fp8_func(q[:, :128], k[:, :128], v[:, :128])
            except NotImplementedError as e:  # a build without this head dim
                print(f"{d} {s} | skipped: {e}", flush=True)
                continue
            auto = t(lambda: flash_attn_fp8_func(q, k, v))
            rows = t(lambda: flash_attn_fp8_func(q, k, v, v_layout="rows"))

            def before_s36():  # s35's default: v quantized in rows, copied to V^T by the library (flash_attn_func's None)
                q8, qs = quantize(q, hadamard=True); k8, ks = quantize(k, hadamard=True); v8, vs = quantize(v)
                return flash_attn_func(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, q_block_size=128,
                                       k_block_size=128, softmax_scale=d ** -0.5)
            old = t(before_s36)
            qh = t(lambda: quantize(q, hadamard=True))
            vq = t(lambda: quantize(v))
            q8, qs = quantize(q, hadamard=True); k8, ks = quantize(k, hadamard=True); v8, vs = quantize(v)
            conv = t(lambda: keys_permuted16(v8))
            v8t = keys_permuted16(v8)
            kw = dict(q_scale=qs, k_scale=ks, v_scale=vs, q_block_size=128, k_block_size=128, softmax_scale=d ** -0.5)
            kvt = t(lambda: flash_attn_func(q8, k8, v8t, v_layout="keys_permuted16", **kw))
            krows = t(lambda: flash_attn_func(q8, k8, v8, **kw))
            bf16 = t(lambda: flash_attn_func(q, k, v))
        gb = v8.numel() * 2 / 1e9
        print(f"{d} {s} | {auto:.3f} / {old:.3f} / {rows:.3f} | {qh*1e3:.1f} / {vq*1e3:.1f} | {conv*1e3:.1f} ({gb/conv*1e3:.0f} GB/s) | "
              f"{kvt:.3f} ({fl/kvt:.0f}) / {krows:.3f} ({fl/krows:.0f}) | {bf16:.3f} ({fl/bf16:.0f})", flush=True)

"""CUDA-event times of one Python call with its host time in, for the end-to-end scripts (bench/fp8_onecall.py and the
A/B scripts under docs/experiments/). bench_vs_peers.time_ms is the GPU-side method (no sync between calls)."""
import statistics

import torch


def synced_ms(fn, iters=40, warmup=5):
    """Median over `iters` calls of the events around one call, synchronized after each: host time and GPU time."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def burst_ms(fn, iters=40, warmup=5):
    """Per call over `iters` calls back to back (no sync between): max(host time, GPU time) in the steady state."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters

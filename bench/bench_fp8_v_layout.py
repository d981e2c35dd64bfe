#!/usr/bin/env python3
"""FP8 forward by v layout (issue 16): v in rows (v_layout="rows": the kernel transposes V tiles in shared memory),
V^T made before the timing (v_layout="keys_permuted16"), and the default (None: the library copies v to V^T in its
workspace where that pays, the copy timed with the call), plus the copy alone (flashattn.fp8.keys_permuted16) and a
plain v.clone() for scale. Each timing replays a CUDA graph of --calls calls (host time out: what a captured or a
queue-ahead caller sees); median of --reps replays, in us per call. 16k tokens, hidden 2048 (16 heads), per-head
and 128-token block scales, non-causal and causal. Writes <out-dir>/<gpu>-<date>-fp8-v-layout-hdim<D>.json."""
import argparse, datetime, json, os, statistics, sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flashattn import flash_attn_func  # noqa: E402
from flashattn.fp8 import keys_permuted16  # noqa: E402

E4M3 = torch.float8_e4m3fn


def graph_us(fn, calls, reps):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (workspace sizes, allocator)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    a = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    d, h = a.hdim, a.hidden // a.hdim
    rows = []
    for s in (int(x) for x in a.seqlens.split(",")):
        b = max(1, a.tokens // s)
        g = torch.Generator(device="cuda").manual_seed(s)
        q, k, v = ((torch.randn(b, s, h, d, device="cuda", generator=g) * 2).to(E4M3) for _ in range(3))
        vt = keys_permuted16(v)
        copy_us = graph_us(lambda: keys_permuted16(v), a.calls, a.reps)
        clone_us = graph_us(lambda: v.clone(), a.calls, a.reps)
        line = f"s {s:6d} b {b:2d}: copy {copy_us:5.1f} us (clone {clone_us:5.1f}) |"
        for scales, blk in (("per-head", s), ("block128", 128)):
            sc = torch.full((b, h, (s + blk - 1) // blk), 0.5, device="cuda")
            kw = dict(q_scale=sc, k_scale=sc, v_scale=sc, q_block_size=blk, k_block_size=blk)
            for causal in (False, True):
                t = {name: graph_us(fn, a.calls, a.reps) for name, fn in (
                    ("rows", lambda: flash_attn_func(q, k, v, causal=causal, v_layout="rows", **kw)),
                    ("vt", lambda: flash_attn_func(q, k, vt, causal=causal, v_layout="keys_permuted16", **kw)),
                    ("auto", lambda: flash_attn_func(q, k, v, causal=causal, **kw)))}
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                for impl, us in t.items():
                    rows.append(dict(impl=impl, scales=scales, hdim=d, seqlen=s, batch=b, heads=h, causal=causal,
                                     us=us, tflops=flops / us / 1e6, copy_us=copy_us, clone_us=clone_us))
                line += (f" {scales} c{int(causal)} rows {t['rows']:6.0f} vt {t['vt']:6.0f} auto {t['auto']:6.0f}"
                         f" ({t['rows'] / t['auto']:.2f}x) |")
        print(line, flush=True)
    os.makedirs(a.out_dir, exist_ok=True)
    slug = gpu.lower().replace(" ", "-").split("-80gb")[0]
    path = os.path.join(a.out_dir, f"{slug}-{datetime.date.today():%Y%m%d}-fp8-v-layout-hdim{d}.json")
    with open(path, "w") as f:
        json.dump(dict(gpu=gpu, torch=torch.__version__, calls=a.calls, reps=a.reps, rows=rows), f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()

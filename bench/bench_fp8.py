#!/usr/bin/env python3
"""FP8 (E4M3) forward vs bf16 on the same shapes (issue 16 item 7): flashattn FP8 (per-tensor and
128-token block scales), flashattn bf16, and torch SDPA's cuDNN bf16, in one run. CUDA events,
warm-up, median of --iters; TFLOP/s in the FA convention (4 b h s_q s_k d, halved when causal).
Writes <out-dir>/<gpu>-<date>-fp8.json."""
import argparse, datetime, json, os, statistics, sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flashattn import flash_attn_func  # noqa: E402

E4M3 = torch.float8_e4m3fn


def timed(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def quantize(x, block):
    """Per (batch, head, block of rows) scales, amax / 448 (pure torch, outside the timing)."""
    b, s, h, d = x.shape
    n = (s + block - 1) // block
    pad = n * block - s
    xp = F.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(b, n, block, h, d)
    amax = xp.abs().amax(dim=(2, 4)).clamp_min(1e-12)  # [b, n, h]
    scale = (amax / 448).permute(0, 2, 1).contiguous()  # [b, h, n]
    codes = (xp / (amax / 448)[:, :, None, :, None]).view(b, n * block, h, d)[:, :s].to(E4M3)
    return codes.contiguous(), scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlens", default="1024,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for causal in (False, True):
        for s in map(int, a.seqlens.split(",")):
            b, h, d = max(1, a.tokens // s), a.hidden // a.hdim, a.hdim
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            res = {}
            res["flashattn-bf16"] = timed(lambda: flash_attn_func(q, k, v, causal=causal), a.iters)
            for name, block in (("flashattn-fp8-block128", 128), ("flashattn-fp8-pertensor", 1 << 30)):
                (q8, qs), (k8, ks), (v8, vs) = (quantize(t, min(block, s)) for t in (q, k, v))
                kw = dict(q_scale=qs, k_scale=ks, v_scale=vs, q_block_size=min(block, s), k_block_size=min(block, s))
                res[name] = timed(lambda: flash_attn_func(q8, k8, v8, causal=causal, **kw), a.iters)
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    res["cudnn-bf16"] = timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), a.iters)
            except Exception as e:  # noqa: BLE001
                print(f"cudnn: {e}")
            for impl, ms in res.items():
                rows.append(dict(impl=impl, hdim=d, seqlen=s, batch=b, heads=h, causal=causal, ms=ms,
                                 tflops=flops / ms / 1e9))
            line = "  ".join(f"{i} {flops / ms / 1e9:6.1f}" for i, ms in res.items())
            print(f"hdim {d} seqlen {s:6d} causal {int(causal)}: {line}  fp8/bf16 "
                  f"{res['flashattn-bf16'] / res['flashattn-fp8-block128']:.2f}", flush=True)
    os.makedirs(a.out_dir, exist_ok=True)
    name = dev.lower().replace(" ", "-") + "-" + datetime.date.today().strftime("%Y%m%d") + "-fp8.json"
    with open(os.path.join(a.out_dir, name), "w") as f:
        json.dump(dict(device=dev, torch=torch.__version__, rows=rows), f, indent=1)
    print("wrote", os.path.join(a.out_dir, name))


if __name__ == "__main__":
    main()

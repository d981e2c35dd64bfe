#!/usr/bin/env python3
"""FP8 (E4M3) forward vs bf16 on the same shapes (issue 16 item 7): flashattn FP8 (per-tensor and
128-token block scales), flashattn bf16, and torch SDPA's cuDNN bf16, in one run. CUDA events,
warm-up, median of --iters; TFLOP/s in the FA convention (4 b h s_q s_k d, halved when causal).
--vt adds each FP8 row with v in the keys_permuted16 layout (flashattn.fp8.keys_permuted16, converted once
before the timing: the kernel then skips its V transpose), as impl "<row>-vt", and flash_attn_func's default
v_layout (None: v in rows, converted inside each call where that pays) as "<row>-auto"; the plain rows pass
v_layout="rows".
Writes <out-dir>/<gpu>-<date>-fp8-hdim<D>.json."""
import argparse, contextlib, datetime, json, os, statistics, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from flashattn import flash_attn_func  # noqa: E402
from flashattn.fp8 import keys_permuted16  # noqa: E402

E4M3 = torch.float8_e4m3fn


def timed(fn, iters, warmup=5, sustain_ms=0.0):
    """Median ms of `iters` calls, each between two events and synchronized; after `warmup` calls, and first
    `sustain_ms` of back-to-back calls (the clock's steady state under this kernel; 0 = off)."""
    for _ in range(warmup):
        fn()
    if sustain_ms > 0:
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < sustain_ms / 1e3:
            fn()
            n += 1
            if n % 8 == 0:
                torch.cuda.synchronize()
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


def cudnn_fp8(q8, k8, v8, causal, scale):
    """cuDNN's own FP8 SDPA forward through the nvidia-cudnn-frontend wheel (`import cudnn`), per-tensor
    scales (all 1: the codes are the bench's per-head codes, only the time is compared), E4M3 output
    (what cuDNN gives on Hopper; ours writes bf16). Returns a callable that runs it, or raises."""
    import cudnn  # noqa: PLC0415 (optional)

    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle)
    b, s, h, d = q8.shape
    dims, strides = (b, h, s, d), (s * h * d, d, h * d, 1)  # [b, s, h, d] memory seen as (b, h, s, d)
    tq, tk, tv = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3) for n in ("q", "k", "v"))
    scalars = [graph.tensor(name=n, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
               for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")]
    o, _, amax_s, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, descale_q=scalars[0], descale_k=scalars[1],
                                          descale_v=scalars[2], descale_s=scalars[3], scale_s=scalars[4],
                                          scale_o=scalars[5], is_inference=True, attn_scale=scale,
                                          use_causal_mask=causal)
    o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
    for a in (amax_s, amax_o):
        a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    one = torch.ones(1, 1, 1, 1, device="cuda", dtype=torch.float32)
    out = torch.empty_like(q8)
    amaxes = [torch.empty(1, 1, 1, 1, device="cuda", dtype=torch.float32) for _ in range(2)]
    pack = {tq: q8, tk: k8, tv: v8, o: out, amax_s: amaxes[0], amax_o: amaxes[1]}
    pack.update({t: one for t in scalars})
    workspace = torch.empty(max(1, graph.get_workspace_size()), device="cuda", dtype=torch.uint8)
    return lambda: graph.execute(pack, workspace, handle=handle)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--seqlens", default="1024,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every impl of a shape this many times, the order rotated each round; a row is the "
                         "median of its rounds (H200 runs differ by up to 15%% with the clock's state: s23, s24)")
    ap.add_argument("--sustain-ms", type=float, default=0.0,
                    help="run each impl back to back for this long right before its timed calls (steady clock); "
                         "the SM clock after the timing is recorded where pynvml is installed")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--same-data-row", action="store_true",
                    help="also time block scales on the per-head codes (code path vs data, see the row's comment)")
    ap.add_argument("--cudnn-fp8", action="store_true",
                    help="also time cuDNN's FP8 SDPA (needs the nvidia-cudnn-frontend wheel; E4M3 output)")
    ap.add_argument("--vt", action="store_true",
                    help="also time each FP8 row with v in the keys_permuted16 layout (impl <row>-vt; the conversion "
                         "is done once, outside the timing)")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for causal in (False, True):
        for s in map(int, a.seqlens.split(",")):
            b, h, d = max(1, a.tokens // s), a.hidden // a.hdim, a.hdim
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            fns = {"flashattn-bf16": lambda: flash_attn_func(q, k, v, causal=causal)}
            for name, block in (("flashattn-fp8-block128", 128), ("flashattn-fp8-pertensor", 1 << 30)):
                (q8, qs), (k8, ks), (v8, vs) = (quantize(t, min(block, s)) for t in (q, k, v))
                kw = dict(q_scale=qs, k_scale=ks, v_scale=vs, q_block_size=min(block, s), k_block_size=min(block, s))
                fns[name] = lambda q8=q8, k8=k8, v8=v8, kw=kw: flash_attn_func(q8, k8, v8, causal=causal,
                                                                               v_layout="rows", **kw)
                if a.vt:
                    v8t = keys_permuted16(v8)
                    fns[name + "-vt"] = lambda q8=q8, k8=k8, v8t=v8t, kw=kw: flash_attn_func(
                        q8, k8, v8t, causal=causal, v_layout="keys_permuted16", **kw)
                    # flash_attn_func's default: v in rows, converted inside the call where it pays (timed with it).
                    fns[name + "-auto"] = lambda q8=q8, k8=k8, v8=v8, kw=kw: flash_attn_func(
                        q8, k8, v8, causal=causal, **kw)
            if a.same_data_row and s > 128:
                # The block-scale code path on the per-head row's codes (each head's scale repeated
                # over its blocks): is per-head FP8's lead over block scales the code or the data?
                nb = (s + 127) // 128
                (q8h, qs), (k8h, ks), (v8h, vs) = (quantize(t, s) for t in (q, k, v))
                kwh = {n: x.expand(-1, -1, nb).contiguous() for n, x in (("q_scale", qs), ("k_scale", ks), ("v_scale", vs))}
                fns["flashattn-fp8-block128-headdata"] = lambda: flash_attn_func(
                    q8h, k8h, v8h, causal=causal, q_block_size=128, k_block_size=128, **kwh)
            if a.cudnn_fp8:
                try:
                    (q8c, _), (k8c, _), (v8c, _) = (quantize(t, s) for t in (q, k, v))
                    fns["cudnn-fp8-pertensor"] = cudnn_fp8(q8c, k8c, v8c, causal, 1.0 / d ** 0.5)
                except Exception as e:  # noqa: BLE001
                    print(f"cudnn fp8: {type(e).__name__}: {e}")
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            cudnn_ctx = contextlib.nullcontext()
            try:  # cuDNN's bf16 SDPA, its backend selected once around the timing (not per call)
                from torch.nn.attention import SDPBackend, sdpa_kernel
                cudnn_ctx = sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                fns["cudnn-bf16"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            except Exception as e:  # noqa: BLE001
                print(f"cudnn: {e}")
            # Rounds over all impls, the order rotated each round: no impl always runs first (coldest clock).
            names = list(fns)
            per_round = {n: [] for n in names}
            clock = {}
            with cudnn_ctx:
                for r in range(a.rounds):
                    for n in names[r % len(names):] + names[: r % len(names)]:
                        per_round[n].append(timed(fns[n], a.iters, sustain_ms=a.sustain_ms))
                        try:
                            clock[n] = torch.cuda.clock_rate()
                        except Exception:  # noqa: BLE001 (pynvml missing)
                            pass
            res = {n: statistics.median(per_round[n]) for n in names}
            for impl, ms in res.items():
                rows.append(dict(impl=impl, hdim=d, seqlen=s, batch=b, heads=h, causal=causal, ms=ms,
                                 tflops=flops / ms / 1e9, ms_rounds=per_round[impl], rounds=a.rounds,
                                 sustain_ms=a.sustain_ms, sm_clock_mhz=clock.get(impl)))
            line = "  ".join(f"{i} {flops / ms / 1e9:6.1f}" for i, ms in res.items())
            vt = (f"  fp8-vt/bf16 {res['flashattn-bf16'] / res['flashattn-fp8-block128-vt']:.2f}"
                  if "flashattn-fp8-block128-vt" in res else "")
            print(f"hdim {d} seqlen {s:6d} causal {int(causal)}: {line}  fp8/bf16 "
                  f"{res['flashattn-bf16'] / res['flashattn-fp8-block128']:.2f}{vt}", flush=True)
    os.makedirs(a.out_dir, exist_ok=True)
    name = dev.lower().replace(" ", "-") + "-" + datetime.date.today().strftime("%Y%m%d") + f"-fp8-hdim{a.hdim}.json"
    with open(os.path.join(a.out_dir, name), "w") as f:
        json.dump(dict(device=dev, torch=torch.__version__, rows=rows), f, indent=1)
    print("wrote", os.path.join(a.out_dir, name))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decode (inference) sweep: attention of a few new queries over a long KV cache, as a serving
engine runs it every step. Memory-bound: the figure of merit is the K/V bytes read per second and
its share of the device's copy bandwidth, measured in the same run (a device-to-device copy of a
large tensor, bytes read + written per second).

Rows: seqlen_q 1 and 4; cache lengths 1k..128k; batch 1..128; hdim 128; heads (q/kv) 32/8, 64/8
and 32/32; bf16. Ours: flash_attn_with_kvcache (one new row appended per step, as decoding does)
on a contiguous cache and on a paged one (page 16, a shuffled block table), split-KV by the
heuristic. Peers on the contiguous cache: torch SDPA's cuDNN and FLASH backends (enable_gqa) and
FlashInfer's decode/batch-decode kernels where its wheel imports. Shapes whose K/V exceed
--max-kv-gb are skipped. Plus the host time per Python call (tiny problem, no sync): ours
(flash_attn_func, flash_attn_with_kvcache) and SDPA. A peer that fails is n/a, never fatal.

Timing: CUDA events, warm-up, median over >= --min-iters calls (bench_vs_peers.time_ms), twice:
eager (one Python call per step: on a slow host a small decode step is host-bound, and the event
pair then also spans the host's enqueue time) and replaying a CUDA graph of the same call (what a
serving engine does; the GPU time alone, the figure the bandwidth targets are about). The graph
is timed twice: one call per replay (ms_graph1: includes the graph launch's own latency, paid
once per decode step, not per layer) and --layers calls per replay, each over its own cache like
the layers of a model's decode step (ms_graph: per call, no L2 reuse between layers). Rows report
all three; kv_gbps and pct_of_copy use ms_graph where the impl captures, else the eager time.
`flashattn-sN` / `flashattn-paged-sN` impls force num_splits = N (the heuristic's choice is 0);
`flashattn-plain` is flash_attn_func over the same contiguous keys (the non-cache path, e.g. for
prefill-sized q: what paged prefill is compared with).

    python bench/bench_decode.py [--quick] [--out FILE | --out-dir DIR]
    python bench/bench_decode.py --device cpu --quick   # smoke run of the script itself, no GPU
Writes bench/results/<gpu>-<yyyymmdd>-decode.json:
    {"device", "torch", "copy_gbps", "host_us": {...}, "rows": [{"impl", "layout", "seqlen_q", "cache",
     "batch", "nheads_q", "nheads_kv", "hdim", "ms", "ms_eager", "ms_graph", "ms_graph1", "layers", "kv_gb", "kv_gbps", "pct_of_copy",
     "max_err"}]}
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import flashattn  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
from flashattn import flash_attn_func, flash_attn_with_kvcache  # noqa: E402

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few rows (batch 1 and 32, caches 4k and 64k, GQA 32/8)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seqlens-q", default="1,4")
    p.add_argument("--caches", default="1024,4096,16384,65536,131072")
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--heads", default="32/8,64/8,32/32", help="query/kv head counts, comma-separated")
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--page-order", choices=["random", "sequential"], default="random",
                   help="the paged cache's pages: a random permutation, or in order (what the page scatter costs)")
    p.add_argument("--max-kv-gb", type=float, default=24.0)
    p.add_argument("--impls", default="flashattn,flashattn-paged,cudnn,fa2,flashinfer")
    p.add_argument("--min-iters", type=int, default=20)
    p.add_argument("--no-graph", action="store_true", help="eager timing only (no CUDA-graph replay rows)")
    p.add_argument("--layers", type=int, default=8,
                   help="graph timing also over this many layers (one cache each) per replay, capped by "
                        "--layers-gb of K/V; ms (and pct_of_copy) is the per-layer time, ms_graph1 the "
                        "one-call graph's")
    p.add_argument("--layers-gb", type=float, default=6.0)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--target-ms", type=float, default=200.0)
    p.add_argument("--warmup-ms", type=float, default=50.0)
    p.add_argument("--no-append", action="store_true",
                   help="flashattn rows without k/v to append (cache_seqlens one longer: the same keys attended); "
                        "isolates the fused append's cost")
    p.add_argument("--out", default=None)
    p.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    a = p.parse_args(argv)
    if a.quick:
        a.seqlens_q, a.caches, a.batches = "1", "4096,65536", "1,32"
    return a


def time_ms(fn, args, device):
    """Median per-call time: CUDA events on a GPU, perf_counter on the CPU (smoke runs)."""
    if device.type != "cuda":
        fn()
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)
    from bench_vs_peers import time_ms as cuda_time_ms

    return cuda_time_ms(fn, args)


def graph_time_ms(fns, args, device):
    """Median CUDA-event time of replaying a CUDA graph of one call of each fn in `fns`, divided by
    len(fns) (None where a fn does not capture): the GPU time of a call without the host's
    per-call cost. With one fn this includes the graph launch's own latency (several us,
    the same for every impl); with one fn per layer (each over its own cache, so no layer finds
    another's K/V in L2) it is the time of one layer's attention inside a decode step's graph."""
    if device.type != "cuda" or args.no_graph:
        return None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (lazy init, workspace caching)
            for _ in range(3):
                for fn in fns:
                    fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
        graph.replay()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001
        print(f"    (no graph: {type(e).__name__}: {str(e).splitlines()[0][:120]})")
        torch.cuda.synchronize(device)
        return None
    ms = time_ms(graph.replay, args, device)
    del graph
    return ms / len(fns)


def copy_gbps(device, args):
    """Device-to-device copy bandwidth, bytes read + written per second."""
    if device.type != "cuda":
        return float("nan")
    n = 1 << 28  # 1 GiB of fp32 each way
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), args, device)
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


class Unavailable(Exception):
    pass


def make_problem(device, b, sq, cache, hq, hk, d, page, page_order="random"):
    """q, one new k/v row, the cache (contiguous [b, cache + 1, hk, d]) and its paged copy (pages in a random
    order, as a serving engine's allocator leaves them after a while, or in order: page_order="sequential")."""
    g = torch.Generator(device="cpu").manual_seed(0)
    dt = torch.bfloat16
    q = torch.randn(b, sq, hq, d, generator=g).to(device, dt)
    k_new = torch.randn(b, 1, hk, d, generator=g).to(device, dt)
    v_new = torch.randn(b, 1, hk, d, generator=g).to(device, dt)
    rows = cache + 1  # room for the appended row
    kc = torch.randn(b, rows, hk, d, dtype=dt, device=device)
    vc = torch.randn(b, rows, hk, d, dtype=dt, device=device)
    seqlens = torch.full((b,), cache, dtype=torch.int32, device=device)
    pages_per_seq = (rows + page - 1) // page
    perm = (torch.randperm(b * pages_per_seq, generator=g) if page_order == "random"
            else torch.arange(b * pages_per_seq)).to(device=device, dtype=torch.int32)
    table = perm.view(b, pages_per_seq)
    kp = torch.empty(b * pages_per_seq, page, hk, d, dtype=dt, device=device)
    vp = torch.empty_like(kp)
    pad = pages_per_seq * page - rows
    for src, dst in ((kc, kp), (vc, vp)):
        full = torch.nn.functional.pad(src, (0, 0, 0, 0, 0, pad)).view(b * pages_per_seq, page, hk, d)
        dst[table.view(-1).long()] = full
    return dict(q=q, k_new=k_new, v_new=v_new, kc=kc, vc=vc, kp=kp, vp=vp, table=table, seqlens=seqlens)


def impl_fn(name, pr, causal=True):
    """A zero-argument callable running one decode step of `name` on problem `pr`."""
    q, seqlens = pr["q"], pr["seqlens"]
    base, _, forced = name.partition("-s")
    if base in ("flashattn", "flashattn-paged") and (not forced or forced.isdigit()):
        splits = int(forced) if forced else 0
        if base == "flashattn":
            return lambda: flash_attn_with_kvcache(q, pr["kc"], pr["vc"], pr["k_new"], pr["v_new"],
                                                   cache_seqlens=seqlens, causal=causal, num_splits=splits)
        return lambda: flash_attn_with_kvcache(q, pr["kp"], pr["vp"], pr["k_new"], pr["v_new"], cache_seqlens=seqlens,
                                               block_table=pr["table"], causal=causal, num_splits=splits)
    if name == "flashattn-plain":  # the plain forward over the contiguous keys (no cache API, no append)
        cache = int(seqlens[0])
        kc, vc = pr["kc"][:, : cache + 1], pr["vc"][:, : cache + 1]
        return lambda: flash_attn_func(q, kc, vc, causal=causal)
    if name in ("cudnn", "fa2", "math"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[name]
        cache = int(seqlens[0])
        qt = q.transpose(1, 2)
        kt, vt = pr["kc"][:, : cache + 1].transpose(1, 2), pr["vc"][:, : cache + 1].transpose(1, 2)
        sq = q.shape[1]
        # Bottom-right causal over the cache: for sq > 1 a boolean mask (SDPA's is_causal is top-left).
        mask = None
        if causal and sq > 1:
            i = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(cache + 1, device=q.device)[None, :]
            mask = j <= i + (cache + 1 - sq)

        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                                        enable_gqa=True).transpose(1, 2)

        return run
    if name == "flashinfer":
        try:
            import flashinfer  # noqa: F401
        except Exception as e:  # noqa: BLE001
            raise Unavailable(f"flashinfer does not import ({type(e).__name__}: {e})") from None
        if q.shape[1] != 1:
            raise Unavailable("flashinfer's single/batch decode takes one query per sequence")
        cache = int(seqlens[0])
        kc, vc = pr["kc"][:, : cache + 1], pr["vc"][:, : cache + 1]
        if q.shape[0] == 1:
            return lambda: flashinfer.single_decode_with_kv_cache(q[0, 0], kc[0], vc[0])
        raise Unavailable("batched flashinfer decode needs its paged wrapper: not wired in this script yet")
    raise Unavailable(f"unknown impl {name}")


def host_us(device):
    """Host time per call (no sync) on a tiny problem: what a decode loop pays before any kernel."""
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 16, 1, 64, device=device, dtype=dt) for _ in range(3))
    qd = torch.randn(1, 1, 8, 64, device=device, dtype=dt)
    kc, vc = (torch.randn(1, 64, 2, 64, device=device, dtype=dt) for _ in range(2))
    kn, vn = (torch.randn(1, 1, 2, 64, device=device, dtype=dt) for _ in range(2))
    sl = torch.tensor([40], dtype=torch.int32, device=device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = {
        "flashattn flash_attn_func": lambda: flash_attn_func(q, k, v),
        "flashattn flash_attn_with_kvcache": lambda: flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=sl),
        "torch sdpa": lambda: sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
    }
    out = {}
    with torch.no_grad():
        for name, fn in rows.items():
            for _ in range(50):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            reps = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(200):
                    fn()
                reps.append((time.perf_counter() - t) / 200 * 1e6)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            out[name] = statistics.median(reps)
    return out


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (use --device cpu for a smoke run)")
    if device.type == "cpu":  # smoke: tiny shapes, the math backend as the only peer
        args.caches, args.batches = "64,200", "1,2"
        args.impls = "flashattn,flashattn-paged,math"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    copy = copy_gbps(device, args)
    print(f"device: {name}; copy bandwidth (read + write): {copy:.0f} GB/s")
    rows = []
    impls = [s for s in args.impls.split(",") if s]
    heads = [tuple(map(int, x.split("/"))) for x in args.heads.split(",") if x]
    if args.quick:
        heads = heads[:1]
    for sq in map(int, args.seqlens_q.split(",")):
        for cache in map(int, args.caches.split(",")):
            for b in map(int, args.batches.split(",")):
                for hq, hk in heads:
                    d = args.hdim
                    kv_bytes = 2 * b * (cache + 1) * hk * d * 2
                    if kv_bytes / 1e9 > args.max_kv_gb:
                        continue
                    pr = make_problem(device, b, sq, cache, hq, hk, d, args.page_size, args.page_order)
                    # More layers, each with its own cache (and paged copy), for the in-step timing.
                    n_layers = 1
                    if device.type == "cuda" and not args.no_graph and args.layers > 1:
                        n_layers = max(1, min(args.layers, int(args.layers_gb / (2 * kv_bytes / 1e9))))
                    more = [make_problem(device, b, sq, cache, hq, hk, d, args.page_size, args.page_order) for _ in range(n_layers - 1)]
                    if args.no_append:
                        for x in [pr] + more:
                            x["k_new"] = x["v_new"] = None
                            x["seqlens"] = x["seqlens"] + 1
                    ref = None
                    for impl in impls:
                        row = dict(impl=impl, layout=(f"paged{args.page_size}" + ("" if args.page_order == "random" else "-sequential")
                                           if "paged" in impl else "contiguous"), seqlen_q=sq,
                                   cache=cache, batch=b, nheads_q=hq, nheads_kv=hk, hdim=d, kv_gb=kv_bytes / 1e9)
                        try:
                            fn = impl_fn(impl, pr)
                            with torch.no_grad():
                                out = fn()
                                if ref is None and impl in ("flashattn", "math"):
                                    ref = out.float()
                                row["max_err"] = (out.float() - ref).abs().max().item() if ref is not None else None
                                ms_eager = time_ms(fn, args, device)
                                ms_graph1 = graph_time_ms([fn], args, device)
                                ms_graph = ms_graph1
                                if more and ms_graph1 is not None:
                                    ms_graph = graph_time_ms([fn] + [impl_fn(impl, m) for m in more], args, device)
                        except Unavailable as e:
                            print(f"  {impl:16s} n/a: {e}")
                            continue
                        except Exception as e:  # noqa: BLE001
                            print(f"  {impl:16s} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                            continue
                        ms = ms_graph if ms_graph is not None else ms_eager
                        row.update(ms=ms, ms_eager=ms_eager, ms_graph=ms_graph, ms_graph1=ms_graph1,
                                   layers=n_layers if ms_graph is not None else None)
                        row["kv_gbps"] = kv_bytes / (ms * 1e-3) / 1e9
                        row["pct_of_copy"] = 100.0 * row["kv_gbps"] / copy if copy == copy else None
                        rows.append(row)
                        pct = f"{row['pct_of_copy']:5.1f}%" if row["pct_of_copy"] is not None else "  n/a"
                        graph = f"{ms_graph:8.4f} ({n_layers}L; 1L {ms_graph1:8.4f})" if ms_graph is not None else "     n/a"
                        print(f"sq{sq} cache{cache:>6} b{b:>3} h{hq}/{hk} {impl:18s} graph {graph} ms eager "
                              f"{ms_eager:8.3f} ms {row['kv_gbps']:8.0f} GB/s {pct}  err {row['max_err']}")
                    del pr, more
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    save(args, name, copy, None, rows, quiet=True)  # so far (a run cut short keeps its rows)
    hus = host_us(device)
    for k, v in hus.items():
        print(f"host per call: {k:36s} {v:7.1f} us")
    save(args, name, copy, hus, rows)


def save(args, name, copy, hus, rows, quiet=False):
    """Writes the result JSON (on a GPU, or where --out names a file)."""
    result = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(), copy_gbps=copy,
                  host_us=hus, rows=rows)
    out = args.out
    if out is None:
        slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
        out = str(Path(args.out_dir) / f"{slug}-{datetime.date.today():%Y%m%d}-decode.json")
    if args.device != "cpu" or args.out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
        if not quiet:
            print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""A timeline of one decode step's layers (docs/experiments/decode-step-trace.diff must be applied; s38).

One row per process (the trace's launch slots assume one grid size): builds the layers as
bench/bench_decode.py does (one cache each), captures them in a CUDA graph, replays it, times it, then
dumps the library's trace buffers (flashattn_experiment_trace_dump) and prints, per layer of the last
replay, where the attention kernel's CTAs and the combine's spend the step (globaltimer ns).

    python3 docs/experiments/s38-decode-trace.py --sq 1 --batch 1 --cache 16384 --heads 32/8 --out trace.bin
"""
import argparse
import ctypes
import statistics
import struct
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "python"))

K_EVENTS, K_SLOTS, K_MAX_CTAS = 16, 16, 320
EV = dict(entry=0, seq_bounds=1, exit_check=2, q_issued=4, key_range=3, first_issued=5, append_done=11,
          first_landed=6, last_landed=7, math_done=8, end=9)
K_WORDS = 2 * K_EVENTS


def parse_dump(path):
    raw = Path(path).read_bytes()
    words = K_SLOTS * K_MAX_CTAS * K_WORDS
    unit = 4 + 8 * (words + 1)
    out = {}
    for off in range(0, len(raw), unit):
        kind = struct.unpack_from("i", raw, off)[0]
        rec = np.frombuffer(raw, dtype=np.uint64, count=words, offset=off + 4).reshape(K_SLOTS, K_MAX_CTAS, K_WORDS)
        tickets = struct.unpack_from("Q", raw, off + 4 + 8 * words)[0]
        if tickets > 0:
            out.setdefault(kind, []).append((tickets, rec.astype(np.int64)))
    return {k: max(v, key=lambda t: t[0]) for k, v in out.items()}


def launches(rec):
    """[(start_ns, ctas, records[ctas, words])] of every filled slot, in time order."""
    res = []
    for s in range(K_SLOTS):
        ctas = int(rec[s, 0, K_EVENTS + 14])
        if ctas <= 0 or ctas > K_MAX_CTAS:
            continue
        r = rec[s, :ctas]
        if (r[:, 0] == 0).any():
            continue
        res.append((int(r[:, 0].min()), ctas, r))
    return sorted(res, key=lambda t: t[0])


def pct(a, q):
    return float(np.percentile(a, q))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=16384)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--out", default="decode-trace.bin")
    args = ap.parse_args()
    import flashattn
    from flashattn import _lib
    from bench_decode import impl_fn, make_problem

    dev = torch.device("cuda")
    hq, hk = (int(x) for x in args.heads.split("/"))
    probs = [make_problem(dev, args.batch, args.sq, args.cache, hq, hk, 128, 16) for _ in range(args.layers)]
    fns = [impl_fn("flashattn", p) for p in probs]
    for _ in range(3):
        for f in fns:
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / args.layers)
    kv_bytes = 2 * args.batch * (args.cache + 1) * hk * 128 * 2
    us = statistics.median(times)
    print(f"row sq{args.sq} b{args.batch} cache {args.cache} h{args.heads}: {us:.2f} us per layer (median of "
          f"{args.replays} replays), K/V {kv_bytes / 1e6:.1f} MB, {kv_bytes / us / 1e3:.0f} GB/s")
    lib = _lib.load()
    fn = lib.flashattn_experiment_trace_dump
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p]
    n = fn(str(args.out).encode())
    print(f"dumped {n} units to {args.out}")
    bufs = parse_dump(args.out)
    att = launches(bufs[0][1])
    comb = launches(bufs[1][1]) if 1 in bufs else []
    att = att[-args.layers:]
    print(f"attention CTAs per launch: {att[0][1]}; combine CTAs: {comb[0][1] if comb else 0}")
    # per layer
    hdr = ("layer", "entry spread", "e1-e0 cyc", "first blk", "stream end p10/p50/max", "last math cyc",
           "epi cyc", "att end", "comb entry", "comb wait end", "comb end", "next start")
    print(" | ".join(hdr))
    rows = []
    for li, (t0, ctas, r) in enumerate(att):
        g_ = r[:, :K_EVENTS] - t0  # ns since the first CTA's entry
        c_ = r[:, K_EVENTS:]
        end = g_[:, 9].max()
        cm = [c for c in comb if c[0] >= t0 - 20000 and (li + 1 >= len(att) or c[0] < att[li + 1][0])]
        nxt = att[li + 1][0] - t0 if li + 1 < len(att) else float("nan")
        if cm:
            cr = cm[-1][2][:, :K_EVENTS] - t0
            ce, cw, cend = cr[:, 0].min(), cr[:, 1].min(), cr[:, 9].max()
        else:
            ce = cw = cend = float("nan")
        row = dict(spread=g_[:, 0].max(), pro=np.median(c_[:, 5] - c_[:, 0]), first=np.median(g_[:, 6]),
                   s10=pct(g_[:, 7], 10), s50=pct(g_[:, 7], 50), smax=g_[:, 7].max(),
                   math=np.median(c_[:, 8] - c_[:, 7]), epi=np.median(c_[:, 9] - c_[:, 8]), end=end,
                   ce=ce, cw=cw, cend=cend, nxt=nxt, blocks=np.median(r[:, 15]))
        rows.append(row)
        print(f"{li} | {row['spread']:.0f} | {row['pro']:.0f} | {row['first']:.0f} | {row['s10']:.0f}/{row['s50']:.0f}/"
              f"{row['smax']:.0f} | {row['math']:.0f} | {row['epi']:.0f} | {end:.0f} | {ce:.0f} | {cw:.0f} | "
              f"{cend:.0f} | {nxt:.0f}")
    # distribution detail of the middle layer
    t0, ctas, r = att[len(att) // 2]
    g_ = r[:, :K_EVENTS] - t0
    print("middle layer, ns since first entry: percentiles p0/p10/p50/p90/p100")
    present = {n: e for n, e in EV.items() if (r[:, e] != 0).any()}  # stamps this build has
    for name, e in present.items():
        v = g_[:, e]
        print(f"  {name:22s} " + " / ".join(f"{pct(v, q):.0f}" for q in (0, 10, 50, 90, 100)))
    c_ = r[:, K_EVENTS:]
    print("middle layer, clock64 cycles between consecutive setup stamps (p10/p50/p90):")
    names = [n for n in present if n not in ("last_landed", "math_done", "end")]
    for a, b in zip(range(0, len(names) - 1), range(1, len(names))):
        v = c_[:, EV[names[b]]] - c_[:, EV[names[a]]]
        print(f"  {names[a]} -> {names[b]:14s} " + " / ".join(f"{pct(v, q):.0f}" for q in (10, 50, 90)))
    sms = r[:, 14]
    print(f"  SMs used {len(set(sms.tolist()))}, CTAs {ctas}, blocks per CTA {sorted(set(r[:, 15].tolist()))}")
    lows = sorted(set((r[:, :10] % 1000).flatten().tolist()))
    print(f"  globaltimer ns mod 1000 distinct values: {len(lows)} (resolution check)")
    # by entry order: do early CTAs finish early?
    order = np.argsort(g_[:, 0])
    q = len(order) // 4
    for name, idx in (("first quarter to enter", order[:q]), ("last quarter", order[-q:])):
        print(f"  {name}: entry {np.median(g_[idx, 0]):.0f}, first block {np.median(g_[idx, 6]):.0f}, "
              f"stream end {np.median(g_[idx, 7]):.0f}, end {np.median(g_[idx, 9]):.0f}")
    keys = ("spread", "pro", "first", "s10", "s50", "smax", "math", "epi", "end", "ce", "cw", "cend", "nxt")
    mid = rows[1:-1] if len(rows) > 2 else rows
    print("median over layers 1..n-2: " + ", ".join(f"{k} {np.nanmedian([x[k] for x in mid]):.0f}" for k in keys))


if __name__ == "__main__":
    main()

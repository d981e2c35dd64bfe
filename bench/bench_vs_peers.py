#!/usr/bin/env python3
"""flashattn vs its peers on the same inputs, in the same process.

Peers: torch SDPA's cuDNN, FLASH (FlashAttention-2) and EFFICIENT backends, and FlexAttention
(compiled). Ours: each compiled GPU path (flashattn-sm90, flashattn-sm80) and flashattn-sm90-det, the
deterministic backward (sm90 where it has one for the head dim, else sm80). The default sweep is
the FlashAttention-3 paper's: 16k total tokens, hidden 2048 (nheads = 2048 / hdim, batch =
16384 / seqlen), hdim 64/128/256, seqlen 512..16k, causal and not, bf16; modes fwd and fwdbwd,
plus bwd = fwdbwd - fwd. Timing: CUDA events, warm-up, median of >= 10 iterations (bounded per
config), a global time budget; fwd runs under no_grad (inference), fwdbwd with autograd. A peer
that fails is printed as n/a and left out of the JSON; the run never stops for it.

Sustained-load timing. Under continuous attention work an H100 sits at its power cap (700 W, SM
clock ~1.4-1.7 GHz instead of 1.98), so calls right after an idle moment run up to 10% faster than
the same calls a second later, and whoever is timed first after a pause looks best. Each
measurement therefore starts with --warmup-ms of untimed calls, and --rounds R (default 3) times
every row R times, the implementations' order alternating round by round; the JSON keeps every
round and reports the median. Short bursts (flashattn-bench's 10 synchronised calls) read higher
for everyone.

FLOPs (FlashAttention's convention): fwd 4*b*h*sq*sk*d (halved when causal), bwd 2.5x, fwdbwd 3.5x.

--variants dropout,alibi adds rows "<impl>+dropout" (dropout_p = --dropout-p) and "<impl>+alibi"
(slopes 2^(-8(i+1)/nheads)) for every implementation that has the option (dropout: ours and SDPA's
backends; ALiBi: ours and FlexAttention's score_mod), timed in the same passes as the plain rows;
the table adds each variant's cost (variant / plain) for ours. --variants fp8 adds "<impl>+fp8"
for our sm90 forward on FP8 (E4M3) inputs: Q, K, V quantized once with 128-token block scales by
flashattn.fp8.quantize (not timed), O in bf16; forward only (its fwdbwd is reported as n/a).

    python bench/bench_vs_peers.py [--quick] [--hdims 64,128] [--seqlens 512,4096] [--modes fwd]
                                   [--impls flashattn-sm90,cudnn] [--rounds 5] [--out FILE | --out-dir DIR]
Writes bench/results/<gpu>-<yyyymmdd>.json:
    {"device", "torch", "rows": [{"impl", "mode", "dtype", "hdim", "seqlen", "batch", "nheads",
                                  "causal", "tflops", "tflops_rounds"}]}  (tflops: the median round)
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import flashattn  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a source checkout: python/ with FLASHATTN_LIBRARY or a build/ folder
    sys.path.insert(0, str(ROOT / "python"))

ALL_IMPLS = ["flashattn-sm90", "flashattn-sm90-det", "flashattn-sm80", "cudnn", "fa2", "efficient", "flex"]
# Within a row, peers and ours alternate going first (main() says why); flex runs in a pass of its own.
RUN_ORDER = ["cudnn", "fa2", "efficient", "flashattn-sm90", "flashattn-sm90-det", "flashattn-sm80", "flex"]
# Which implementations have each variant (--variants).
VARIANT_IMPLS = {
    "dropout": ["flashattn-sm90", "flashattn-sm90-det", "flashattn-sm80", "cudnn", "fa2", "efficient"],
    "alibi": ["flashattn-sm90", "flashattn-sm90-det", "flashattn-sm80", "flex"],
    "fp8": ["flashattn-sm90"],
}
VARIANT = {"dropout_p": 0.1}  # set by main from --dropout-p
TOTAL_TOKENS = 16384
HIDDEN = 2048
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a few rows: hdim 128, seqlen 1024 and 8192")
    p.add_argument("--hdims", default="64,128,256")
    p.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--modes", default="fwd,bwd,fwdbwd", help="bwd is derived: fwdbwd - fwd (needs both timed)")
    p.add_argument("--causal", default="both", choices=["both", "true", "false"])
    p.add_argument("--impls", default=",".join(ALL_IMPLS))
    p.add_argument("--out", default=None, help="JSON path (default: <out-dir>/<gpu>-<yyyymmdd>.json)")
    p.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--target-ms", type=float, default=150.0, help="timed work per measurement (bounds iters)")
    p.add_argument("--warmup-ms", type=float, default=100.0,
                   help="untimed calls before each measurement, so the GPU's clocks and power draw settle to "
                        "what sustained use sees (an idle GPU boosts for the first tens of ms)")
    p.add_argument("--budget-s", type=float, default=900.0, help="stop measuring after this long")
    p.add_argument("--rounds", type=int, default=3,
                   help="time each row this many times, alternating the order of implementations; report medians")
    p.add_argument("--variants", default="", help="comma list of dropout, alibi: extra rows per impl (see top)")
    p.add_argument("--dropout-p", type=float, default=0.1)
    p.add_argument("--flex-hdims", default="128",
                   help="hdims to run FlexAttention at (it compiles per shape: ~10 s each; 64,128,256 for all)")
    a = p.parse_args(argv)
    if a.quick:
        a.hdims, a.seqlens = "128", "1024,8192"
    a.hdims = [int(x) for x in a.hdims.split(",") if x]
    a.seqlens = [int(x) for x in a.seqlens.split(",") if x]
    a.modes = [m for m in a.modes.split(",") if m]
    a.impls = [i for i in a.impls.split(",") if i]
    a.flex_hdims = [int(x) for x in a.flex_hdims.split(",") if x]
    if a.rounds < 1:
        p.error(f"--rounds: must be >= 1 (got {a.rounds})")
    for m in a.modes:
        if m not in FLOP_FACTOR:
            p.error(f"--modes: unknown mode {m!r} (fwd, bwd, fwdbwd)")
    for i in a.impls:
        if i not in ALL_IMPLS:
            p.error(f"--impls: unknown impl {i!r} ({', '.join(ALL_IMPLS)})")
    a.variants = [v for v in a.variants.split(",") if v]
    for v in a.variants:
        if v not in VARIANT_IMPLS:
            p.error(f"--variants: unknown variant {v!r} ({', '.join(VARIANT_IMPLS)})")
    if not 0.0 < a.dropout_p < 1.0:
        p.error(f"--dropout-p: must be in (0, 1) (got {a.dropout_p})")
    # Each variant's rows come right after their plain implementation in the run order.
    a.impls = [x for i in a.impls for x in [i] + [f"{i}+{v}" for v in a.variants if i in VARIANT_IMPLS[v]]]
    a.causals = {"both": [False, True], "true": [True], "false": [False]}[a.causal]
    return a


def flops(mode, b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    if causal:
        f /= 2
    return f * FLOP_FACTOR[mode]


# ---- implementations: each returns callables fwd() and fwdbwd() over the shared inputs ----------


class Unavailable(Exception):
    pass


def alibi_slopes(nheads):
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / nheads) for i in range(nheads)], device="cuda",
                        dtype=torch.float32)


def _sdpa(backend_name, variant=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    p = VARIANT["dropout_p"] if variant == "dropout" else 0.0

    def make(q, k, v, dout, causal):
        # Our layout is [b, s, h, d]; SDPA takes [b, h, s, d]: the same storage, transposed.
        qt, kt, vt, dt = (t.transpose(1, 2) for t in (q, k, v, dout))

        def fwd():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=p)

        def fwdbwd():
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=p)
            return torch.autograd.grad(o, (q, k, v), dt)

        return fwd, fwdbwd

    return make


def _flashattn(backend, deterministic=False, variant=None):
    import flashattn
    from flashattn.interface import _flash_attn, _fp8_args

    if backend not in flashattn.compiled_backends():
        raise Unavailable(f"{backend} is not compiled into {flashattn.library_path()}")
    cc = torch.cuda.get_device_capability()
    if backend == "sm90" and cc != (9, 0):
        raise Unavailable(f"sm90 needs compute capability 9.0, this GPU has {cc[0]}.{cc[1]}")
    if backend == "sm80" and cc < (8, 0):
        raise Unavailable(f"sm80 needs compute capability 8.0+, this GPU has {cc[0]}.{cc[1]}")

    def make(q, k, v, dout, causal):
        if variant == "fp8":
            from flashattn import fp8

            (q8, qs), (k8, ks), (v8, vs) = (fp8.quantize(t.detach(), block_size=128) for t in (q, k, v))

            def fwd_fp8():
                return _flash_attn(q8, k8, v8, causal=causal, backend=backend,
                                   fp8=_fp8_args(qs, ks, vs, None, None, None, 128, 128, None))

            def fwdbwd_fp8():
                raise NotImplementedError("FP8 attention is forward-only")

            return fwd_fp8, fwdbwd_fp8
        mods = {}
        if variant == "dropout":
            mods["dropout_p"] = VARIANT["dropout_p"]
        if variant == "alibi":
            mods["alibi_slopes"] = alibi_slopes(q.shape[2])

        def fwd():
            return _flash_attn(q, k, v, causal=causal, backend=backend, **mods)

        def fwdbwd():
            o = _flash_attn(q, k, v, causal=causal, deterministic=deterministic, backend=backend, **mods)
            return torch.autograd.grad(o, (q, k, v), dout)

        return fwd, fwdbwd

    return make


def _flex(variant=None):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def make(q, k, v, dout, causal):
        torch._dynamo.reset()  # one compile per shape; keeps clear of the recompile limit
        compiled = torch.compile(flex_attention, dynamic=False)
        b, s, h, d = q.shape
        qt, kt, vt, dt = (t.transpose(1, 2).contiguous().detach().requires_grad_() for t in (q, k, v, dout))
        bm = create_block_mask(causal_mask, None, None, s, s, device=q.device) if causal else None
        score_mod = None
        if variant == "alibi":  # the same bias as ours (seqlen_q = seqlen_k), in natural-log units
            slopes = alibi_slopes(h)

            def score_mod(score, b_, h_, q_idx, kv_idx):
                return score - slopes[h_] * (q_idx - kv_idx).abs()

        def fwd():
            return compiled(qt, kt, vt, block_mask=bm, score_mod=score_mod)

        def fwdbwd():
            o = compiled(qt, kt, vt, block_mask=bm, score_mod=score_mod)
            return torch.autograd.grad(o, (qt, kt, vt), dt)

        return fwd, fwdbwd

    return make


def make_impl(name):
    name, _, variant = name.partition("+")
    variant = variant or None
    if name == "cudnn":
        return _sdpa("CUDNN_ATTENTION", variant)
    if name == "fa2":
        return _sdpa("FLASH_ATTENTION", variant)
    if name == "efficient":
        return _sdpa("EFFICIENT_ATTENTION", variant)
    if name == "flex":
        return _flex(variant)
    if name == "flashattn-sm90-det":  # the deterministic backward as its own row
        return _flashattn("sm90", deterministic=True, variant=variant)
    return _flashattn(name.split("-", 1)[1], variant=variant)


# ---- timing ------------------------------------------------------------------------------------


def time_ms(fn, args):
    """Median CUDA-event time of fn(): warm-up (--warmup-ms of calls), then between min and max
    iterations (target time)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    for _ in range(int(min(1000, args.warmup_ms / est))):
        fn()
    iters = int(min(args.max_iters, max(args.min_iters, args.target_ms / est)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for s, e in events:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _no_grad_call(fn):
    with torch.no_grad():
        return fn()


def check_ours(out, q, k, v, causal):
    """Max abs difference of our forward vs torch's (a sanity check, not the test suite)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal).transpose(1, 2)
        return (out.float() - ref.float()).abs().max().item()
    except Exception:  # noqa: BLE001
        return float("nan")


# ---- main --------------------------------------------------------------------------------------


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_vs_peers: no CUDA device; nothing to measure", file=sys.stderr)
        return 1
    device = torch.cuda.get_device_name()
    date = datetime.date.today().strftime("%Y%m%d")
    out_path = Path(args.out) if args.out else Path(args.out_dir) / f"{slug(device)}-{date}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import flashattn

        lib = f"flashattn {flashattn.version()} ({flashattn.library_path()}; {','.join(flashattn.compiled_backends())})"
    except Exception as e:  # noqa: BLE001
        lib = f"flashattn unavailable: {e}"
    print(f"device: {device} | torch {torch.__version__} | {lib}")
    print(f"sweep: hdims {args.hdims}, seqlens {args.seqlens}, causal {args.causals}, modes {args.modes}, "
          f"impls {args.impls}; budget {args.budget_s:.0f} s")

    configs = []
    for hdim in args.hdims:
        for seqlen in args.seqlens:
            for causal in args.causals:
                configs.append((hdim, seqlen, max(1, TOTAL_TOKENS // seqlen), HIDDEN // hdim, causal))
    timed = [m for m in ("fwd", "fwdbwd") if m in args.modes or ("bwd" in args.modes)]
    results = {}  # (impl, mode, hdim, seqlen, causal) -> tflops or error string
    rows = []
    t0 = time.time()

    def save():
        doc = {"device": device, "torch": torch.__version__, "rows": rows}
        out_path.write_text(json.dumps(doc, indent=1) + "\n")

    VARIANT["dropout_p"] = args.dropout_p
    makers = {}
    for impl in sorted(args.impls, key=lambda i: (RUN_ORDER.index(i.partition("+")[0]), i)):
        try:
            makers[impl] = make_impl(impl)
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {e}".splitlines()[0]
            print(f"[{impl}] unavailable: {why}")
            for c in configs:
                for m in args.modes:
                    results[(impl, m) + (c[0], c[1], c[4])] = why

    # Configs outer, implementations inner: every implementation of a row is measured within
    # seconds of the others, so clock and thermal drift over the run do not bias the ratios;
    # the order alternates row by row (peers first, then ours first). FlexAttention goes in a
    # pass of its own at the end: its compiles keep the host CPU busy, which would slow the
    # host-bound short-sequence calls of whoever runs next.
    flexes = [i for i in makers if i.startswith("flex")]
    eager = [i for i in makers if i not in flexes]
    passes = [(c, eager[::-1] if n % 2 else eager) for n, c in enumerate(configs)]
    passes += [(c, flexes) for c in configs if flexes and c[0] in args.flex_hdims]
    for impl in flexes:
        for c in configs:
            if c[0] not in args.flex_hdims:
                for m in args.modes:
                    results[(impl, m) + (c[0], c[1], c[4])] = "skipped (--flex-hdims)"
    for (hdim, seqlen, batch, nheads, causal), impls in passes:
        key = (hdim, seqlen, causal)
        torch.manual_seed(0)
        q, k, v, dout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        fns_of = {}  # impl -> {mode: callable}
        ms = {impl: {m: [] for m in timed} for impl in impls}  # per-round milliseconds
        failed = {impl: {} for impl in impls}  # impl -> {mode: why}
        for impl in impls:
            try:
                fns = dict(zip(("fwd", "fwdbwd"), makers[impl](q, k, v, dout, causal)))
                fwd_fn = fns["fwd"]
                # Forward alone is timed as inference (no autograd graph), for every implementation.
                fns["fwd"] = lambda f=fwd_fn: _no_grad_call(f)
                if impl.startswith("flashattn") and "+" not in impl:
                    err = check_ours(fns["fwd"](), q, k, v, causal)
                    if not err <= 0.03:
                        print(f"[{impl}] WARNING hdim {hdim} seqlen {seqlen} causal {causal}: max |ours - torch| = {err:.3g}")
                fns_of[impl] = fns
            except Exception as e:  # noqa: BLE001
                failed[impl] = {m: f"{type(e).__name__}: {e}".splitlines()[0][:160] for m in timed}
        for rnd in range(args.rounds):
            for impl in impls if rnd % 2 == 0 else impls[::-1]:
                if impl not in fns_of:
                    continue
                if time.time() - t0 > args.budget_s:
                    if rnd == 0:
                        failed[impl] = {m: "time budget (--budget-s exhausted)" for m in timed}
                    continue
                for mode in timed:
                    if mode in failed[impl]:
                        continue
                    try:
                        ms[impl][mode].append(time_ms(fns_of[impl][mode], args))
                    except Exception as e:  # noqa: BLE001
                        failed[impl][mode] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        fns_of = None
        for impl in impls:
            rounds = {m: ms[impl][m] for m in timed if ms[impl][m] and m not in failed[impl]}
            med = {m: statistics.median(t) for m, t in rounds.items()}
            if "fwd" in med and "fwdbwd" in med:
                n = min(len(rounds["fwd"]), len(rounds["fwdbwd"]))
                rounds["bwd"] = [b - f for f, b in zip(rounds["fwd"][:n], rounds["fwdbwd"][:n])]
                if med["fwdbwd"] > med["fwd"]:
                    med["bwd"] = med["fwdbwd"] - med["fwd"]
                else:
                    failed[impl]["bwd"] = "bwd <= 0 (noise)"
            else:
                failed[impl].setdefault("bwd", "needs fwd and fwdbwd")
            for mode in args.modes:
                if mode in med:
                    f = flops(mode, batch, nheads, seqlen, hdim, causal)
                    tf = f / (med[mode] * 1e-3) / 1e12
                    results[(impl, mode) + key] = tf
                    rows.append({"impl": impl.partition("+")[0], "variant": impl.partition("+")[2] or "plain",
                                 "dropout_p": args.dropout_p if impl.endswith("+dropout") else 0.0,
                                 "mode": mode, "dtype": "fp8" if impl.endswith("+fp8") else "bf16", "hdim": hdim, "seqlen": seqlen,
                                 "batch": batch, "nheads": nheads, "causal": causal, "tflops": round(tf, 2),
                                 "tflops_rounds": [round(f / (t * 1e-3) / 1e12, 2) if t > 0 else None
                                                   for t in rounds[mode]]})
                else:
                    results[(impl, mode) + key] = failed[impl].get(mode, "not timed")
            shown = "  ".join(f"{m} {results[(impl, m) + key]:.1f}" if isinstance(results[(impl, m) + key], float)
                              else f"{m} n/a" for m in args.modes)
            spread = ""
            if args.rounds > 1 and len(rounds.get("fwd", [])) > 1:
                lo, hi = min(rounds["fwd"]), max(rounds["fwd"])
                spread = f"  [fwd {len(rounds['fwd'])} rounds, spread {100 * (hi - lo) / lo:.1f}%]"
            print(f"[{impl}] hdim {hdim:3d} seqlen {seqlen:5d} causal {int(causal)}: {shown} TFLOP/s{spread}"
                  f"  ({time.time() - t0:.0f} s)", flush=True)
            for m in timed:
                if not isinstance(results[(impl, m) + key], float):
                    print(f"    {m} n/a: {results[(impl, m) + key]}")
        save()
        del q, k, v, dout
        torch.cuda.empty_cache()

    save()
    print_table(args, configs, results)
    print(f"\nwrote {out_path} ({len(rows)} rows) in {time.time() - t0:.0f} s")
    return 0


def print_table(args, configs, results):
    impls = [i for i in args.impls if i.partition("+")[0] in ALL_IMPLS]
    ours = [i for i in impls if i.startswith("flashattn") and "+" not in i]
    short = {"flashattn-sm90": "sm90", "flashattn-sm90-det": "sm90det", "flashattn-sm80": "sm80", "efficient": "effic"}
    short = {i: short.get(i.partition("+")[0], i.partition("+")[0]) + ("+" + i.partition("+")[2][:4] if "+" in i else "")
             for i in impls}
    for mode in args.modes:
        print(f"\n== {mode} (TFLOP/s, bf16; ratio = ours / peer)")
        head = f"{'causal':>6} {'hdim':>4} {'seqlen':>6} " + " ".join(f"{short.get(i, i):>9}" for i in impls)
        ratios = [(o, p) for o in ours for p in ("cudnn", "fa2") if p in impls]
        # A variant's cost: ours with the option / ours without it, in the same passes.
        ratios += [(i, i.partition("+")[0]) for i in impls if "+" in i and i.startswith("flashattn")]
        head += " " + " ".join(f"{short.get(o, o) + '/' + short.get(p, p):>10}" for o, p in ratios)
        print(head)
        for hdim, seqlen, batch, nheads, causal in configs:
            key = (hdim, seqlen, causal)
            vals = [results.get((i, mode) + key) for i in impls]
            line = f"{int(causal):>6} {hdim:>4} {seqlen:>6} " + " ".join(
                f"{v:9.1f}" if isinstance(v, float) else f"{'n/a':>9}" for v in vals)
            for o, p in ratios:
                a, b = results.get((o, mode) + key), results.get((p, mode) + key)
                line += " " + (f"{a / b:10.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0
                               else f"{'n/a':>10}")
            print(line)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - leave a trace instead of a bare crash
        traceback.print_exc()
        sys.exit(1)

#!/usr/bin/env python3
"""CPU bench row: our flash_attn_func on CPU tensors vs torch SDPA on the same inputs.

Shapes follow the issue's target: b=1, s=4096, h=8, d=128; fp32 and bf16, causal and not,
forward and forward+backward. SDPA gets the (b, h, s, d) transposed views of the same
tensors (what a drop-in caller would pass). Both run on torch.set_num_threads(--threads);
ours reads that count through the C ABI (options.num_threads). Per row: warm-up, then the
median of --runs timed calls, ours and SDPA
alternating (a shared machine's load then hits both alike); process CPU time is kept too. Writes bench/results/cpu-<host>-<date>[-tag].json and prints a table.

Usage: python bench/bench_cpu.py [--threads 2] [--runs 5] [--seqlen 4096] [--tag before]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from flashattn import flash_attn_func  # noqa: E402
from flashattn import _lib  # noqa: E402


def timed(fn):
    """(wall s, process CPU s) of one call; CPU time shows contention from other processes."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def interleaved(f_ours, f_sdpa, runs, warmup):
    """Alternates the two (order swapped every run) so that load from other processes on a
    shared machine hits both alike; returns the per-run (wall, cpu) lists of each."""
    for _ in range(warmup):
        f_ours()
        f_sdpa()
    ours, sdpa = [], []
    for r in range(runs):
        if r % 2 == 0:
            ours.append(timed(f_ours))
            sdpa.append(timed(f_sdpa))
        else:
            sdpa.append(timed(f_sdpa))
            ours.append(timed(f_ours))
    return ours, sdpa


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=None, help="JSON path (default: bench/results/cpu-...json)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    b, s, h, d = a.batch, a.seqlen, a.heads, a.headdim
    rows = []
    for dname in a.dtypes.split(","):
        dt = dtypes[dname]
        q, k, v, do = (torch.randn(b, s, h, d, dtype=dt) for _ in range(4))
        for causal in (False, True):
            for mode in a.modes.split(","):
                bwd = mode == "fwdbwd"
                qg, kg, vg = (t.clone().requires_grad_(bwd) for t in (q, k, v))

                def ours():
                    o = flash_attn_func(qg, kg, vg, causal=causal)
                    if bwd:
                        o.backward(do)

                def sdpa():
                    o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                       is_causal=causal)
                    if bwd:
                        o.backward(do.transpose(1, 2))

                ctx = torch.enable_grad() if bwd else torch.no_grad()
                with ctx:
                    r_ours, r_sdpa = interleaved(ours, sdpa, a.runs, a.warmup)
                t_ours = statistics.median(w for w, _ in r_ours)
                t_sdpa = statistics.median(w for w, _ in r_sdpa)
                row = {"dtype": dname, "causal": causal, "mode": mode, "ours_s": t_ours, "sdpa_s": t_sdpa,
                       "ratio": t_ours / t_sdpa,
                       "ours_cpu_s": statistics.median(c for _, c in r_ours),
                       "sdpa_cpu_s": statistics.median(c for _, c in r_sdpa),
                       "ours_runs_wall_s": [w for w, _ in r_ours], "sdpa_runs_wall_s": [w for w, _ in r_sdpa]}
                row["cpu_ratio"] = row["ours_cpu_s"] / row["sdpa_cpu_s"]
                rows.append(row)
                print(f"{dname:5} causal={int(causal)} {mode:6}  ours {t_ours * 1e3:8.1f} ms  "
                      f"sdpa {t_sdpa * 1e3:8.1f} ms  ratio {row['ratio']:.2f}  (CPU-time ratio {row['cpu_ratio']:.2f})",
                      flush=True)

    meta = {
        "shape": {"batch": b, "seqlen": s, "heads": h, "headdim": d},
        "threads": a.threads, "runs": a.runs, "warmup": a.warmup, "statistic": "median, interleaved",
        "loadavg_at_end": os.getloadavg(), "affinity": sorted(os.sched_getaffinity(0)),
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "library": _lib.library_path(), "date": datetime.date.today().isoformat(), "tag": a.tag,
    }
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / (
        f"cpu-{platform.node() or 'host'}-{meta['date']}{'-' + a.tag if a.tag else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n| dtype | causal | mode | ours (ms) | SDPA (ms) | ours/SDPA | CPU-time ratio |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['mode']} | {r['ours_s'] * 1e3:.0f} | "
              f"{r['sdpa_s'] * 1e3:.0f} | {r['ratio']:.2f} | {r['cpu_ratio']:.2f} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

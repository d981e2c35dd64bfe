"""Summary of a device A/B's bench rows: `<variant> <kind> <flashattn-bench row>` lines (the s28/s29 scripts'
rows.txt). Per (kind, seqlen, causal): every variant's TFLOP/s per round, and the best round of each variant over
the first (the base).
    python3 ab_rows.py rows.txt base new [w224 ...]"""
import collections
import sys

rows, variants = sys.argv[1], sys.argv[2:] or ["base", "new"]
res = collections.defaultdict(list)
for line in open(rows):
    f = line.split()
    try:
        res[(f[1], int(f[6]), f[9], f[0])].append(float(f[11]))
    except (ValueError, IndexError):
        pass
for k in sorted({x[:3] for x in res}):
    got = {v: res[k + (v,)] for v in variants}
    base = got[variants[0]]
    ratios = [f"{v}/{variants[0]} {max(got[v]) / max(base):.3f}" for v in variants[1:] if base and got[v]]
    print(k, *[f"{v} {got[v]}" for v in variants], *ratios)

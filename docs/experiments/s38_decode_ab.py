"""Decode A/B table of bench_decode JSONs named decode-<variant>-r<round>.json in one folder (s38 calls 3, 4, 7,
11, 12): per row the per-layer time of the base and the change, min and median over rounds, and the % of copy.

    python3 docs/experiments/s38_decode_ab.py DIR BASE CHANGE
"""
import glob
import json
import statistics
import sys


def load(folder, variant):
    rows = {}
    for f in sorted(glob.glob(f"{folder}/decode-{variant}-r*.json")):
        for r in json.load(open(f))["rows"]:
            k = (r["impl"], r["seqlen_q"], r["batch"], r["cache"], r["nheads_q"], r["nheads_kv"])
            rows.setdefault(k, []).append(r["ms"] * 1000)
    return rows


def main():
    folder, base, change = sys.argv[1:4]
    a, b = load(folder, base), load(folder, change)
    copy = json.load(open(sorted(glob.glob(f"{folder}/decode-{change}-r*.json"))[0]))["copy_gbps"]
    print("impl sq b cache hq/hk kvMB | base us: min / median (% of copy at min) | change | diff of min, of median")
    for k in sorted(a):
        if k not in b:
            continue
        by = 2 * k[2] * (k[3] + 1) * k[5] * 128 * 2
        pct = lambda t: 100 * by / t / 1e3 / copy  # noqa: E731
        ta, tb = min(a[k]), min(b[k])
        ma, mb = statistics.median(a[k]), statistics.median(b[k])
        print(f"{k[0]:16s} sq{k[1]} b{k[2]} {k[3]:>6} h{k[4]}/{k[5]} {by / 1e6:5.0f} | {ta:6.2f} / {ma:6.2f} ({pct(ta):5.1f}) | "
              f"{tb:6.2f} / {mb:6.2f} ({pct(tb):5.1f}) | {tb - ta:+5.2f}, {mb - ma:+5.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# s38 call 5: forced split counts on the batch-8 4k decode rows (HEAD's library, s37g pack): is the combine
# after 2 splits worth its ~2 us there?
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s38c5; mkdir -p $L /tmp/a
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
for r in 1 2; do
  LD_LIBRARY_PATH=/tmp/a FLASHATTN_LIBRARY=/tmp/a/libflashattn.so PYTHONPATH=$PWD/python \
    timeout 200 python3 bench/bench_decode.py --seqlens-q 1,4 --caches 2048,4096,8192 --batches 8,16 \
    --heads 32/8,64/8 --impls flashattn,flashattn-s1,flashattn-s3,flashattn-s4 --target-ms 100 \
    --out $L/splits-r$r.json > $L/splits-r$r.log 2>&1
  echo "r$r rc=$?"
done
python3 - $L <<'PY'
import json, sys, glob
L = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{L}/splits-r*.json")):
    for r in json.load(open(f))["rows"]:
        k = (r["seqlen_q"], r["batch"], r["cache"], r["nheads_q"], r["nheads_kv"])
        rows.setdefault(k, {}).setdefault(r["impl"], []).append(r["pct_of_copy"])
impls = ["flashattn", "flashattn-s1", "flashattn-s3", "flashattn-s4"]
print("row kvMB | " + " | ".join(impls) + "   (% of copy, best of 2)")
for k in sorted(rows):
    mb = 2 * k[1] * (k[2] + 1) * k[4] * 128 * 2 / 1e6
    print(f"sq{k[0]} b{k[1]} {k[2]:>5} h{k[3]}/{k[4]} {mb:5.0f} | " + " | ".join(f"{max(rows[k].get(i, [0])):5.1f}" for i in impls))
PY
grep -h "splits\|num_splits" $L/splits-r1.log | head -5

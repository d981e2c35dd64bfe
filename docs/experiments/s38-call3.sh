#!/usr/bin/env bash
# s38 call 3: the decode timeline with the first K/V block issued before Q and the fused append after the
# prologue (traced pack build-dev/s38tc), then bench_decode A/B: HEAD's library (s37g pack) against the
# same change untraced (s38b pack), two alternated rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s38c3; mkdir -p $L /tmp/tc /tmp/a /tmp/b
cat build-dev/s38tc/pack.part.* | tar xzf - -C /tmp/tc || exit 1
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
cat build-dev/s38b/pack.part.* | tar xzf - -C /tmp/b || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
for row in "1 1 16384 32/8" "1 8 4096 32/8" "4 1 16384 64/8"; do
  set -- $row
  tag=sq$1-b$2-c$3-h${4/\//-}
  LD_LIBRARY_PATH=/tmp/tc FLASHATTN_LIBRARY=/tmp/tc/libflashattn.so PYTHONPATH=$PWD/python \
    timeout 90 python3 docs/experiments/s38-decode-trace.py --sq $1 --batch $2 --cache $3 --heads $4 \
    --out $L/$tag.bin > $L/$tag.txt 2>&1
  grep -v "^[0-7] |" $L/$tag.txt | tail -32
done
for r in 1 2; do
  for v in a b; do
    LD_LIBRARY_PATH=/tmp/$v FLASHATTN_LIBRARY=/tmp/$v/libflashattn.so PYTHONPATH=$PWD/python \
      timeout 200 python3 bench/bench_decode.py --seqlens-q 1,4 --caches 4096,16384,65536 --batches 1,8 \
      --heads 32/8,64/8 --impls flashattn,flashattn-paged --target-ms 100 --out $L/decode-$v-r$r.json > $L/decode-$v-r$r.log 2>&1
    echo "$v r$r rc=$?"
  done
done
python3 - $L <<'PY'
import json, sys, glob
L = sys.argv[1]
def load(v):
    rows = {}
    for f in sorted(glob.glob(f"{L}/decode-{v}-r*.json")):
        for r in json.load(open(f))["rows"]:
            k = (r["impl"], r["seqlen_q"], r["batch"], r["cache"], r["nheads_q"], r["nheads_kv"])
            rows.setdefault(k, []).append(r["pct_of_copy"])
    return rows
a, b = load("a"), load("b")
print("impl sq b cache hq/hk kvMB | HEAD % (best) | change % (best) | diff")
for k in sorted(a):
    if k not in b: continue
    mb = 2 * k[2] * (k[3] + 1) * k[5] * 128 * 2 / 1e6
    print(f"{k[0]:16s} sq{k[1]} b{k[2]} {k[3]:>6} h{k[4]}/{k[5]} {mb:6.0f} | {max(a[k]):5.1f} | {max(b[k]):5.1f} | {max(b[k]) - max(a[k]):+5.1f}")
PY
cd $OUT && tar czf s38c3.tgz s38c3 && rm -rf s38c3/*.bin

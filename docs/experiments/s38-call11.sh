#!/usr/bin/env bash
# s38 call 11: the combine with a warp-level LSE reduction per warp, one barrier (combine_row_warps_kernel; pack s38r)
# against HEAD (s37g): tests, sanitizers, bench_decode batch-1 rows, two alternated rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s38c11; mkdir -p $L /tmp/n /tmp/a
cat build-dev/s38r/pack.part.* | tar xzf - -C /tmp/n || exit 1
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
LD_LIBRARY_PATH=/tmp/n timeout 240 /tmp/n/tests/gpu/flashattn_gpu_tests --gtest_filter='*GpuCombine*:*GpuKvCache*' > $L/gtest.log 2>&1
echo "tests rc=$? ok $(grep -c '^\[       OK \]' $L/gtest.log) failed $(grep -c '^\[  FAILED  \] .*(' $L/gtest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^\[  FAILED  \]|Failure" $L/gtest.log | head -5
for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=/tmp/n timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 /tmp/n/tests/gpu/flashattn_gpu_tests \
    --gtest_filter='GpuCombine.*:*GpuKvCache.SmallCases/*' > $L/sanitizer-$tool.log 2>&1
  echo "$tool rc=$? $(tail -1 $L/sanitizer-$tool.log) t=$(( $(date +%s) - t0 ))"
done
for r in 1 2; do
  for v in a n; do
    LD_LIBRARY_PATH=/tmp/$v FLASHATTN_LIBRARY=/tmp/$v/libflashattn.so PYTHONPATH=$PWD/python \
      timeout 150 python3 bench/bench_decode.py --seqlens-q 1,4 --caches 4096,16384,65536 --batches 1 \
      --heads 32/8,64/8,32/32 --impls flashattn,flashattn-paged --target-ms 100 --out $L/decode-$v-r$r.json > $L/decode-$v-r$r.log 2>&1
    echo "bench $v r$r rc=$? t=$(( $(date +%s) - t0 ))"
  done
done
python3 - $L <<'PY' | tee $L/ab.txt
import json, sys, glob
L = sys.argv[1]
def load(v):
    rows = {}
    for f in sorted(glob.glob(f"{L}/decode-{v}-r*.json")):
        for r in json.load(open(f))["rows"]:
            k = (r["impl"], r["seqlen_q"], r["batch"], r["cache"], r["nheads_q"], r["nheads_kv"])
            rows.setdefault(k, []).append(r["ms"] * 1000)
    return rows
a, b = load("a"), load("n")
print("impl sq b cache hq/hk kvMB | HEAD us (% of copy) | change us | diff us   (best of 2, per layer)")
copy = json.load(open(sorted(glob.glob(f"{L}/decode-n-r*.json"))[0]))["copy_gbps"]
for k in sorted(a):
    if k not in b: continue
    by = 2 * k[2] * (k[3] + 1) * k[5] * 128 * 2
    ta, tb = min(a[k]), min(b[k])
    print(f"{k[0]:16s} sq{k[1]} b{k[2]} {k[3]:>6} h{k[4]}/{k[5]} {by / 1e6:5.0f} | {ta:6.2f} ({100 * by / ta / 1e3 / copy:5.1f}) | "
          f"{tb:6.2f} ({100 * by / tb / 1e3 / copy:5.1f}) | {tb - ta:+5.2f}")
PY
cd $OUT && tar czf s38c11.tgz s38c11

#!/usr/bin/env bash
# s38 call 13: the final library (combine_row_warps_kernel from 17 splits; pack s38r): combine and KV-cache GPU
# tests, memcheck and racecheck on them, the Python combine and KV-cache tests on the GPU, and one decode sweep
# beside cuDNN (batch 1 and 8).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s38c13; mkdir -p $L /tmp/n
cat build-dev/s38r/pack.part.* | tar xzf - -C /tmp/n || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
LD_LIBRARY_PATH=/tmp/n timeout 120 /tmp/n/tests/gpu/flashattn_gpu_tests --gtest_filter='*GpuCombine*:*GpuKvCache*' > $L/gtest.log 2>&1
echo "tests rc=$? ok $(grep -c '^\[       OK \]' $L/gtest.log) failed $(grep -c '^\[  FAILED  \] .*(' $L/gtest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^\[  FAILED  \]|Failure" $L/gtest.log | head -5
for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=/tmp/n timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 /tmp/n/tests/gpu/flashattn_gpu_tests \
    --gtest_filter='GpuCombine.*:*GpuKvCache.SmallCases/*:*GpuKvCache.LongDecodeSplits/*' > $L/sanitizer-$tool.log 2>&1
  echo "$tool rc=$? $(tail -1 $L/sanitizer-$tool.log) t=$(( $(date +%s) - t0 ))"
done
(cd tests/python && LD_LIBRARY_PATH=/tmp/n FLASHATTN_LIBRARY=/tmp/n/libflashattn.so PYTHONPATH=$PWD/../../python timeout 150 \
  python3 -m pytest -q -p no:cacheprovider test_combine.py test_kvcache.py > $L/pytest.log 2>&1)
echo "pytest rc=$? $(tail -1 $L/pytest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^FAILED|Error" $L/pytest.log | head -5
LD_LIBRARY_PATH=/tmp/n FLASHATTN_LIBRARY=/tmp/n/libflashattn.so PYTHONPATH=$PWD/python timeout 120 python3 bench/bench_decode.py \
  --seqlens-q 1,4 --caches 4096,16384 --batches 1,8 --heads 32/8,64/8 --impls flashattn,flashattn-paged,cudnn \
  --target-ms 100 --out $L/decode-h200-20261128-s38.json > $L/decode.log 2>&1
echo "decode rc=$? t=$(( $(date +%s) - t0 ))"
python3 - $L <<'PY'
import json, sys
d = json.load(open(f"{sys.argv[1]}/decode-h200-20261128-s38.json"))
rows = {}
for r in d["rows"]:
    k = (r["seqlen_q"], r["batch"], r["cache"], r["nheads_q"], r["nheads_kv"])
    rows.setdefault(k, {})[r["impl"]] = r["pct_of_copy"]
print(f"copy {d['copy_gbps']:.0f} GB/s; host us {d.get('host_us')}")
print("row kvMB | flashattn | paged | cudnn   (% of copy)")
for k in sorted(rows):
    mb = 2 * k[1] * (k[2] + 1) * k[4] * 128 * 2 / 1e6
    if mb < 64: continue
    v = rows[k]
    print(f"sq{k[0]} b{k[1]} {k[2]:>6} h{k[3]}/{k[4]} {mb:5.0f} | " + " | ".join(f"{v.get(i, float('nan')):5.1f}" for i in ("flashattn", "flashattn-paged", "cudnn")))
PY
cd $OUT && tar czf s38c13.tgz s38c13

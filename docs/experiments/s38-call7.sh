#!/usr/bin/env bash
# s38 calls 7 and 11: a combine change (pack PACK: the library + its GPU tests) against HEAD's library (s37g):
# combine and KV-cache GPU tests, memcheck/racecheck on the combine tests, then bench_decode on the batch-1 rows
# (29 splits) in two alternated rounds. Call 7: the warp-per-row vector kernel up to 32 splits (defaults); call 11:
# PACK=s38r TAG=s38c11 (an LSE reduction per warp, one barrier).
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=${PACK:-s38c}; TAG=${TAG:-s38c7}
t0=$(date +%s); L=$OUT/$TAG; mkdir -p $L /tmp/n /tmp/a
cat build-dev/$PACK/pack.part.* | tar xzf - -C /tmp/n || exit 1
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
python3 docs/experiments/s38_decode_ab.py $L a n | tee $L/ab.txt
cd $OUT && tar czf $TAG.tgz $TAG

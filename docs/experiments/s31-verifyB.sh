#!/usr/bin/env bash
# s31 verification, call B (no build): the GPU suite on the full-build pack of the final tree (KV-cache cases last:
# their sm80 kernels did not change), then memcheck and racecheck on the FP8 forward and the small sm90 cases.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
cat build-dev/s31full/pack.part.* | tar xzf - || exit 1
export LD_LIBRARY_PATH=$PWD/build-gpu
T=build-gpu/tests/gpu/flashattn_gpu_tests
timeout 330 $T --gtest_filter='-*KvCache*' > $L/gtest-gpu.log 2>&1; echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" $L/gtest-gpu.log | head -8; echo "ok: $(grep -c '^\[       OK \]' $L/gtest-gpu.log) skipped: $(grep -c 'SKIPPED \]' $L/gtest-gpu.log)"
for tool in memcheck racecheck; do
  timeout 110 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='*Fp8Attention*:Sanitize/GpuSmall*' > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY|tests? ran" $L/$tool.log | head -4
done
left=$(( 580 - ($(date +%s) - t0) ))
[ $left -gt 30 ] && { timeout $left $T --gtest_filter='*KvCache*' > $L/gtest-kv.log 2>&1; echo "kv rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-kv.log | head -4; }
cd $OUT && tar czf logs.tgz l && rm -rf l

#!/usr/bin/env bash
# s39 verification, call B (no build; call A's pack, build-dev/s39full): the rest of the GPU suite, then memcheck and
# racecheck on the FP8 V^T and V-rows cases (the kernels whose schedule changed) and the small cases.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
cat build-dev/s39full/pack.part.* | tar xzf - || exit 1
export LD_LIBRARY_PATH=$PWD/build-gpu
T=build-gpu/tests/gpu/flashattn_gpu_tests
if [ "${REST:-1}" = 1 ]; then
  timeout ${REST_T:-200} $T --gtest_filter='Sanitize/*:Sm80/*:GpuSmemCap*:GpuCombine*:Backends/*' > $L/gtest-gpu-b.log 2>&1
  echo "rest rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-gpu-b.log | head -6; echo "ok: $(grep -c '^\[       OK \]' $L/gtest-gpu-b.log)"
  grep -E "^\[ RUN      \]" $L/gtest-gpu-b.log | tail -1
fi
for tool in memcheck racecheck; do
  timeout ${SAN_T:-45} compute-sanitizer --tool $tool --error-exitcode 9 $T \
    --gtest_filter="${SAN_FILTER:-*GpuFp8AttentionVt*/case2?:*GpuFp8Attention.*/case1:*Small*}" > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY|^\[       OK" $L/$tool.log | tail -4
done
cd $OUT && tar czf logs.tgz l && rm -rf l

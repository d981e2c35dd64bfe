#!/usr/bin/env bash
# s32, call 1: the FP8 wide kernel with per-64-key-group scales (mainloop.h kGroupBody). Pack build-dev/s32ab: an
# sm90-only hdim-128 local build of the tree (bench, GPU tests) with two libraries differing only in
# fwd_hdim128_fp8_bf16.cu.o: head (eebdb55's object) and new. The FP8 GPU tests on new, the A/B rows (s30-fp8ab.sh,
# 2 alternated rounds, block-scale rows included), then memcheck and racecheck on the V^T cases (the wide kernels).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
PACK=build-dev/s32ab VARS="head new" TESTVARS="new" BLOCKS=1 bash docs/experiments/s30-fp8ab.sh
T=/tmp/v/flashattn_gpu_tests; L=$OUT/ab
for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=/tmp/v/new timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 $T \
    --gtest_filter='*GpuFp8AttentionVt*' > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY" $L/$tool.log | head -4
done
cd $OUT && tar czf ab.tgz ab && rm -rf ab

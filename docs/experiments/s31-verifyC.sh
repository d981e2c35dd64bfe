#!/usr/bin/env bash
# s31 call C: full build of eebdb55+ (the helpers), then the FP8 and sm90 GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
PACK=0 CTEST=0 GTEST=0 SANITIZE=0 PYTEST=0 BENCH=0 DECODE=0 SMOKE=0 SASS=0 BUILD_DIR=$PWD/build-gpu OUT=$L bash scripts/gpu-check > $L/main.txt 2>&1
tail -2 $L/main.txt; echo "build t=$(( $(date +%s) - t0 ))"; grep -o "(C75[0-9]*)" $L/build.log | sort | uniq -c
timeout 150 build-gpu/tests/gpu/flashattn_gpu_tests --gtest_filter='*Fp8*:*Sm90*:*sm90*:*Small*' > $L/gtest.log 2>&1
echo "tests rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" $L/gtest.log | head -8
cp $L/gtest.log $OUT/gtest-fp8-sm90-h200-20261127-s31-eebdb55.log

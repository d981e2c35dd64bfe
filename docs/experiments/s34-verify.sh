#!/usr/bin/env bash
# s34 verification: full build of the final tree (every head dim, both GPU paths), C75xx report, then the whole GPU
# suite in one call, FP8 first (the only code that changed: a SASS-identical refactor, and two new cases), the
# KV-cache cases last, until the call's limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
CTEST=0 GTEST=0 SANITIZE=0 PYTEST=0 BENCH=0 DECODE=0 SMOKE=0 SASS=0 BUILD_DIR=$PWD/build-gpu OUT=$L bash scripts/gpu-check > $L/main.txt 2>&1
tail -3 $L/main.txt; echo "build t=$(( $(date +%s) - t0 ))"
grep -o "(C75[0-9]*)" $L/build.log | sort | uniq -c
T=build-gpu/tests/gpu/flashattn_gpu_tests
timeout $(( ${LIMIT:-580} - ($(date +%s) - t0) )) $T --gtest_filter='*Fp8*:Sanitize/*:Sm80/*:GpuSmemCap*:GpuCombine*:Grid/*:ScoreMods/*:Backends/GpuDeterminism*:Backends/GpuLong*:Backends/GpuKvCache*' > $L/gtest-gpu.log 2>&1
echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" $L/gtest-gpu.log | head -8; echo "ok: $(grep -c '^\[       OK \]' $L/gtest-gpu.log) skipped: $(grep -c 'SKIPPED \]' $L/gtest-gpu.log)"
grep -E "^\[ RUN      \]" $L/gtest-gpu.log | tail -1
cd $OUT && tar czf logs.tgz l && rm -rf l

#!/usr/bin/env bash
# s39 verification, call A: full build of the tree (every head dim, both GPU paths; PACK=1), C75xx report, the pack
# back to the VM (for call B), then the GPU suite's FP8, grid and score-mod cases until the call's limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
PACK=1 CTEST=0 GTEST=0 SANITIZE=0 PYTEST=0 BENCH=0 DECODE=0 SMOKE=0 SASS=0 BUILD_DIR=$PWD/build-gpu OUT=$L bash scripts/gpu-check > $L/main.txt 2>&1
tail -3 $L/main.txt; echo "build t=$(( $(date +%s) - t0 ))"
grep -o "(C75[0-9]*)" $L/build.log | sort | uniq -c
split -b 15M $L/build-bin.tgz $OUT/pack.part. && rm $L/build-bin.tgz
T=build-gpu/tests/gpu/flashattn_gpu_tests
timeout $(( ${LIMIT:-585} - ($(date +%s) - t0) )) $T --gtest_filter="${FILTER:-*Fp8*:Grid/*:ScoreMods/*}" > $L/gtest-gpu-a.log 2>&1
echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests? ran" $L/gtest-gpu-a.log | head -8; echo "ok: $(grep -c '^\[       OK \]' $L/gtest-gpu-a.log) skipped: $(grep -c 'SKIPPED \]' $L/gtest-gpu-a.log)"
grep -E "^\[ RUN      \]" $L/gtest-gpu-a.log | tail -1
cd $OUT && tar czf logs.tgz l && rm -rf l

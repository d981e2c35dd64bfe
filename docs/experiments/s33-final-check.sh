#!/usr/bin/env bash
# s33 call J: the final tree (the stagger taken out again after call I; its FP8 objects' SASS equals call I's s0):
# the wide kernels' V^T GPU cases 20-28 and the FP8 API/small cases, then memcheck on cases 20-28, from an sm90-only
# hdim-128 local build (build-dev/s33final).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/lj; mkdir -p $L /tmp/v
cat build-dev/s33final/pack.part.* | tar xzf - -C /tmp/v || exit 1
export LD_LIBRARY_PATH=/tmp/v/final; T=/tmp/v/flashattn_gpu_tests
F="$(printf '*Vt*/case%s:' 20 21 22 23 24 25 26 27 28)*GpuFp8AttentionApi*"
timeout 150 $T --gtest_filter="$F" > $L/gtest.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest.log) ok $(grep -c 'FAILED  \]' $L/gtest.log) failed t=$(( $(date +%s) - t0 ))"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $T --gtest_filter="$F" > $L/memcheck.log 2>&1
echo "memcheck rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY" $L/memcheck.log | head -3
cd $OUT && tar czf lj.tgz lj; rm -rf lj

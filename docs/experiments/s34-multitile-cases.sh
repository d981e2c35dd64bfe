#!/usr/bin/env bash
# s34 call D: the two new V^T cases with more tiles than SMs (29: the lean wide kernel, 30: the group kernel) and the
# wide kernels' cases 20-28, on 5614c7e's hdim-128 sm90 build (pack build-dev/s34t), then memcheck on 29 and 30.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s34d; mkdir -p $L /tmp/v
cat build-dev/s34t/pack.part.* | tar xzf - -C /tmp/v || exit 1
export LD_LIBRARY_PATH=/tmp/v/head
F="$(printf '*Vt*/case%s:' 29 30 20 21 22 23 24 25 26 27 28)*Fp8AttentionApi*"
timeout 200 /tmp/v/flashattn_gpu_tests --gtest_filter="$F" > $L/gtest.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest.log) ok $(grep -c 'FAILED  \]' $L/gtest.log) failed t=$(( $(date +%s) - t0 ))"
grep "OK \]\|FAILED  \]" $L/gtest.log | head -14
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
timeout 150 $CS --tool memcheck /tmp/v/flashattn_gpu_tests --gtest_filter="$(printf '*Vt*/case%s:' 29 30)" > $L/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log) t=$(( $(date +%s) - t0 ))"

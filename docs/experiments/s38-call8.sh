#!/usr/bin/env bash
# s38 call 8: HEAD's library (its sources unchanged since s37) with HEAD's GPU tests (pack s38f: the new GpuCombine
# cases): the combine and KV-cache tests, memcheck on the combine test; the library's bytes against s37g's.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s38c8; mkdir -p $L /tmp/n /tmp/a
cat build-dev/s38f/pack.part.* | tar xzf - -C /tmp/n || exit 1
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
LD_LIBRARY_PATH=/tmp/n timeout 240 /tmp/n/tests/gpu/flashattn_gpu_tests --gtest_filter='*GpuCombine*:*GpuKvCache*' > $L/gtest.log 2>&1
echo "tests rc=$? ok $(grep -c '^\[       OK \]' $L/gtest.log) failed $(grep -c '^\[  FAILED  \] .*(' $L/gtest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^\[  FAILED  \]|Failure" $L/gtest.log | head -5
LD_LIBRARY_PATH=/tmp/n timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/n/tests/gpu/flashattn_gpu_tests \
  --gtest_filter='GpuCombine.*' > $L/sanitizer-memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $L/sanitizer-memcheck.log) t=$(( $(date +%s) - t0 ))"
LD_LIBRARY_PATH=/tmp/a timeout 120 /tmp/n/tests/gpu/flashattn_gpu_tests --gtest_filter='GpuCombine.*' > $L/gtest-s37g-lib.log 2>&1
echo "combine test on s37g's library rc=$? $(grep -c '^\[       OK \]' $L/gtest-s37g-lib.log) ok"

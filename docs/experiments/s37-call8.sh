#!/usr/bin/env bash
# s37 call 8 (pack s37g: 4f2c965's library + the new GpuFp8Quantize.WideTransformBlocksMatchHost): the quantizer GPU
# tests and memcheck on the new one.
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s37c8; mkdir -p $L /tmp/n
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/n || exit 1
export LD_LIBRARY_PATH=/tmp/n
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
timeout 60 /tmp/n/tests/gpu/flashattn_gpu_tests --gtest_filter='*Fp8Quantize*' --gtest_output=xml:$L/gtest.xml > $L/gtest.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest.log) ok $(grep -c 'FAILED  \]' $L/gtest.log) failed"
grep -o 'hadamard_off_by_one" value="[^"]*"' $L/gtest.xml; grep -E "FAILED  \]|Failure" $L/gtest.log | head -5
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/n/tests/gpu/flashattn_gpu_tests \
  --gtest_filter='GpuFp8Quantize.WideTransformBlocksMatchHost' > $L/memcheck.log 2>&1
echo "memcheck rc=$? $(tail -1 $L/memcheck.log)"
cd $OUT && tar czf s37c8.tgz s37c8 && rm -rf s37c8

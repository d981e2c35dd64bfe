#!/usr/bin/env bash
# s36 call 3: the quantizer writing V in the keys_permuted16 layout (x_fp8_layout). Pack build-dev/s36q (pack.part.*):
# the library and flashattn_gpu_tests of an hdim-128 build (sm80 + sm90 paths) of the change. (1) the FP8 quantizer,
# permute, rows-auto and API GPU tests; (2) memcheck and racecheck on the new GPU test; (3) the FP8 pytest files on
# the GPU; (4) bench_fp8_quantize.py (GB/s of each layout beside the copy) and fp8_onecall.py (flash_attn_fp8_func
# with the new default against s35's).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s36q; mkdir -p $L /tmp/q
cat build-dev/s36q/pack.part.* | tar xzf - -C /tmp/q || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
export LD_LIBRARY_PATH=/tmp/q FLASHATTN_LIBRARY=/tmp/q/libflashattn.so PYTHONPATH=$PWD/python
timeout 200 /tmp/q/flashattn_gpu_tests --gtest_filter='*Fp8Quantize*:*Fp8VPermute*:*Fp8VRowsAuto*:*GpuFp8AttentionApi*' > $L/gtest.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest.log) ok $(grep -c 'FAILED  \]' $L/gtest.log) failed t=$(( $(date +%s) - t0 ))"
grep -E "FAILED  \]|Failure" $L/gtest.log | head -8
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 /tmp/q/flashattn_gpu_tests \
    --gtest_filter='GpuFp8Quantize.KeysPermuted16MatchesHost:GpuFp8VPermute.*' > $L/sanitizer-$tool.log 2>&1
  echo "$tool rc=$? $(tail -1 $L/sanitizer-$tool.log) t=$(( $(date +%s) - t0 ))"
done
(cd tests/python && timeout 200 python3 -m pytest -q -p no:cacheprovider test_fp8_attention.py test_fp8.py > $L/pytest.log 2>&1)
echo "pytest rc=$? $(tail -1 $L/pytest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^FAILED|Error" $L/pytest.log | head -8
timeout 100 python3 bench/bench_fp8_quantize.py --out $L/fp8-quantize.json 2>&1 | tee $L/quantize.log | tail -18
timeout 120 python3 bench/fp8_onecall.py 2>&1 | tee $L/onecall.log
echo "t=$(( $(date +%s) - t0 ))"
# (5) the rest of the call: the whole GPU suite of this build, up to the call's limit.
timeout $(( ${LIMIT:-570} - ($(date +%s) - t0) )) /tmp/q/flashattn_gpu_tests > $L/gtest-all.log 2>&1
echo "suite rc=$? ok: $(grep -c '^\[       OK \]' $L/gtest-all.log) failed: $(grep -c '^\[  FAILED  \] .*(' $L/gtest-all.log) t=$(( $(date +%s) - t0 ))"
grep -E "^\[  FAILED  \] .*\(" $L/gtest-all.log | head; grep -E "^\[ RUN      \]" $L/gtest-all.log | tail -1; grep -E "tests? ran|PASSED" $L/gtest-all.log | tail -2
cd $OUT && tar czf s36q.tgz s36q && rm -rf s36q

#!/usr/bin/env bash
# Prepared in s34 for the next session (not run): fp8-func-auto-keys-permuted16.diff on the device. Applies the diff
# to the device's copy of the tree, builds hdim 128 for the sm90 path (PYTEST=1 installs the Python side through
# gpu-check), runs the FP8 pytest file on the GPU, then bench_fp8.py --vt (rows / -vt / -auto rows side by side).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s35; mkdir -p $L
git apply docs/experiments/fp8-func-auto-keys-permuted16.diff || exit 1
HEADDIMS=128 CTEST=0 GTEST=0 SANITIZE=0 PYTEST=0 BENCH=0 DECODE=0 SMOKE=0 SASS=0 BUILD_DIR=$PWD/build-gpu \
  OUT=$L bash scripts/gpu-check > $L/main.txt 2>&1
tail -3 $L/main.txt; echo "build t=$(( $(date +%s) - t0 ))"
export FLASHATTN_LIBRARY=$PWD/build-gpu/libflashattn.so PYTHONPATH=$PWD/python
(cd tests/python && timeout 200 python3 -m pytest -q -p no:cacheprovider test_fp8_attention.py) > $L/pytest-fp8.log 2>&1
echo "pytest rc=$? $(tail -1 $L/pytest-fp8.log) t=$(( $(date +%s) - t0 ))"
timeout 200 python3 bench/bench_fp8.py --vt --seqlens 1024,4096,16384 --out-dir $L > $L/bench.txt 2>&1
grep -E "fp8|bf16" $L/bench.txt | head -30

#!/usr/bin/env bash
# s31 verification, call A': full build of the final tree, pack, C75xx report, the FP8 + sm90 GPU tests, and the
# FP8/bf16 flashattn-bench rows (hdim 64/128/256; 16k tokens).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
PACK=1 CTEST=0 GTEST=0 SANITIZE=0 PYTEST=0 BENCH=0 DECODE=0 SMOKE=0 SASS=0 BUILD_DIR=$PWD/build-gpu OUT=$L bash scripts/gpu-check > $L/main.txt 2>&1
tail -3 $L/main.txt; echo "build t=$(( $(date +%s) - t0 ))"
grep -o "(C75[0-9]*)" $L/build.log | sort | uniq -c
split -b 15M $L/build-bin.tgz $OUT/pack.part. && rm $L/build-bin.tgz
timeout 150 build-gpu/tests/gpu/flashattn_gpu_tests --gtest_filter='*Fp8*' > $L/gtest-fp8.log 2>&1
echo "fp8 tests rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-fp8.log | head -8
mkdir -p /tmp/base && cat build-dev/biny/pack.part.* | tar xzf - -C /tmp/base
run() { local v=$1; shift
  if [ $v = base ]; then LD_LIBRARY_PATH=/tmp/base/build-gpu timeout 30 /tmp/base/build-gpu/bench/flashattn-bench "$@"
  else LD_LIBRARY_PATH=$PWD/build-gpu timeout 30 build-gpu/bench/flashattn-bench "$@"; fi 2>&1 | tail -1 | sed "s/^/$v /"; }
for r in 1 2; do
  for cfg in "128 4096" "128 16384" "64 16384" "256 16384"; do set -- $cfg; d=$1; s=$2
    for v in base new; do
      for args in "--dtype fp8 --fp8-v keys_permuted16" "--dtype fp8 --fp8-v keys_permuted16 --fp8-scales head"; do
        run $v --backend sm90 --mode fwd --hdim $d --seqlen $s --batch $((16384 / s)) --nheads $((2048 / d)) $args
      done
    done
    [ $r = 1 ] && run base --backend sm90 --mode fwd --hdim $d --seqlen $s --batch $((16384 / s)) --nheads $((2048 / d)) --dtype bf16
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done | tee $L/fp8-bench.txt
echo "done t=$(( $(date +%s) - t0 ))"
cd $OUT && tar czf logs.tgz l && rm -rf l

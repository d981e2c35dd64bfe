#!/usr/bin/env bash
# s30 (reused in s31 with PACK=build-dev/s31v ROUNDS=3 BLOCKS=1): FP8 hdim-128 wide lean kernel: max in chains + part of the exp2s by polynomial (softmax.h), A/B from an
# sm90-only hdim-128 local build (build-dev/s30v/pack.tgz: bench, GPU tests, one library per variant, which differ only
# in fwd_hdim128_fp8_bf16.cu.o). FP8 GPU tests on the variants, then 2 alternated rounds of bench rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/ab; mkdir -p $L /tmp/v
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
cat ${PACK:-build-dev/s30v}/pack.part.* | tar xzf - -C /tmp/v || exit 1
VARS=${VARS:-"base v1 v2 v3 v4"}
T=/tmp/v/flashattn_gpu_tests; B=/tmp/v/flashattn-bench
for v in ${TESTVARS:-v2 v4}; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 120 $T --gtest_filter='*Fp8*' > $L/gtest-fp8-$v.log 2>&1; echo "fp8 tests $v rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-fp8-$v.log | head -8
done
R=$L/rows.txt
run() { local v=$1 k=$2; shift 2
  LD_LIBRARY_PATH=/tmp/v/$v timeout 40 $B --backend sm90 --mode fwd --hdim 128 "$@" 2>>$L/err.log | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R; }
# ROUNDS (default 2); BLOCKS=1 adds the 128-token block-scale rows (s31).
for r in $(seq 1 ${ROUNDS:-2}); do
  for s in 4096 16384; do for v in $VARS; do run $v head --seqlen $s --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done; done
  [ "${BLOCKS:-0}" = 1 ] && for s in 4096 16384; do for v in $VARS; do run $v blk --seqlen $s --dtype fp8 --fp8-v keys_permuted16; done; done
  [ $r = 1 ] && for s in 4096 16384; do run base bf16 --seqlen $s; done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 docs/experiments/ab_rows.py $R $VARS

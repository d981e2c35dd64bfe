#!/usr/bin/env bash
# Next session's first call for fp8-cross-tile-noturns.diff (prepared in s39). Pack build-dev/s39xt: the hdim-128
# library (archs 80;90a), flashattn_gpu_tests and flashattn-bench of 8204b18 + the diff; base: build-dev/s39full
# (4e60312's full build, whose FP8 code is 8204b18's). (1) gate: the FP8 GPU cases (V^T 0-30 with the multi-tile
# ones, the API, the main FP8 grid) on the diff's library; (2) memcheck on V^T cases 20-29; (3) rows base vs xt
# alternated, $ROUNDS rounds: per-head 2k-16k, scale blocks 4k, bf16 4k.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s39xt; mkdir -p $L /tmp/x
cat build-dev/s39full/pack.part.* | tar xzf - || exit 1
cat build-dev/s39xt/pack.part.* | tar xzf - -C /tmp/x || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
T=/tmp/x/tests/gpu/flashattn_gpu_tests
LD_LIBRARY_PATH=/tmp/x timeout ${GATE_T:-200} $T --gtest_filter='*Fp8AttentionVt*:*Fp8AttentionApi*:Sm90/GpuFp8Attention.*' > $L/gtest-xt.log 2>&1
echo "gate rc=$? $(grep -c '  OK ]' $L/gtest-xt.log) ok $(grep -c 'FAILED  \]' $L/gtest-xt.log) failed t=$(( $(date +%s) - t0 ))"
grep "FAILED  \]" $L/gtest-xt.log | head -5; grep "RUN" $L/gtest-xt.log | tail -1
LD_LIBRARY_PATH=/tmp/x timeout ${SAN_T:-90} compute-sanitizer --tool memcheck --error-exitcode 9 $T \
  --gtest_filter='*GpuFp8AttentionVt*/case2?' > $L/memcheck-xt.log 2>&1
echo "memcheck rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY" $L/memcheck-xt.log | tail -2
R=$L/rows.txt
row() {  # variant kind args...
  local v=$1 k=$2; shift 2
  local lp=$PWD/build-gpu; [ $v = xt ] && lp=/tmp/x
  LD_LIBRARY_PATH=$lp timeout 30 build-gpu/bench/flashattn-bench --backend sm90 --mode fwd --hdim 128 --nheads 16 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R
}
for r in $(seq ${ROUNDS:-3}); do
  for v in base xt; do
    for s in 2048 4096 8192 16384; do row $v fp8head --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done
    row $v fp8block --seqlen 4096 --batch 4 --dtype fp8 --fp8-v keys_permuted16
    row $v bf16 --seqlen 4096 --batch 4 --dtype bf16
  done
done
python3 docs/experiments/ab_rows.py $R base xt
echo "t=$(( $(date +%s) - t0 ))"

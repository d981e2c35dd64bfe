#!/usr/bin/env bash
# s39: the sm90 forward kernels without pingpong turns (FLASHATTN_EXPERIMENT_NOPP=1: Schedule<false, true> for the
# production kernels), one hdim-128 library (pack build-dev/$PACK). (1) gate: FP8 V^T and sm90 grid cases with it;
# (2) rows: base vs nopp alternated, $ROUNDS rounds, bf16 and every FP8 kernel (wide per-head, wide scale-block,
# 128-key V^T via causal, V rows).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s39n; mkdir -p $L /tmp/v
cat build-dev/${PACK:-s39b}/pack.part.* | tar xzf - -C /tmp/v || exit 1
export LD_LIBRARY_PATH=/tmp/v
T=/tmp/v/tests/gpu/flashattn_gpu_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "${GATE:-1}" = 1 ]; then
  FLASHATTN_EXPERIMENT_NOPP=1 timeout ${GATE_T:-170} $T --gtest_filter="${FILTER:-*Fp8AttentionVt*:Grid/*:Sm90/GpuFp8Attention.*}" > $L/gtest-nopp.log 2>&1
  echo "gate rc=$? $(grep -c '  OK ]' $L/gtest-nopp.log) ok $(grep -c 'FAILED  \]' $L/gtest-nopp.log) failed t=$(( $(date +%s) - t0 ))"
  grep "FAILED  \]" $L/gtest-nopp.log | head -8; grep "RUN" $L/gtest-nopp.log | tail -1
fi
R=$L/rows.txt
row() {  # variant kind args...
  local v=$1 k=$2; shift 2
  local np=0; [ $v = nopp ] && np=1
  FLASHATTN_EXPERIMENT_NOPP=$np timeout 40 /tmp/v/bench/flashattn-bench --backend sm90 --mode fwd --hdim 128 --nheads 16 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R
}
for r in $(seq ${ROUNDS:-2}); do
  for v in base nopp; do
    for s in 2048 4096 8192 16384; do row $v fp8head --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done
    for s in 4096 16384; do row $v fp8block --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16; done
    row $v fp8headcausal --seqlen 4096 --batch 4 --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head --causal
    row $v fp8rows --seqlen 4096 --batch 4 --dtype fp8
    for s in 1024 2048 4096 16384; do row $v bf16 --seqlen $s --batch $((16384 / s)) --dtype bf16; done
    row $v bf16causal --seqlen 4096 --batch 4 --dtype bf16 --causal
  done
done
python3 docs/experiments/ab_rows.py $R base nopp
echo "t=$(( $(date +%s) - t0 ))"

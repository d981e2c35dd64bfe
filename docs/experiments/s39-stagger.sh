#!/usr/bin/env bash
# s39: staggered warpgroup runs for the wide per-head FP8 kernel (FLASHATTN_EXPERIMENT_STAGGER=1), one library.
# Pack build-dev/$PACK: libflashattn.so*, flashattn_gpu_tests, flashattn-bench (hdim-128 build, archs 80;90a).
# (1) gate: the V^T FP8 cases with the staggered kernel, runs sized for 4 SMs (several runs per CTA, runs of many
# query blocks), then sized for the device; (2) rows: production vs staggered, alternated, $ROUNDS rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s39; mkdir -p $L /tmp/v
cat build-dev/${PACK:-s39a}/pack.part.* | tar xzf - -C /tmp/v || exit 1
export LD_LIBRARY_PATH=/tmp/v
T=/tmp/v/tests/gpu/flashattn_gpu_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "${GATE:-1}" = 1 ]; then
  FLASHATTN_EXPERIMENT_STAGGER=1 FLASHATTN_EXPERIMENT_STAGGER_SMS=4 timeout ${GATE_T:-200} $T \
    --gtest_filter="${FILTER:-*Fp8AttentionVt*}" > $L/gtest-stag-sms4.log 2>&1
  echo "gate sms4 rc=$? $(grep -c '  OK ]' $L/gtest-stag-sms4.log) ok $(grep -c 'FAILED  \]' $L/gtest-stag-sms4.log) failed t=$(( $(date +%s) - t0 ))"
  grep "FAILED  \]\|Failure\|error" $L/gtest-stag-sms4.log | head -8; grep "RUN" $L/gtest-stag-sms4.log | tail -1
fi
R=$L/rows.txt
row() {  # variant kind args...
  local v=$1 k=$2; shift 2
  local e=0 d=-1 np=0; case $v in stag) e=1;; stagd0) e=1; d=0;; stagd*) e=1; d=${v#stagd};; nopp) np=1;; esac
  FLASHATTN_EXPERIMENT_STAGGER=$e FLASHATTN_EXPERIMENT_STAGGER_D=$d FLASHATTN_EXPERIMENT_NOPP=$np timeout 40 /tmp/v/bench/flashattn-bench --backend sm90 --mode fwd --hdim 128 --nheads 16 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R
}
for r in $(seq ${ROUNDS:-2}); do
  for s in ${SEQS:-4096 16384 2048 8192}; do for v in ${VARIANTS:-base stag}; do
    row $v fp8head --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done; done
  for s in 4096 16384; do row base bf16 --seqlen $s --batch $((16384 / s)) --dtype bf16; done
done
python3 docs/experiments/ab_rows.py $R ${VARIANTS:-base stag}
echo "t=$(( $(date +%s) - t0 ))"

#!/usr/bin/env bash
# s34 call C: the next tile's setup under the last P V (kernel.h look_up, mainloop.h tile_start/finish).
# Pack build-dev/s34su: flashattn-bench, flashattn_gpu_tests (hdim-128 sm90 build), base (HEAD~ library), su (its bf16
# and FP8 bf16-out hdim-128 objects from the change). (1) a gate of sm90 tests on su; (2) rows base vs su, 2 rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s34c; mkdir -p $L /tmp/v
cat build-dev/s34su/pack.part.* | tar xzf - -C /tmp/v || exit 1
LD_LIBRARY_PATH=/tmp/v/su timeout 130 /tmp/v/flashattn_gpu_tests \
  --gtest_filter="Grid/*:Sanitize/*:Backends/GpuDeterminism*:$(printf '*Vt*/case%s:' 20 21 22 23 24 25 26)" > $L/gtest-su.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest-su.log) ok $(grep -c 'FAILED  \]' $L/gtest-su.log) failed t=$(( $(date +%s) - t0 ))"
grep "FAILED  \]" $L/gtest-su.log | head -5; grep "RUN" $L/gtest-su.log | tail -1
R=$L/rows.txt
row() {  # variant kind args...
  local v=$1 k=$2; shift 2
  LD_LIBRARY_PATH=/tmp/v/$v timeout 30 /tmp/v/flashattn-bench --backend sm90 --mode fwd --hdim 128 --nheads 16 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R
}
for r in 1 2; do
  for s in 1024 2048 4096 16384; do for v in base su; do row $v bf16 --seqlen $s --batch $((16384 / s)) --dtype bf16; done; done
  for v in base su; do row $v bf16causal --seqlen 4096 --batch 4 --dtype bf16 --causal; done
  for s in 4096 16384; do for v in base su; do
    row $v fp8head --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done; done
  for v in base su; do row $v fp8block --seqlen 4096 --batch 4 --dtype fp8 --fp8-v keys_permuted16; done
  for v in base su; do row $v fp8rows --seqlen 4096 --batch 4 --dtype fp8; done
done
python3 docs/experiments/ab_rows.py $R base su
echo "t=$(( $(date +%s) - t0 ))"

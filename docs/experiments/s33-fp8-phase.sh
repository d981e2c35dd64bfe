#!/usr/bin/env bash
# s33 calls C, D, E, I: the two consumer warpgroups' phase at a tile's start. l4 (the narrow head) and l2 measured
# 5.6-6.9% fewer cycles at 4k and 16k alike, with the same instruction count at 16k (call B), so the head's timing
# seems to set the whole tile's steady state. Rows at 4096/4224/16384/16512 keys (per-head scales, V^T), VARS
# alternated, 2 rounds; BLKVARS adds 128-token block-scale rows; TESTVARS runs V^T cases 20-28 first.
#   C (pack build-dev/s33ladder, FLASHATTN_EXPERIMENT_WG_DELAY: a clock64 spin after the head's Q K^T issue):
#     w1 warpgroup 1 +700 cycles, w2 warpgroup 1 +1500, w3 warpgroup 0 +400.
#   D: VARS="base ht l4ht d1000 d2000 d3000 l4d1500 l4 w2" BLKVARS="base ht d2000": ht = warpgroup 0 passes the
#     head's turn after its softmax (FLASHATTN_EXPERIMENT_HEAD_TURN=1), dN = warpgroup 1 +N cycles.
#   E: TESTVARS="lag l4lag" VARS="base d2000 lag l4lag l4d2000 l4d1500" BLKVARS="base d2000 lag": lag = warpgroup 1
#     waits at the head (named barrier 8) for warpgroup 0's first body step (FLASHATTN_EXPERIMENT_LAG=1).
#   I: PACK=build-dev/s33stag2 VARS="base s0 s1 s2" (base = 2be02c1): s0 no stagger, s1 the CTA's first tile only,
#     s2 2000 cycles, in the narrow head too.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/lc; mkdir -p $L /tmp/v
cat ${PACK:-build-dev/s33ladder}/pack.part.* | tar xzf - -C /tmp/v || exit 1
B=/tmp/v/flashattn-bench; R=$L/rows.txt
for v in ${TESTVARS:-}; do  # the wide kernels' V^T cases (20-28)
  LD_LIBRARY_PATH=/tmp/v/$v timeout 150 /tmp/v/flashattn_gpu_tests --gtest_filter="$(printf '*Vt*/case%s:' 20 21 22 23 24 25 26 27 28)" > $L/gtest-$v.log 2>&1
  echo "tests $v rc=$? $(grep -c '  OK ]' $L/gtest-$v.log) ok $(grep -c 'FAILED  \]' $L/gtest-$v.log) failed t=$(( $(date +%s) - t0 ))"
done
for r in 1 2; do for sb in "4096 4" "4224 4" "16384 1" "16512 1"; do set -- $sb; for v in ${VARS:-base l4 w1 w2 w3}; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 40 $B --backend sm90 --mode fwd --hdim 128 --seqlen $1 --batch $2 --nheads 16 --dtype fp8 \
    --fp8-v keys_permuted16 --fp8-scales head 2>>$L/err.log | awk -v v=$v 'NR>1{print v, "head", $0}' >> $R
done; done
  for s in 4096 16384; do for v in ${BLKVARS:-}; do  # 128-token block scales (the group kernel)
    LD_LIBRARY_PATH=/tmp/v/$v timeout 40 $B --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch $((65536 / s)) --nheads 16 \
      --dtype fp8 --fp8-v keys_permuted16 2>>$L/err.log | awk -v v=$v 'NR>1{print v, "blk", $0}' >> $R
  done; done
  echo "round $r t=$(( $(date +%s) - t0 ))"; done
python3 docs/experiments/ab_rows.py $R ${VARS:-base l4 w1 w2 w3}
cd $OUT && tar czf lc.tgz lc; rm -rf lc

#!/usr/bin/env bash
# s34 call B: cross-tile overlap for the wide per-head FP8 kernel (docs/experiments/fp8-cross-tile.diff).
# Pack build-dev/s34xt: flashattn-bench; flashattn_gpu_tests with the two new V^T cases (29, 30); libraries base
# (HEAD's hdim-128 sm90 build), xt (its FP8 bf16-out object from the diff), trace and xtt (the same two with
# docs/experiments/sm90-tile-trace.diff's clock64 stamps).
# (1) the V^T and FP8 API tests on xt; (2) per-head rows base vs xt at 4096/4224/16384/16512, 2 rounds;
# (3) tile-phase traces of base and xt at 4096 and 16384.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s34b; mkdir -p $L /tmp/v
cat build-dev/s34xt/pack.part.* | tar xzf - -C /tmp/v || exit 1
LD_LIBRARY_PATH=/tmp/v/xt timeout ${TEST_S:-260} /tmp/v/flashattn_gpu_tests \
  --gtest_filter="${TESTS:-*Fp8AttentionVt*:*Fp8AttentionApi*}" > $L/gtest-xt.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest-xt.log) ok $(grep -c 'FAILED  \]' $L/gtest-xt.log) failed t=$(( $(date +%s) - t0 ))"
grep "FAILED  \]\|Failure" $L/gtest-xt.log | head -5
R=$L/rows.txt
for r in 1 2; do for s in 4096 4224 16384 16512; do for v in base xt; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 30 /tmp/v/flashattn-bench --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch 4 \
    --nheads 16 --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head 2>>$L/err.log | awk -v v=$v 'NR>1{print v, "head", $0}' >> $R
done; done; done
python3 docs/experiments/ab_rows.py $R base xt
for v in trace xtt; do for s in 4096 16384; do
  echo "== $v fp8 seqlen $s" >> $L/trace.txt
  LD_LIBRARY_PATH=/tmp/v/$v timeout 60 /tmp/v/flashattn-bench --backend sm90 --mode fwd --hdim 128 --seqlen $s \
    --batch $((16384 / s)) --nheads 16 --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head --iters 30 >> $L/trace.txt 2>&1
done; done
grep "==\|TRACE launch 22\|TRACE-HOST" $L/trace.txt | head -40
echo "t=$(( $(date +%s) - t0 ))"

#!/usr/bin/env bash
# s33 call K: fp8-narrow-head-128.diff on the device (pack build-dev/s33n128: base = e16ba7b's hdim-128 sm90-only
# build, n128 = its FP8 bf16-out object from the diff; the test binary has the diff's two new cases 26, 27): V^T
# cases 20 and 24-27 on n128, then per-head rows at 4096/4160/4224 keys, base and n128 alternated, 2 rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/lk; mkdir -p $L /tmp/v
cat build-dev/s33n128/pack.part.* | tar xzf - -C /tmp/v || exit 1
LD_LIBRARY_PATH=/tmp/v/n128 timeout 60 /tmp/v/flashattn_gpu_tests --gtest_filter="$(printf '*Vt*/case%s:' 20 24 25 26 27)" > $L/gtest.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest.log) ok $(grep -c 'FAILED  \]' $L/gtest.log) failed t=$(( $(date +%s) - t0 ))"
R=$L/rows.txt
for r in 1 2; do for s in 4096 4160 4224; do for v in base n128; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 30 /tmp/v/flashattn-bench --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch 4 --nheads 16 \
    --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head 2>>$L/err.log | awk -v v=$v 'NR>1{print v, "head", $0}' >> $R
done; done; done
python3 docs/experiments/ab_rows.py $R base n128
cd $OUT && tar czf lk.tgz lk; rm -rf lk

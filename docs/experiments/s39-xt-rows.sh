#!/usr/bin/env bash
# s39 call 7 (a last, short call; no correctness gate): the wide per-head FP8 kernel with cross-tile overlap and no
# turns (fp8-cross-tile-noturns.diff; pack build-dev/s39xt: the hdim-128 library) against 4e60312's full build
# (build-dev/s39full), alternated rows, best of 2. Indicative only: the diff's GPU tests have not run.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p /tmp/x && cat build-dev/s39full/pack.part.* | tar xzf - || exit 1
cat build-dev/s39xt/pack.part.* | tar xzf - -C /tmp/x || exit 1
R=$OUT/xt-rows.txt
for r in 1 2; do for s in 4096 16384; do for v in base xt; do
  lp=$PWD/build-gpu; [ $v = xt ] && lp=/tmp/x
  LD_LIBRARY_PATH=$lp timeout 20 build-gpu/bench/flashattn-bench --backend sm90 --mode fwd --hdim 128 --nheads 16 --seqlen $s \
    --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head 2>&1 | awk -v v=$v 'NR>1{print v, "fp8head", $0}' >> $R
done; done; done
python3 docs/experiments/ab_rows.py $R base xt

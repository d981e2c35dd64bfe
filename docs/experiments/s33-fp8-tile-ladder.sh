#!/usr/bin/env bash
# Prepared in s32 for the next session (one device call, no build): where the FP8 wide per-head kernel's ~4.6 us per
# tile go (perf-notes, thirty-second session). Pack build-dev/s33ladder (git-ignored): an sm90-only hdim-128 local build
# of ae46c30 (bench, GPU tests) with five libraries differing only in fwd_hdim128_fp8_bf16.cu.o, from
# docs/experiments/fp8-tile-ladder.diff (FLASHATTN_EXPERIMENT_TILE_LADDER=N):
#   base: HEAD;  l1 (=1): O not stored (timing only);  l2 (=2): no scale reads or division at the tile's start, every
#   scale 1 (timing only);  l3 (=3): the first block with the lean softmax (fp8-lean-head.diff; correct);  l4 (=4): a
#   first block with <= 64 keys of the sequence as an m64n64 Q K^T and the lean softmax, P's other keys zero (the
#   padded block's Q K^T and softmax gone; correct).
# Steps: the FP8 tests on l3 and l4; per-head rows 4k/16k for every variant (2 alternated
# rounds, bf16 once); base at key counts without a padded block (4224 = 22 x 192, 16512 = 86 x 192) beside
# 4096 / 16384; an ncu source profile of base's 4k row (samples outside the key-block loop).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/ld; mkdir -p $L
# s33: run in two calls (STEP=a: tests and rows; STEP=b: pad rows and ncu), l5 added: 3 K/V stages for the FP8 V^T
# kernels (FLASHATTN_EXPERIMENT_FP8_STAGES=3 in tile_shapes.h, the same worktree; 208 KB of smem at hdim 128 wide).
if [ "${STEP:-a}" = a ]; then
PACK=build-dev/s33ladder VARS="base l1 l2 l3 l4 l5" TESTVARS="l3 l4 l5" OUT=$OUT bash docs/experiments/s30-fp8ab.sh
cd $OUT && tar czf ab.tgz ab && rm -rf ab; exit 0
fi
mkdir -p /tmp/v && cat build-dev/s33ladder/pack.part.* | tar xzf - -C /tmp/v || exit 1
B=/tmp/v/flashattn-bench; export LD_LIBRARY_PATH=/tmp/v/base
for r in 1 2; do for sb in "4096 4" "4224 4" "16384 1" "16512 1"; do set -- $sb
  timeout 40 $B --backend sm90 --mode fwd --hdim 128 --seqlen $1 --batch $2 --nheads 16 --dtype fp8 --fp8-v keys_permuted16 \
    --fp8-scales head 2>&1 | tail -1 | sed "s/^/pad r$r /"
done; done | tee $L/pad-rows.txt
timeout 200 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  --import-source no -k regex:fwd_kernel --launch-skip 3 --launch-count 1 -o $L/fp8wide4k -f \
  $B --backend sm90 --mode fwd --hdim 128 --seqlen 4096 --batch 4 --nheads 16 --dtype fp8 --fp8-v keys_permuted16 \
  --fp8-scales head --iters 5 > $L/ncu.log 2>&1; echo "ncu rc=$? t=$(( $(date +%s) - t0 ))"
timeout 90 ncu -i $L/fp8wide4k.ncu-rep --page source --csv --print-source sass > $L/sass4k.csv 2> $L/export.err && gzip $L/sass4k.csv
cd $OUT && tar czf ld.tgz ld ab 2>/dev/null; rm -rf ld ab

#!/usr/bin/env bash
# s33 call H: does the tile-start stagger (2be02c1: warpgroup 1 starts a tile 1500 cycles behind, FP8 wide per-head
# kernel only) help the other kernels? Pack build-dev/s33stag (hdim-128 sm90-only build of 2be02c1 = base; variants
# differ in one object, FLASHATTN_EXPERIMENT_STAGGER_OTHERS=N cycles in head() for every non-lean kernel):
# g1500 (FP8 object: the group kernel for 128-token block scales, and the 128-key FP8 kernels), b1500 / b3000 (bf16
# object: the bf16 forward). Rows: bf16 4k/16k, FP8 block scales 4k/16k; 2 rounds alternated.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/ls; mkdir -p $L /tmp/v
cat build-dev/s33stag/pack.part.* | tar xzf - -C /tmp/v || exit 1
B=/tmp/v/flashattn-bench; R=$L/rows.txt
run() { local v=$1 k=$2; shift 2
  LD_LIBRARY_PATH=/tmp/v/$v timeout 40 $B --backend sm90 --mode fwd --hdim 128 "$@" 2>>$L/err.log | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R; }
for r in 1 2; do
  for s in 4096 16384; do for v in base b1500 b3000; do run $v bf16 --seqlen $s; done; done
  for s in 4096 16384; do for v in base g1500; do run $v blk --seqlen $s --dtype fp8 --fp8-v keys_permuted16; done; done
  for s in 4096 16384; do for v in base b1500; do run $v c-bf16 --seqlen $s --causal; done; done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 docs/experiments/ab_rows.py $R base b1500 b3000 g1500
cd $OUT && tar czf ls.tgz ls; rm -rf ls

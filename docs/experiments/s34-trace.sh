#!/usr/bin/env bash
# s34 call A: (1) the consumer warpgroups' tile phases in clock64 cycles (docs/experiments/sm90-tile-trace.diff,
# pack build-dev/s34trace: flashattn-bench + the traced library, FP8 and bf16 hdim-128 objects), FP8 per-head V^T
# and bf16 at 4096 / 16384 keys; (2) s33-narrow128.sh (the 128-key narrow head's tests and A/B).
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s34a; mkdir -p $L /tmp/t
cat build-dev/s34trace/pack.part.* | tar xzf - -C /tmp/t || exit 1
for s in 4096 16384; do
  for d in fp8 bf16; do
    extra=""; [ $d = fp8 ] && extra="--fp8-v keys_permuted16 --fp8-scales head"
    echo "== $d seqlen $s" >> $L/trace.txt
    LD_LIBRARY_PATH=/tmp/t/trace timeout 60 /tmp/t/flashattn-bench --backend sm90 --mode fwd --hdim 128 --seqlen $s \
      --batch $((16384 / s)) --nheads 16 --dtype $d $extra --iters 30 >> $L/trace.txt 2>&1
  done
done
grep -v "TRACE raw" $L/trace.txt | tail -40
bash docs/experiments/s33-narrow128.sh

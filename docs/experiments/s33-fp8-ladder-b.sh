#!/usr/bin/env bash
# s33 call B (pack build-dev/s33ladder, see s33-fp8-tile-ladder.sh): is l4's (and l2's) +6-8% on both the 4k and the
# 16k rows a per-key gain (it cannot be the head block's alone) or the clock? 1) the two new V^T cases (4096 keys =
# 21 x 192 + 64: the narrow head's shape; 2305 = 12 x 192 + 1) on base and l4; 2) ncu, clocks not locked: elapsed
# cycles and SM frequency of base, l2, l4 at 4k and 16k; 3) the pad rows (base at 4096/4224, 16384/16512).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/lb; mkdir -p $L /tmp/v
cat build-dev/s33ladder/pack.part.* | tar xzf - -C /tmp/v || exit 1
T=/tmp/v/flashattn_gpu_tests; B=/tmp/v/flashattn-bench
for v in base l4; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 60 $T --gtest_filter='*Vt*/case24:*Vt*/case25' > $L/gtest-new-$v.log 2>&1
  echo "new cases $v rc=$? $(grep -c '  OK ]' $L/gtest-new-$v.log) ok t=$(( $(date +%s) - t0 ))"
done
row() { echo --backend sm90 --mode fwd --hdim 128 --seqlen $1 --batch $2 --nheads 16 --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; }
for r in 1 2; do for sb in "4096 4" "16384 1"; do set -- $sb; for v in base l2 l4; do
  LD_LIBRARY_PATH=/tmp/v/$v timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__cycles_elapsed.avg.per_second,sm__inst_executed.sum \
    -k regex:fwd_kernel --launch-skip 5 --launch-count 1 --csv $B $(row $1 $2) --iters 10 > $L/ncu-$v-$1-r$r.csv 2>$L/ncu-$v-$1-r$r.err
  echo "ncu $v $1 r$r rc=$? t=$(( $(date +%s) - t0 ))"
  grep -E "gpu__time|cycles_elapsed|per_second|inst_executed|gmma" $L/ncu-$v-$1-r$r.csv | awk -F'","' '{print "  " $(NF-2), $NF}' | tr -d '"'
done; done; done
export LD_LIBRARY_PATH=/tmp/v/base
for r in 1 2; do for sb in "4096 4" "4224 4" "16384 1" "16512 1"; do set -- $sb
  timeout 40 $B $(row $1 $2) 2>&1 | tail -1 | sed "s/^/pad r$r /"
done; done | tee $L/pad-rows.txt
cd $OUT && tar czf lb.tgz lb; rm -rf lb

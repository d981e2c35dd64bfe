#!/usr/bin/env bash
# s33 verification, call B (no build; the pack of call A, build-dev/s33full): the GPU tests call A's time limit left
# (V^T cases 22-28) and the KV-cache cases; memcheck and racecheck on the V^T cases (both wide kernels) and the small
# cases; flashattn-bench FP8 and bf16 rows, then the per-head rows at 4096/4224/16384/16512 keys against the
# hdim-128 pack of 88dffd9 (build-dev/s33ladder base): the narrow head and the stagger (s33); (hdim 128 and 256, 16k tokens, 2 rounds), each row also as JSON.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
cat build-dev/s33full/pack.part.* | tar xzf - || exit 1
export LD_LIBRARY_PATH=$PWD/build-gpu
T=build-gpu/tests/gpu/flashattn_gpu_tests
REST=$(printf 'Sm90/GpuFp8AttentionVt.*/case%s:' ${RESTCASES:-22 23 24 25 26 27 28})
timeout 150 $T --gtest_filter="${REST}Backends/GpuKvCache*" > $L/gtest-rest.log 2>&1; echo "rest rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-rest.log | head -6; echo "ok: $(grep -c '^\[       OK \]' $L/gtest-rest.log)"
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='*GpuFp8AttentionVt*:Sanitize/GpuSmall*' > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY" $L/$tool.log | head -4
done
B=build-gpu/bench/flashattn-bench
for r in 1 2; do
  for cfg in "128 4096" "128 16384" "256 16384"; do set -- $cfg; d=$1; s=$2; a="--backend sm90 --mode fwd --hdim $d --seqlen $s --batch $((16384 / s)) --nheads $((2048 / d))"
    for x in "bf16:--dtype bf16" "fp8-head:--dtype fp8 --fp8-v keys_permuted16 --fp8-scales head" "fp8-block128:--dtype fp8 --fp8-v keys_permuted16"; do
      n=${x%%:*}; timeout 30 $B $a ${x#*:} --json $L/bench-$n-d$d-s$s-r$r.json 2>&1 | tail -1 | sed "s/^/$n /"
    done
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done | tee $L/bench-rows.txt
mkdir -p /tmp/v && cat build-dev/s33ladder/pack.part.* | tar xzf - -C /tmp/v
for r in 1 2; do for sb in "4096 4" "4224 4" "16384 1" "16512 1"; do set -- $sb
  for v in base new; do
    if [ $v = base ]; then b=/tmp/v/flashattn-bench; lp=/tmp/v/base; else b=$B; lp=$PWD/build-gpu; fi
    LD_LIBRARY_PATH=$lp timeout 30 $b --backend sm90 --mode fwd --hdim 128 --seqlen $1 --batch $2 --nheads 16 --dtype fp8 \
      --fp8-v keys_permuted16 --fp8-scales head 2>&1 | tail -1 | sed "s/^/$v head /"
  done
done; done | tee $L/ab-rows.txt
python3 docs/experiments/ab_rows.py $L/ab-rows.txt base new
cd $OUT && tar czf logs.tgz l && rm -rf l

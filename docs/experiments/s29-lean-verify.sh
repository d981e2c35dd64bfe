#!/usr/bin/env bash
# One device call, no build: the lean softmax for the wide FP8 kernel (hdim 128, 192-key blocks, one K/V scale per
# head). build-dev/biny/pack.part.* = a local full build of this tree (git-ignored); build-dev/binx/pack.part.* =
# the same of the parent commit (base). A/B rows (FP8 per-head scales at 2k-16k; controls: FP8 block scales,
# FP8 causal, bf16), the whole GPU suite, memcheck + racecheck on the FP8 cases. Carry build-dev/binx, build-dev/biny, build-dev/lib224.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/lv; mkdir -p $L /tmp/basepk
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
cat build-dev/biny/pack.part.* | tar xzf - || exit 1
cat build-dev/binx/pack.part.* | tar xzf - -C /tmp/basepk || exit 1
# w224: the new library with FP8 hdim 128 bf16-out's wide block at 224 keys (FA3's tile; local probe, build-dev/lib224)
mkdir -p /tmp/lib224 && { cat build-dev/lib224/lib224.part.* | tar xzf - -C /tmp/lib224 || exit 1; }
T=$PWD/build-gpu/tests/gpu/flashattn_gpu_tests
R=$L/rows.txt
run() { local v=$1 k=$2 lib=$PWD/build-gpu; shift 2
  local exe=$PWD/build-gpu/bench/flashattn-bench
  [ $v = base ] && { lib=/tmp/basepk/build-gpu; exe=$lib/bench/flashattn-bench; }
  [ $v = w224 ] && lib=/tmp/lib224
  LD_LIBRARY_PATH=$lib timeout 40 $exe --backend sm90 --mode fwd --hdim 128 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R; }
for r in 1 2; do
  for v in base new w224; do
    for s in 2048 4096 8192 16384; do run $v fp8head --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done
    run $v fp8head --seqlen 4096 --causal --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head
    run $v fp8block --seqlen 16384 --batch 1 --dtype fp8 --fp8-v keys_permuted16
    run $v bf16 --seqlen 4096 --batch 4
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 docs/experiments/ab_rows.py $R base new w224
export LD_LIBRARY_PATH=$PWD/build-gpu
timeout 330 $T > $L/gtest-gpu.log 2>&1; echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-gpu.log | head; grep -E "^\[ RUN" $L/gtest-gpu.log | tail -1
for tool in memcheck racecheck; do
  left=$(( 570 - ($(date +%s) - t0) )); [ $left -gt 90 ] && left=90; [ $left -lt 20 ] && break
  timeout $left compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='*Fp8Attention*' > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |SUMMARY" $L/$tool.log; grep -E "^\[ RUN" $L/$tool.log | tail -1
done

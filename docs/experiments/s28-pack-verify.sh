#!/usr/bin/env bash
# One device call, no build, for docs/experiments/fp8-wide192.diff + sm90-epilogue-elected-leader.diff +
# sm90-bwd-uniform-leaders.diff together:
# build-dev/binx/pack.part.* (git-ignored) is a full build (every head dim; sm80 path as sm_90 SASS + sm90a, as
# scripts/gpu-check builds on an H100/H200) of fbb2a93 + the three diffs, made on the s28 VM with the same nvcc (13.0.88)
# the device uses. build-dev/basebench (git-ignored) is the base bench (sm90-only, hdim 128) of 37060bc, whose src/
# equals fbb2a93's. Steps: A/B rows (bf16 hdim-128 forward and backward, FP8) base vs new, the whole GPU suite, racecheck on the
# kernels the two diffs touch. Carry build-dev/binx, build-dev/basebench and this script (no .deps).
# PACK=build-dev/binw: the device's own full-build pack of 37060bc + fp8-wide192.diff alone (carry it instead).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=/tmp/pv; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
cat ${PACK:-build-dev/binx}/pack.part.* | tar xzf - || exit 1
export LD_LIBRARY_PATH=$PWD/build-gpu  # the pack's RUNPATH names the build machine's directory
T=build-gpu/tests/gpu/flashattn_gpu_tests
R=$L/rows.txt
run() { local v=$1 k=$2 lib=$PWD/build-gpu exe=build-gpu/bench/flashattn-bench; shift 2
  [ $v = base ] && { lib=$PWD/build-dev/basebench; exe=build-dev/basebench/flashattn-bench; }
  LD_LIBRARY_PATH=$lib timeout 40 $exe --backend sm90 --mode fwd --hdim 128 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R; }
for r in 1 2; do
  for v in base new; do
    for s in 1024 4096 16384; do run $v bf16 --seqlen $s --causal; done
    run $v bf16 --seqlen 2048
    for s in 4096 16384; do run $v fp8head --seqlen $s --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done
    run $v fp8head --seqlen 4096 --causal --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head
    run $v fp8block --seqlen 16384 --dtype fp8 --fp8-v keys_permuted16
    [ -n "${BWD:-1}" ] && { run $v bwd --seqlen 4096 --mode bwd; run $v bwd --seqlen 4096 --causal --mode bwd; }
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 docs/experiments/ab_rows.py $R base new
timeout 360 $T > $L/gtest-gpu.log 2>&1; echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -c "^\[       OK \]" $L/gtest-gpu.log; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $L/gtest-gpu.log | head
grep -E "^\[ RUN      \]" $L/gtest-gpu.log | tail -1
WIDE=$($T --gtest_list_tests --gtest_filter='*GpuFp8AttentionVt*' | awk '/kblock4096/{printf "*GpuFp8AttentionVt*/%s:", $1}')
RACE="Grid/GpuAttention.MatchesOracle/sm90_hdim128_fp16_causal:Grid/GpuAttention.MatchesOracle/sm90_hdim128_bf16:${WIDE}"
left=$(( 575 - ($(date +%s) - t0) )); [ $left -gt 150 ] && left=150
[ $left -gt 30 ] && { timeout $left compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter="$RACE" \
  > $L/racecheck.log 2>&1; echo "racecheck rc=$?"; tail -2 $L/racecheck.log; }
tar czf $OUT/pack-verify.tgz -C /tmp pv

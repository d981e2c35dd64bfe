#!/usr/bin/env bash
# Device call after landing the three s28 diffs (forward/backward warp-uniform leaders, FP8 192-key block):
# the pack in build-dev/binx (= this tree's src/) under memcheck and racecheck, gpu-check's default filter
# (small cases incl. the backward, combine, sm90 dropout/ALiBi fwd+bwd, every FP8 forward case incl. the
# 192-key ones, the KV-cache small/long-decode cases), plus the sm90 smoke cases over every head dim.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/san; mkdir -p $L
[ -x build-gpu/tests/gpu/flashattn_gpu_tests ] || { cat build-dev/binx/pack.part.* | tar xzf - || exit 1; }
export LD_LIBRARY_PATH=$PWD/build-gpu
T=build-gpu/tests/gpu/flashattn_gpu_tests
F='*Small*:*Combine*:ScoreMods/*sm90_*:*Fp8Attention*:*Fp8VPermute*:*KvCache*SmallCases*:*KvCache*LongDecode*'
for tool in memcheck racecheck; do
  timeout ${SAN_S:-200} compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter="$F" > $L/$tool.log 2>&1
  echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |SUMMARY" $L/$tool.log
  grep -E "^\[ RUN" $L/$tool.log | tail -1
done
for tool in memcheck racecheck; do
  timeout ${SMOKE_S:-60} compute-sanitizer --tool $tool --kernel-name-exclude kns=reference_kernel --error-exitcode 9 \
    build-gpu/tests/gpu_sm90_smoke/sm90_smoke --no-perf > $L/$tool-sm90.log 2>&1
  echo "$tool sm90 smoke rc=$? t=$(( $(date +%s) - t0 ))"; tail -2 $L/$tool-sm90.log
done

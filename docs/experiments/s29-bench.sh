#!/usr/bin/env bash
# Device call: the side-by-side benchmark after landing the three s28 diffs, on the pack in build-dev/binx
# (= this tree's src/): bench_vs_peers (ours vs cuDNN and FA2, fwd and fwdbwd, hdim 64/128/256, 1k/4k/16k),
# then flashattn-bench's FP8 rows beside bf16 (issue 16's floor: FP8 >= 1.4x our bf16 at hdim 128/256, >= 4k).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); mkdir -p $OUT
[ -x build-gpu/tests/gpu/flashattn_gpu_tests ] || { cat build-dev/binx/pack.part.* | tar xzf - || exit 1; }
export LD_LIBRARY_PATH=$PWD/build-gpu FLASHATTN_LIBRARY=$PWD/build-gpu/libflashattn.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee $OUT/gpu.txt
B=build-gpu/bench/flashattn-bench
for d in 128 256; do for s in 4096 16384; do
  for args in "--dtype bf16" "--dtype fp8 --fp8-v keys_permuted16" "--dtype fp8 --fp8-v keys_permuted16 --fp8-scales head"; do
    timeout 30 $B --backend sm90 --mode fwd --hdim $d --seqlen $s --batch $((16384 / s)) --nheads $((2048 / d)) $args 2>&1 | tail -1
  done
done; done | tee $OUT/fp8-bench.log
echo "fp8 rows t=$(( $(date +%s) - t0 ))"
timeout ${PEERS_S:-420} python3 bench/bench_vs_peers.py --out-dir $OUT --hdims 64,128,256 --seqlens 1024,4096,16384 \
  --modes fwd,fwdbwd --impls flashattn-sm90,cudnn,fa2 --rounds 2 --budget-s ${BUDGET_S:-360} > $OUT/bench.log 2>&1
echo "peers rc=$? t=$(( $(date +%s) - t0 ))"; tail -45 $OUT/bench.log

#!/usr/bin/env bash
# s31: issue 16's hdim-128 rows on an H100, base (biny: HEAD's kernels before 087a6b7) vs new (s31full), 2 rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
mkdir -p /tmp/base /tmp/new && cat build-dev/biny/pack.part.* | tar xzf - -C /tmp/base && cat build-dev/s31full/pack.part.* | tar xzf - -C /tmp/new
run() { local v=$1; shift; LD_LIBRARY_PATH=/tmp/$v/build-gpu timeout 30 /tmp/$v/build-gpu/bench/flashattn-bench "$@" 2>&1 | tail -1 | sed "s/^/$v /"; }
for r in 1 2; do
  for s in 4096 16384; do b=$((16384 / s))
    for v in base new; do
      run $v --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch $b --nheads 16 --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head
      run $v --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch $b --nheads 16 --dtype fp8 --fp8-v keys_permuted16
    done
    run base --backend sm90 --mode fwd --hdim 128 --seqlen $s --batch $b --nheads 16 --dtype bf16
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done

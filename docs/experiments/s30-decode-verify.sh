#!/usr/bin/env bash
# One device call, no build, for docs/experiments/decode-setup-fastdiv.diff (KV decode setup without runtime
# divisions; Q's gather after the first block's K/V copies). Packs (git-ignored, local full builds, every head dim):
# build-dev/biny = main at de5667e (base), build-dev/binz = d9951b8 + the diff (new). Steps: the KV-cache, combine
# and split GPU tests on new, memcheck/racecheck on the KV small and long-decode cases, then the issue's decode rows
# (batch 1 and 8, caches 4k/16k/64k, sq 1 and 4, GQA 32/8 and 64/8 and MHA 32/32, contiguous and paged) for base and
# new in two alternated rounds. Carry build-dev/biny and build-dev/binz. ~8 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/dv; mkdir -p $L /tmp/pk-base /tmp/pk-new
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
cat build-dev/biny/pack.part.* | tar xzf - -C /tmp/pk-base || exit 1
cat build-dev/binz/pack.part.* | tar xzf - -C /tmp/pk-new || exit 1
T=/tmp/pk-new/build-gpu/tests/gpu/flashattn_gpu_tests
export LD_LIBRARY_PATH=/tmp/pk-new/build-gpu
timeout 150 $T --gtest_filter='*KvCache*:*Combine*:*Split*' > $L/gtest-kv.log 2>&1; echo "kv tests rc=$? t=$(( $(date +%s) - t0 ))"
grep -E '^\[  (PASSED|FAILED) |FAILED  \]' $L/gtest-kv.log | head -5
for tool in memcheck racecheck; do
  timeout 75 compute-sanitizer --tool $tool --error-exitcode 9 $T --gtest_filter='*KvCache*SmallCases*:*KvCache*LongDecode*' \
    > $L/$tool.log 2>&1; echo "$tool rc=$? t=$(( $(date +%s) - t0 ))"; grep -E "^\[  (PASSED|FAILED) |SUMMARY" $L/$tool.log
done
unset LD_LIBRARY_PATH
export PYTHONPATH=$PWD/python
for r in 1 2; do
  for v in base new; do
    FLASHATTN_LIBRARY=/tmp/pk-$v/build-gpu/libflashattn.so timeout 100 python3 bench/bench_decode.py --seqlens-q 1,4 \
      --caches 4096,16384,65536 --batches 1,8 --impls flashattn,flashattn-paged --out $L/decode-$v-r$r.json \
      > $L/decode-$v-r$r.log 2>&1; echo "decode $v r$r rc=$? t=$(( $(date +%s) - t0 ))"
  done
done
python3 - $L <<'PY'
import json, sys, glob, collections
L = sys.argv[1]; best = collections.defaultdict(dict)
for f in glob.glob(f"{L}/decode-*-r*.json"):
    v = f.split("decode-")[1].split("-r")[0]
    for r in json.load(open(f))["rows"]:
        k = (r["impl"], r["seqlen_q"], r["batch"], r["cache"], f'{r["nheads_q"]}/{r["nheads_kv"]}')
        best[k][v] = max(best[k].get(v, 0), r["pct_of_copy"] or 0)
for k in sorted(best):
    b, n = best[k].get("base"), best[k].get("new")
    print(*k, f"base {b:.1f}" if b else "", f"new {n:.1f}" if n else "", f"{n - b:+.1f}" if b and n else "")
PY

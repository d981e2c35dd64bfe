#!/usr/bin/env bash
# One device call, no build: the full-build pack of 37060bc + docs/experiments/fp8-wide192.diff (build-dev/binw, made by
# s28's device call 6) -> A/B of the FP8 hdim-128 rows against the base bench (build-dev/basebench, 37060bc, sm90-only
# hdim 128), then the whole GPU suite, then racecheck on the wide V^T cases. Carry: build-dev/binw, build-dev/basebench,
# this script (not .deps: nothing is built). Logs come back as $OUT/wide-land.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=/tmp/wl; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
cat build-dev/binw/pack.part.* | tar xzf - || exit 1
T=build-gpu/tests/gpu/flashattn_gpu_tests
R=$L/rows.txt
run() { local v=$1 k=$2 lib=$PWD/build-gpu exe=build-gpu/bench/flashattn-bench; shift 2
  [ $v = base ] && { lib=$PWD/build-dev/basebench; exe=build-dev/basebench/flashattn-bench; }
  LD_LIBRARY_PATH=$lib timeout 40 $exe --backend sm90 --mode fwd --hdim 128 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R; }
for r in 1 2; do
  for s in 2048 4096 16384; do for v in base wide; do run $v head --seqlen $s --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done; done
  for v in base wide; do run $v head --seqlen 4096 --causal --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head
    run $v block --seqlen 16384 --dtype fp8 --fp8-v keys_permuted16; done
  [ $r = 1 ] && for s in 2048 4096 16384; do run wide bf16 --seqlen $s; done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 - $R <<'PY'
import sys, collections
res = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    try: res[(f[1], int(f[6]), f[9], f[0])].append(float(f[11]))
    except (ValueError, IndexError): pass
for k in sorted({x[:3] for x in res}):
    b, w = res[k + ("base",)], res[k + ("wide",)]
    print(k, "base", b, "wide", w, f"ratio {max(w)/max(b):.3f}" if b and w else "")
PY
timeout 400 $T > $L/gtest-gpu.log 2>&1; echo "suite rc=$? t=$(( $(date +%s) - t0 ))"
grep -c "^\[       OK \]" $L/gtest-gpu.log; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|SKIPPED \]" $L/gtest-gpu.log | head
grep -E "^\[ RUN      \]" $L/gtest-gpu.log | tail -1
WIDE=$($T --gtest_list_tests --gtest_filter='*GpuFp8AttentionVt*' | awk '/kblock4096/{printf "*GpuFp8AttentionVt*/%s:", $1}')
left=$(( 570 - ($(date +%s) - t0) )); [ $left -gt 150 ] && left=150
[ $left -gt 30 ] && { timeout $left compute-sanitizer --tool racecheck --error-exitcode 9 $T --gtest_filter="$WIDE" > $L/racecheck-fp8wide.log 2>&1
  echo "racecheck rc=$?"; tail -2 $L/racecheck-fp8wide.log; }
tar czf $OUT/wide-land.tgz -C /tmp wl

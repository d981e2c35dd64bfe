#!/usr/bin/env bash
# s36: ptxas --register-usage-level=10 (FLASHATTN_PTXAS_REGISTER_USAGE_LEVEL) against nvcc's default (5), one call.
# (The CMake option was removed after this A/B: level 10 measured neutral. To repeat it, add
# `-Xptxas=--register-usage-level=N` to flashattn_cuda_deps' CUDA compile options.)
# Pack build-dev/s36ru (pack.part.*): flashattn-bench and flashattn_gpu_tests (hdim-128 build, sm80 + sm90 paths,
# sm80 SASS for sm_90 only), base/ and ru10/ libraries (same sources; ru10 every CUDA object at level 10).
# (1) a gate of GPU tests on ru10; (2) flashattn-bench rows base vs ru10, 2 alternated rounds; (3) decode rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s36; mkdir -p $L /tmp/v
cat build-dev/s36ru/pack.part.* | tar xzf - -C /tmp/v || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
LD_LIBRARY_PATH=/tmp/v/ru10 timeout ${GATE_S:-110} /tmp/v/flashattn_gpu_tests \
  --gtest_filter="Grid/*:Sanitize/*:Backends/GpuDeterminism*:*KvCache*SmallCases*:*GpuCombine*:$(printf '*Vt*/case%s:' 20 21 22 23 24 26 29)*Fp8VRowsAuto*" > $L/gtest-ru10.log 2>&1
echo "tests rc=$? $(grep -c '  OK ]' $L/gtest-ru10.log) ok $(grep -c 'FAILED  \]' $L/gtest-ru10.log) failed t=$(( $(date +%s) - t0 ))"
grep "FAILED  \]" $L/gtest-ru10.log | head -5; grep "RUN" $L/gtest-ru10.log | tail -1
R=$L/rows.txt
row() {  # variant kind args...
  local v=$1 k=$2; shift 2
  LD_LIBRARY_PATH=/tmp/v/$v timeout 30 /tmp/v/flashattn-bench --hdim 128 --nheads 16 "$@" 2>>$L/err.log \
    | awk -v v=$v -v k=$k 'NR>1{print v, k, $0}' >> $R
}
for r in 1 2; do
  for s in 1024 4096 16384; do for v in base ru10; do row $v bf16 --backend sm90 --mode fwd --seqlen $s --batch $((16384 / s)) --dtype bf16; done; done
  for v in base ru10; do row $v bf16causal --backend sm90 --mode fwd --seqlen 4096 --batch 4 --dtype bf16 --causal; done
  for s in 4096 16384; do for v in base ru10; do row $v bwd --backend sm90 --mode bwd --seqlen $s --batch $((16384 / s)) --dtype bf16; done; done
  for v in base ru10; do row $v bwdcausal --backend sm90 --mode bwd --seqlen 4096 --batch 4 --dtype bf16 --causal; done
  for v in base ru10; do row $v sm80fwd --backend sm80 --mode fwd --seqlen 4096 --batch 4 --dtype bf16; done
  for s in 4096 16384; do for v in base ru10; do
    row $v fp8head --backend sm90 --mode fwd --seqlen $s --batch $((16384 / s)) --dtype fp8 --fp8-v keys_permuted16 --fp8-scales head; done; done
  for v in base ru10; do row $v fp8block --backend sm90 --mode fwd --seqlen 4096 --batch 4 --dtype fp8 --fp8-v keys_permuted16; done
  for v in base ru10; do row $v fp8rows --backend sm90 --mode fwd --seqlen 4096 --batch 4 --dtype fp8; done
done
python3 docs/experiments/ab_rows.py $R base ru10 | tee $L/ab.txt
echo "rows t=$(( $(date +%s) - t0 ))"
for r in 1 2; do for v in base ru10; do
  FLASHATTN_LIBRARY=/tmp/v/$v/libflashattn.so PYTHONPATH=$PWD/python timeout 120 python3 bench/bench_decode.py \
    --seqlens-q 1,4 --caches 16384 --batches 1,8 --heads 32/8,64/8 --impls flashattn --out $L/decode-$v-r$r.json > $L/decode-$v-r$r.log 2>&1
  echo "decode $v r$r rc=$? t=$(( $(date +%s) - t0 ))"
done; done
python3 - $L <<'PY'
import json, sys, glob, collections
L = sys.argv[1]; res = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{L}/decode-*-r*.json")):
    v = f.split("decode-")[1].rsplit("-r", 1)[0]
    for r in json.load(open(f)).get("rows", []):
        key = (r["impl"], r["layout"], f"sq{r['seqlen_q']}", f"b{r['batch']}", f"{r['cache']}", f"h{r['nheads_q']}/{r['nheads_kv']}")
        res[key].setdefault(v, []).append(round(r["pct_of_copy"], 1))
for k, d in sorted(res.items()):
    print(*k, *(f"{v} {d[v]}" for v in sorted(d)))
PY
cd $OUT && tar czf s36.tgz s36 && rm -rf s36

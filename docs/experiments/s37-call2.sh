#!/usr/bin/env bash
# s37 calls 2-3 (PACK=new, BASE=base, TAG=output name): call 2, the quantizer's finite-block fast path (packed amax of the raw halves or fp32 bits, three-instruction
# codes). Packs: build-dev/s37a (PACK, default: the change + HEAD's GPU tests, hdim 128, sm80 + sm90) and build-dev/s36q
# (the base library). (1) GpuFp8Quantize/Permute tests on both libraries; (2) memcheck + racecheck on the new one;
# (3) bench_fp8_quantize.py alternated base/new, 2 rounds; (4) the FP8 pytest files on the new library.
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=${PACK:-s37a}; BASE=${BASE:-s36q}; TAG=${TAG:-s37c2}
t0=$(date +%s); L=$OUT/$TAG; mkdir -p $L /tmp/n /tmp/q
cat build-dev/$PACK/pack.part.* | tar xzf - -C /tmp/n || exit 1
cat build-dev/$BASE/pack.part.* | tar xzf - -C /tmp/q || exit 1
cp /tmp/n/tests/gpu/flashattn_gpu_tests /tmp/n/gt
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
export PYTHONPATH=$PWD/python
F='*Fp8Quantize*:*Fp8VPermute*'
for lib in n q; do
  LD_LIBRARY_PATH=/tmp/$lib timeout 150 /tmp/n/gt --gtest_filter="$F" --gtest_output=xml:$L/gtest-$lib.xml > $L/gtest-$lib.log 2>&1
  echo "tests on $lib rc=$? $(grep -c '  OK ]' $L/gtest-$lib.log) ok $(grep -c 'FAILED  \]' $L/gtest-$lib.log) failed t=$(( $(date +%s) - t0 ))"
  grep -o "hadamard_off_by_one=\"[^\"]*\"" $L/gtest-$lib.xml
  grep -E "FAILED  \]|Failure|error" $L/gtest-$lib.log | head -6
done
for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=/tmp/n timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 /tmp/n/gt \
    --gtest_filter='GpuFp8Quantize.*' > $L/sanitizer-$tool.log 2>&1
  echo "$tool rc=$? $(tail -1 $L/sanitizer-$tool.log) t=$(( $(date +%s) - t0 ))"
done
for r in 1 2; do
  for lib in q n; do
    LD_LIBRARY_PATH=/tmp/$lib FLASHATTN_LIBRARY=/tmp/$lib/libflashattn.so timeout 100 python3 bench/bench_fp8_quantize.py \
      --out $L/fp8-quantize-$lib-r$r.json > $L/quantize-$lib-r$r.log 2>&1
    echo "bench $lib r$r rc=$? t=$(( $(date +%s) - t0 ))"
  done
done
python3 - $L <<'PY' | tee $L/ab.txt
import json, sys, glob
L = sys.argv[1]
def load(lib):
    out = {}
    for f in sorted(glob.glob(f"{L}/fp8-quantize-{lib}-r*.json")):
        for r in json.load(open(f))["rows"]:
            k = (tuple(r["shape"]), r["hadamard"], r["layout"])
            out[k] = min(out.get(k, 1e9), r["ms"] * 1000)
    return out, json.load(open(f))["copy_gbps"]
q, cq = load("q"); n, cn = load("n")
print(f"copy GB/s base {cq:.0f} new {cn:.0f}; us per call, best of 2 (the % of copy uses the new run's copy)")
for k in q:
    b, s, h, d = k[0]
    moved = b * s * h * d * 3 + b * h * ((s + 127) // 128) * 4
    print(f"{str(k[0]):22s} had={int(k[1])} {k[2]:16s} base {q[k]:7.1f} new {n[k]:7.1f} ({q[k] / n[k]:.3f}x)  "
          f"{100 * moved / (n[k] * 1e-6) / 1e9 / cn:5.1f}% of copy")
PY
(cd tests/python && LD_LIBRARY_PATH=/tmp/n FLASHATTN_LIBRARY=/tmp/n/libflashattn.so timeout 200 python3 -m pytest -q -p no:cacheprovider \
  test_fp8.py test_fp8_attention.py > $L/pytest.log 2>&1)
echo "pytest rc=$? $(tail -1 $L/pytest.log) t=$(( $(date +%s) - t0 ))"
grep -E "^FAILED|Error" $L/pytest.log | head -8
if [ "${SUITE:-0}" = 1 ]; then  # the whole GPU suite of the new pack, up to the call's limit
  LD_LIBRARY_PATH=/tmp/n timeout $(( ${LIMIT:-570} - ($(date +%s) - t0) )) /tmp/n/gt > $L/gtest-all.log 2>&1
  echo "suite rc=$? ok: $(grep -c '^\[       OK \]' $L/gtest-all.log) failed: $(grep -c '^\[  FAILED  \] .*(' $L/gtest-all.log) t=$(( $(date +%s) - t0 ))"
  grep -E "^\[  FAILED  \] .*\(" $L/gtest-all.log | head; grep -E "^\[ RUN      \]" $L/gtest-all.log | tail -1; grep -E "tests? ran|PASSED" $L/gtest-all.log | tail -2
fi
cd $OUT && tar czf $TAG.tgz $TAG && rm -rf $TAG

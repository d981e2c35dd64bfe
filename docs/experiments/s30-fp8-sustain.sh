#!/usr/bin/env bash
# s30: issue 16's ratio in burst vs sustained timing (bench_fp8.py --rounds 3, --sustain-ms 0 vs 1000), hdim 128 and 256,
# from the biny pack (main's kernels); SM clock and power sampled every 100 ms beside it.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/su; mkdir -p $L /tmp/pk
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $L/gpu.txt
cat ${PACK:-build-dev/biny}/pack.part.* | tar xzf - -C /tmp/pk || exit 1
export FLASHATTN_LIBRARY=/tmp/pk/build-gpu/libflashattn.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader -lms 100 > $L/clocks.csv &
SMI=$!
for su in 0 1000; do for d in 128 256; do
  timeout 200 python3 bench/bench_fp8.py --hdim $d --seqlens 4096,16384 --rounds 3 --sustain-ms $su --vt --out-dir $L \
    > $L/fp8-d$d-su$su.log 2>&1; echo "d$d su$su rc=$? t=$(( $(date +%s) - t0 ))"
  for f in $L/*-fp8-hdim$d.json; do mv $f $L/fp8-d$d-su$su.json; done
done; done
kill $SMI
python3 - $L <<'PY'
import json, sys, glob
L = sys.argv[1]
for f in sorted(glob.glob(f"{L}/fp8-d*-su*.json")):
    rows = json.load(open(f))["rows"]
    t = {(r["seqlen"], r["causal"], r["impl"]): r["tflops"] for r in rows}
    for (s, c, i), v in sorted(t.items()):
        if i == "flashattn-bf16": continue
        b = t.get((s, c, "flashattn-bf16"))
        print(f.split("/")[-1], s, "causal" if c else "noncausal", i, f"{v:.1f}", f"bf16 {b:.1f}" if b else "", f"ratio {v / b:.3f}" if b else "")
PY
gzip $L/clocks.csv

#!/usr/bin/env bash
# s31: cuDNN's FP8 SDPA beside ours on the H200 (bench_fp8 --cudnn-fp8, --rounds 3), hdim 128 and 256, burst timing.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
L=$OUT/cd; mkdir -p $L /tmp/pk
cat build-dev/s31full/pack.part.* | tar xzf - -C /tmp/pk || exit 1
export FLASHATTN_LIBRARY=/tmp/pk/build-gpu/libflashattn.so PYTHONPATH=$PWD/python:/tmp/site
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
for d in 128; do
  timeout 200 python3 bench/bench_fp8.py --hdim $d --seqlens 4096,16384 --rounds 3 --vt --cudnn-fp8 --out-dir $L > $L/cd-d$d.log 2>&1
  echo "d$d rc=$?"; grep -E "^hdim|Error|error" $L/cd-d$d.log | head -8
done
python3 - $L <<'PY'
import json, sys, glob
for f in sorted(glob.glob(f"{sys.argv[1]}/*-fp8-hdim*.json")):
    rows = json.load(open(f))["rows"]
    t = {(r["hdim"], r["seqlen"], r["causal"], r["impl"]): r["tflops"] for r in rows}
    for (d, s, c, i), v in sorted(t.items()):
        b = t.get((d, s, c, "flashattn-bf16"))
        print(d, s, "causal" if c else "noncausal", f"{i:28s} {v:7.1f}", f"/ our bf16 {v / b:.3f}" if b else "")
PY

#!/usr/bin/env bash
# s37 call 7: flash_attn_fp8_func, s36's state (library of the s36q pack, a14b4d3's Python from build-dev/oldpy)
# against this session's (the s37f pack, the working tree's Python), alternated twice.
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s37c7; mkdir -p $L /tmp/n /tmp/q
cat build-dev/s37f/pack.part.* | tar xzf - -C /tmp/n || exit 1
cat build-dev/s36q/pack.part.* | tar xzf - -C /tmp/q || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
for r in 1 2; do
  LD_LIBRARY_PATH=/tmp/q FLASHATTN_LIBRARY=/tmp/q/libflashattn.so PYTHONPATH=$PWD/build-dev/oldpy/python \
    timeout 100 python3 docs/experiments/s37-onecall.py s36-r$r 2>&1 | tee -a $L/onecall.txt
  LD_LIBRARY_PATH=/tmp/n FLASHATTN_LIBRARY=/tmp/n/libflashattn.so PYTHONPATH=$PWD/python \
    timeout 100 python3 docs/experiments/s37-onecall.py s37-r$r 2>&1 | tee -a $L/onecall.txt
done
cd $OUT && tar czf s37c7.tgz s37c7 && rm -rf s37c7

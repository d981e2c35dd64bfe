#!/usr/bin/env bash
# s38 call 1: the decode step's timeline (decode-step-trace.diff, pack build-dev/s38t), three rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
L=$OUT/s38c1; mkdir -p $L /tmp/t
cat build-dev/s38t/pack.part.* | tar xzf - -C /tmp/t || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
export LD_LIBRARY_PATH=/tmp/t FLASHATTN_LIBRARY=/tmp/t/libflashattn.so PYTHONPATH=$PWD/python
for row in "1 1 16384 32/8" "1 8 4096 32/8" "4 1 16384 64/8"; do
  set -- $row
  tag=sq$1-b$2-c$3-h${4/\//-}
  timeout 90 python3 docs/experiments/s38-decode-trace.py --sq $1 --batch $2 --cache $3 --heads $4 \
    --out $L/$tag.bin 2>&1 | tee $L/$tag.txt
done
cd $OUT && tar czf s38c1.tgz s38c1 && rm -rf s38c1/*.bin

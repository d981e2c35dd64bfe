#!/usr/bin/env bash
# s38 calls 3-4: the decode timeline of a change (traced pack TRACED), then bench_decode A/B: HEAD's library
# (s37g pack) against the same change untraced (pack CHANGE), two alternated rounds. Call 3: the first K/V block
# issued before Q and the fused append after the prologue (defaults); call 4: TRACED=s38t2 CHANGE=s38b2 TAG=s38c4
# (Q requested before the cache length is known, the append after the prologue).
set -uo pipefail
cd "$(dirname "$0")/../.."
TRACED=${TRACED:-s38tc}; CHANGE=${CHANGE:-s38b}; TAG=${TAG:-s38c3}
L=$OUT/$TAG; mkdir -p $L /tmp/tc /tmp/a /tmp/b
cat build-dev/$TRACED/pack.part.* | tar xzf - -C /tmp/tc || exit 1
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
cat build-dev/$CHANGE/pack.part.* | tar xzf - -C /tmp/b || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $L/gpu.txt
for row in "1 1 16384 32/8" "1 8 4096 32/8" "4 1 16384 64/8"; do
  set -- $row
  tag=sq$1-b$2-c$3-h${4/\//-}
  LD_LIBRARY_PATH=/tmp/tc FLASHATTN_LIBRARY=/tmp/tc/libflashattn.so PYTHONPATH=$PWD/python \
    timeout 90 python3 docs/experiments/s38-decode-trace.py --sq $1 --batch $2 --cache $3 --heads $4 \
    --out $L/$tag.bin > $L/$tag.txt 2>&1
  grep -v "^[0-7] |" $L/$tag.txt | tail -32
done
for r in 1 2; do
  for v in a b; do
    LD_LIBRARY_PATH=/tmp/$v FLASHATTN_LIBRARY=/tmp/$v/libflashattn.so PYTHONPATH=$PWD/python \
      timeout 200 python3 bench/bench_decode.py --seqlens-q 1,4 --caches 4096,16384,65536 --batches 1,8 \
      --heads 32/8,64/8 --impls flashattn,flashattn-paged --target-ms 100 --out $L/decode-$v-r$r.json > $L/decode-$v-r$r.log 2>&1
    echo "$v r$r rc=$?"
  done
done
python3 docs/experiments/s38_decode_ab.py $L a b
cd $OUT && tar czf $TAG.tgz $TAG && rm -rf $TAG/*.bin

#!/usr/bin/env bash
# s38 call 12: combine_row_warps_kernel (pack s38r) against HEAD (s37g) on the rows it takes (29 splits), four
# alternated rounds; then ncu of its CTAs with warm caches (as call 10 for the old kernel).
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s38c12; mkdir -p $L /tmp/n /tmp/a
cat build-dev/s38r/pack.part.* | tar xzf - -C /tmp/n || exit 1
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
export PYTHONPATH=$PWD/python
for r in 1 2 3 4; do
  for v in a n; do
    LD_LIBRARY_PATH=/tmp/$v FLASHATTN_LIBRARY=/tmp/$v/libflashattn.so timeout 100 python3 bench/bench_decode.py \
      --seqlens-q 1,4 --caches 16384,65536 --batches 1 --heads 32/8,64/8 --impls flashattn --target-ms 100 \
      --out $L/decode-$v-r$r.json > $L/decode-$v-r$r.log 2>&1
  done
  echo "round $r t=$(( $(date +%s) - t0 ))"
done
python3 docs/experiments/s38_decode_ab.py $L a n | tee $L/ab.txt
LD_LIBRARY_PATH=/tmp/n FLASHATTN_LIBRARY=/tmp/n/libflashattn.so timeout 100 ncu --cache-control none --clock-control none \
  --section SpeedOfLight -k regex:combine --launch-skip 4 --launch-count 1 -o $L/comb-n -f \
  python3 docs/experiments/s38_decode_once.py > $L/ncu.log 2>&1
timeout 30 ncu -i $L/comb-n.ncu-rep --page details --csv 2>/dev/null | grep -E '"(Duration|Elapsed Cycles|SM Active Cycles|SM Frequency)"' | awk -F'","' '{print $(NF-2)" = "$NF}'
cd $OUT && tar czf s38c12.tgz s38c12

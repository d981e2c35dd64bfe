#!/usr/bin/env bash
# s38 call 9: ncu of the split-KV combine of a batch-1 decode step (29 splits, 32 rows): HEAD's CTA-per-row kernel
# (s37g) and the rejected warp-per-row kernel (s38c), to see what bounds a combine that takes ~2 us. Call 10:
# NCU_EXTRA="--cache-control none --clock-control none" TAG=s38c10 (the partials warm in L2, as in a decode step).
set -uo pipefail
cd "$(dirname "$0")/../.."
NCU_EXTRA=${NCU_EXTRA:-}; TAG=${TAG:-s38c9}
L=$OUT/$TAG; mkdir -p $L /tmp/a /tmp/n
cat build-dev/s37g/pack.part.* | tar xzf - -C /tmp/a || exit 1
cat build-dev/s38c/pack.part.* | tar xzf - -C /tmp/n || exit 1
export PYTHONPATH=$PWD/python
for v in a n; do
  LD_LIBRARY_PATH=/tmp/$v FLASHATTN_LIBRARY=/tmp/$v/libflashattn.so timeout 150 ncu $NCU_EXTRA --section SpeedOfLight \
    --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    -k regex:combine --launch-skip 4 --launch-count 1 -o $L/comb-$v -f python3 docs/experiments/s38_decode_once.py > $L/ncu-$v.log 2>&1
  echo "ncu $v rc=$?"; tail -2 $L/ncu-$v.log
  timeout 30 ncu -i $L/comb-$v.ncu-rep --page details --csv > $L/details-$v.csv 2>/dev/null
  grep -E '"(Duration|Elapsed Cycles|SM Frequency|Memory Throughput|L2 Cache Throughput|Grid Size|Block Size|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued Instruction|Avg. Active Threads Per Warp|SM Active Cycles|L2 Hit Rate|DRAM Throughput)"' $L/details-$v.csv | awk -F'","' '{print $(NF-2)" = "$NF}' | cut -c1-120
  timeout 30 ncu -i $L/comb-$v.ncu-rep --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
h, u, d = rows[0], rows[1], rows[2]
st = [(float(d[i]), h[i]) for i in range(len(h)) if 'smsp__average_warp_latency_issue_stalled' in h[i] and h[i].endswith('.ratio') and d[i].replace('.', '', 1).isdigit()]
for v, n in sorted(st, reverse=True)[:6]: print(f'  stall {n.split(\"stalled_\")[1]}: {v:.1f}')
" 2>&1 | head -8
done
cd $OUT && tar czf $TAG.tgz $TAG

#!/usr/bin/env bash
# s31: ncu source-level profile of the wide lean FP8 kernel (hdim 128, per-head scales, 16k), from the s31full pack (double P).
set -uo pipefail
cd "$(dirname "$0")/.."
L=$OUT/l; mkdir -p $L /tmp/pk
cat build-dev/s31full/pack.part.* | tar xzf - -C /tmp/pk || exit 1
export FLASHATTN_LIBRARY=/tmp/pk/build-gpu/libflashattn.so PYTHONPATH=$PWD/python
python3 build-dev/s30_fp8_once.py || exit 1
timeout 200 ncu --clock-control none --section SourceCounters --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section SchedulerStats --section SpeedOfLight --section Occupancy --import-source no -k regex:fwd_kernel --launch-skip 3 --launch-count 1 \
  -o $L/fp8wide -f python3 build-dev/s30_fp8_once.py > $L/ncu.log 2>&1
echo "ncu rc=$?"; tail -3 $L/ncu.log
timeout 90 ncu -i $L/fp8wide.ncu-rep --page source --csv --print-source sass > $L/sass.csv 2> $L/export.err; echo "export rc=$? $(wc -l < $L/sass.csv) lines"
timeout 30 ncu -i $L/fp8wide.ncu-rep --page details --csv > $L/details.csv 2>> $L/export.err
grep -E '"(Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction)"' $L/details.csv | cut -c1-250
gzip $L/sass.csv
cd $OUT && tar czf all.tgz l && rm -rf l

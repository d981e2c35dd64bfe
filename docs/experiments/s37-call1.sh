#!/usr/bin/env bash
# s37 call 1 (pack build-dev/s36q: the hdim-128 library of 9382c82, whose library sources are HEAD's): (1) host time of
# quantize / flash_attn_fp8_func / combine with _lib.place's old and new stream lookup (s37-quant-host.py); (2) ncu of
# the quantizer kernels (rows, rows + Hadamard, keys_permuted16; hdim 128 and 64); (3) bench_fp8_quantize.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/s37c1; mkdir -p $L /tmp/q
cat build-dev/s36q/pack.part.* | tar xzf - -C /tmp/q || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $L/gpu.txt
export LD_LIBRARY_PATH=/tmp/q FLASHATTN_LIBRARY=/tmp/q/libflashattn.so PYTHONPATH=$PWD/python
timeout 150 python3 docs/experiments/s37-quant-host.py > $L/host.txt 2>&1; echo "host rc=$? t=$(( $(date +%s) - t0 ))"
grep -E "round|stream lookup|ncalls|fp8.py|_lib.py|_ops.py|\{" $L/host.txt | head -40
cat > /tmp/qk.py <<'PY'
import sys, torch
sys.path.insert(0, "python")
import flashattn.fp8 as fp8
for shape in [(8, 8192, 16, 128), (16, 8192, 32, 64)]:
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        fp8.quantize(x); fp8.quantize(x, hadamard=True, seed=1); fp8.quantize(x, layout="keys_permuted16")
    torch.cuda.synchronize()
PY
timeout 240 ncu --clock-control none --kernel-name regex:fp8_quantize --launch-skip 3 --launch-count 6 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section InstructionStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  --csv --page details python3 /tmp/qk.py > $L/ncu.csv 2> $L/ncu.err
echo "ncu rc=$? $(wc -l < $L/ncu.csv) lines t=$(( $(date +%s) - t0 ))"
python3 - $L/ncu.csv <<'PY' | tee $L/ncu-summary.txt
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = ["Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "Issue Slots Busy", "Eligible Warps Per Scheduler",
        "Achieved Occupancy", "Registers Per Thread", "Warp Cycles Per Issued Instruction", "Executed Instructions",
        "Grid Size", "No Eligible", "Theoretical Occupancy", "Dynamic Shared Memory Per Block"]
def num(v):
    try: return float(v.replace(',', ''))
    except ValueError: return 0.0
by = {}
for r in rows:
    k = (r.get("ID"), r.get("Kernel Name", "")[:60])
    if r.get("Metric Name") in want or ("issue_stalled" in r.get("Metric Name", "") and num(r["Metric Value"]) > 0.05): by.setdefault(k, []).append(f"{r['Metric Name']}={r['Metric Value']}{r.get('Metric Unit','')}")
for k, v in by.items(): print(k, "\n   ", "; ".join(v))
PY
timeout 120 python3 bench/bench_fp8_quantize.py --out $L/fp8-quantize.json 2>&1 | tee $L/quantize.log | tail -18
echo "t=$(( $(date +%s) - t0 ))"
cd $OUT && tar czf s37c1.tgz s37c1 && rm -rf s37c1

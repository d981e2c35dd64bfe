#!/usr/bin/env bash
# s32, call 2: the group kernel's scale reads after the GEMM issue (g2: no spills left in its loop; g1 = call 1's) and
# g2all (the per-head rows on the group kernel too, timing only: launch.h patched for the object). Pack build-dev/s32ab.
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=build-dev/s32ab VARS="head g1 g2 g2all" TESTVARS="g2 g2all" BLOCKS=1 bash docs/experiments/s30-fp8ab.sh
cd $OUT && tar czf ab.tgz ab && rm -rf ab

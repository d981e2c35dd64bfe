#!/usr/bin/env bash
# s32, call 3: the per-head lean loop with its max and sum in three chains (l3, no spills left in its loop) against
# base = HEAD before s32 (the group kernel g2 is in l3 too). Rows only: the full build after it runs the tests. Pack build-dev/s32ab.
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=build-dev/s32ab VARS="base l3" TESTVARS="" BLOCKS=1 bash docs/experiments/s30-fp8ab.sh
cd $OUT && tar czf ab.tgz ab && rm -rf ab

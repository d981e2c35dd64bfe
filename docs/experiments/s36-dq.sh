#!/usr/bin/env bash
# s36: an hdim-128-only build with both GPU paths (sm80 + sm90), then s36-hdim40-dq.py (20 random trials per head
# dim, backend and dtype of test_cuda_every_headdim's shape) and the failing pytest cases themselves, 5 times.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s); L=$OUT/l; mkdir -p $L
export PATH=$PATH:/usr/local/cuda/bin
cmake -S . -B build-gpu128 -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_HEADDIMS=128 \
  -DFLASHATTN_CUDA_ARCHS="80;90a" -DFLASHATTN_TESTS=OFF -DFLASHATTN_BENCH=OFF > $L/cmake.log 2>&1
ninja -C build-gpu128 -j16 flashattn > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
echo "build t=$(( $(date +%s) - t0 ))"
export FLASHATTN_LIBRARY=$PWD/build-gpu128/libflashattn.so PYTHONPATH=$PWD/python
python3 docs/experiments/s36-hdim40-dq.py 2>&1 | tee $L/dq.txt
echo "dq t=$(( $(date +%s) - t0 ))"
for i in 1 2 3 4 5; do
  (cd tests/python && python3 -m pytest -q -p no:cacheprovider "test_cuda.py::test_cuda_every_headdim" 2>&1 | tail -3)
done | tee $L/pytest.txt
cd $OUT && tar czf logs.tgz l && rm -rf l

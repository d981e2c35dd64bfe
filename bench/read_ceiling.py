#!/usr/bin/env python3
"""What a plain streaming read reaches per layer at a decode step's K/V sizes: the ceiling a
decode kernel's "% of copy" can approach at that size. A diagnostic beside bench_decode.py.

For each size, one CUDA graph of --layers reads (each over its own buffer, so nothing is found
in L2) is replayed and timed as bench_decode times a decode step, and divided by the layers.
The read is a one-pass kernel (16-byte loads, a few in flight per thread, one word written per
CTA), compiled with torch's cpp_extension; torch's own reductions are timed beside it. Prints
GB/s read and its share of the device-to-device copy bandwidth measured in the same run.

    python bench/read_ceiling.py [--sizes-mb 4,16,67,134,268,537] [--layers 8] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from bench_decode import copy_gbps, graph_time_ms  # noqa: E402

KERNEL = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

template <int kUnroll>
__global__ void stream_read(const uint4* __restrict__ x, long n, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  const long stride = long(gridDim.x) * blockDim.x;
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = __ldg(x + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // keeps the loads
}

// The decode split's access pattern: CTA (split, head) reads its key range of one head, `row16` uint4 per
// key and head (hdim 128 bf16: 16), keys `heads * row16` uint4 apart, kUnroll keys per thread in flight.
template <int kUnroll>
__global__ void split_read(const uint4* __restrict__ x, int keys, int heads, int row16, int splits,
                           unsigned* __restrict__ sink) {
  const int split = blockIdx.x, head = blockIdx.y;
  const int per = (keys + splits - 1) / splits;
  const int k0 = split * per, k1 = min(keys, k0 + per);
  const int lane_col = threadIdx.x % row16, rows_per_pass = blockDim.x / row16;
  const long key_stride = long(heads) * row16;
  unsigned acc = 0;
  int k = k0 + threadIdx.x / row16;
  for (; k + (kUnroll - 1) * rows_per_pass < k1; k += kUnroll * rows_per_pass) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(x + (k + u * rows_per_pass) * key_stride + head * row16 + lane_col);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; k < k1; k += rows_per_pass) { uint4 v = __ldg(x + k * key_stride + head * row16 + lane_col); acc ^= v.x ^ v.w; }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// The same CTAs with their key chunks (kUnroll * rows_per_pass keys) interleaved: CTA `split` reads chunks
// split, split + splits, ..., so at any moment the grid reads one contiguous window of the tensor (all
// heads of neighbouring keys) instead of `splits` regions far apart.
template <int kUnroll>
__global__ void split_read_interleaved(const uint4* __restrict__ x, int keys, int heads, int row16, int splits,
                                       unsigned* __restrict__ sink) {
  const int split = blockIdx.x, head = blockIdx.y;
  const int lane_col = threadIdx.x % row16, rows_per_pass = blockDim.x / row16;
  const int chunk = kUnroll * rows_per_pass;
  const long key_stride = long(heads) * row16;
  unsigned acc = 0;
  for (int c0 = split * chunk; c0 < keys; c0 += splits * chunk) {
    const int k = c0 + threadIdx.x / row16;
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int kk = min(k + u * rows_per_pass, keys - 1);
      v[u] = __ldg(x + kk * key_stride + head * row16 + lane_col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((threadIdx.x & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

void read_split_interleaved(torch::Tensor x, torch::Tensor sink, int64_t heads, int64_t row16, int64_t splits,
                            int64_t unroll) {
  const long n16 = x.numel() * x.element_size() / 16;
  const int keys = int(n16 / (heads * row16));
  auto s = at::cuda::getCurrentCUDAStream();
  auto p = reinterpret_cast<const uint4*>(x.data_ptr());
  auto o = reinterpret_cast<unsigned*>(sink.data_ptr());
  const dim3 grid(splits, heads);
  if (unroll == 16) split_read_interleaved<16><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
  else if (unroll == 8) split_read_interleaved<8><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
  else split_read_interleaved<4><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
}

void read_split(torch::Tensor x, torch::Tensor sink, int64_t heads, int64_t row16, int64_t splits, int64_t unroll) {
  const long n16 = x.numel() * x.element_size() / 16;
  const int keys = int(n16 / (heads * row16));
  auto s = at::cuda::getCurrentCUDAStream();
  auto p = reinterpret_cast<const uint4*>(x.data_ptr());
  auto o = reinterpret_cast<unsigned*>(sink.data_ptr());
  const dim3 grid(splits, heads);
  if (unroll == 16) split_read<16><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
  else if (unroll == 8) split_read<8><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
  else split_read<4><<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o);
}

void read_all(torch::Tensor x, torch::Tensor sink, int64_t ctas_per_sm, int64_t unroll) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device());
  const long n = x.numel() * x.element_size() / 16;
  const int grid = int(sms * ctas_per_sm);
  auto s = at::cuda::getCurrentCUDAStream();
  auto p = reinterpret_cast<const uint4*>(x.data_ptr());
  auto o = reinterpret_cast<unsigned*>(sink.data_ptr());
  if (unroll == 8) stream_read<8><<<grid, 512, 0, s>>>(p, n, o);
  else stream_read<4><<<grid, 512, 0, s>>>(p, n, o);
}
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes-mb", default="4,16,67,134,268,537")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--min-iters", type=int, default=20)
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--target-ms", type=float, default=200.0)
    p.add_argument("--warmup-ms", type=float, default=50.0)
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--splits", default="57,114",
                   help="split counts of the decode split pattern (8 heads) to time beside the plain reads")
    p.add_argument("--split-only", action="store_true", help="only the split patterns (no plain or torch reads)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("read_ceiling_ext", cpp_sources="void read_all(torch::Tensor, torch::Tensor, int64_t, int64_t);\n"
                      "void read_split(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);\n"
                      "void read_split_interleaved(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);",
                      cuda_sources=KERNEL, functions=["read_all", "read_split", "read_split_interleaved"], extra_cuda_cflags=["-O3", "-arch=sm_90a"],
                      verbose=False)
    copy = copy_gbps(dev, a)
    name = torch.cuda.get_device_name(dev)
    print(f"device: {name}; copy bandwidth (read + write): {copy:.0f} GB/s")
    sink = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    rows = []
    for mb in [float(s) for s in a.sizes_mb.split(",")]:
        nbytes = int(mb * 1e6) // 4096 * 4096
        layers = max(1, min(a.layers, int(6e9 // nbytes)))
        bufs = [torch.randn(nbytes // 2, dtype=torch.bfloat16, device=dev) for _ in range(layers)]
        variants = {} if a.split_only else {
            f"read k{c} u{u}": (lambda c=c, u=u: [lambda x=x: ext.read_all(x, sink, c, u) for x in bufs])
            for c in (2, 4) for u in (4, 8)}
        # A decode split's pattern over [keys, 8 heads, 128] bf16 (GQA 32/8 at batch 1): a CTA per
        # (split, head), 256-byte rows 2 KB apart; and the same key ranges read whole (heads=1).
        shapes = [(8, int(n)) for n in a.splits.split(",")] + ([] if a.split_only else [(1, 57), (1, 456)])
        for heads, splits in shapes:
            for u in (8, 16):
                variants[f"split h{heads} s{splits} u{u}"] = (
                    lambda heads=heads, splits=splits, u=u: [
                        lambda x=x: ext.read_split(x, sink, heads, 16 * 8 // heads, splits, u) for x in bufs])
                if heads > 1:
                    variants[f"split h{heads} s{splits} u{u} interleaved"] = (
                        lambda heads=heads, splits=splits, u=u: [
                            lambda x=x: ext.read_split_interleaved(x, sink, heads, 16 * 8 // heads, splits, u)
                            for x in bufs])
        if not a.split_only:
            variants["torch amax"] = lambda: [lambda x=x: torch.amax(x.view(-1, 2048), dim=1) for x in bufs]
            variants["torch copy (half read, half written)"] = lambda: [
                lambda x=x, y=torch.empty(nbytes // 4, dtype=torch.bfloat16, device=dev): y.copy_(x[: nbytes // 4])
                for x in bufs]
        for vname, make in variants.items():
            ms = graph_time_ms(make(), a, dev)
            if ms is None:
                continue
            gbps = nbytes / (ms * 1e-3) / 1e9
            row = dict(variant=vname, mb=nbytes / 1e6, layers=layers, us_per_layer=ms * 1e3, gbps=gbps,
                       pct_of_copy=100.0 * gbps / copy)
            rows.append(row)
            print(f"{nbytes / 1e6:7.1f} MB x{layers}  {vname:38s} {ms * 1e3:8.2f} us  {gbps:6.0f} GB/s  "
                  f"{row['pct_of_copy']:5.1f}% of copy")
        del bufs
        torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps(dict(device=name, copy_gbps=copy, rows=rows), indent=1))


if __name__ == "__main__":
    main()

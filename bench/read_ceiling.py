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

// The decode kernel's load structure without its math: CTA (split, head) of 128 threads walks its key blocks
// (64 keys; K from the first half of the buffer, V from the second, each [keys, heads, 128] bf16) through a
// ring of kStages smem stages (K + V: 32 KB each), a barrier per block, splits interleaved block by block.
// kBulk = false: 16-byte cp.async per thread (as fwd_kernel), one commit group per block.
// kBulk = true: one 256-byte cp.async.bulk per K or V row issued by warp 0, completing on the stage's mbarrier
// (the TMA unit's copies, outside the LSU's request tracking).
template <int kStages, bool kBulk>
__global__ void __launch_bounds__(128) ring_read(const char* __restrict__ x, long half_bytes, int keys, int heads,
                                                 int splits, unsigned* __restrict__ sink) {
  extern __shared__ __align__(128) char smem[];
  constexpr int kBlock = 64, kRow = 256, kStage = 2 * kBlock * kRow;
  __shared__ __align__(8) unsigned long long bar[kStages];
  const int split = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
  const long key_stride = long(heads) * kRow;
  const char* kx = x + long(head) * kRow;
  const char* vx = x + half_bytes + long(head) * kRow;
  const int n_blocks = keys / kBlock;
  const unsigned smem_base = unsigned(__cvta_generic_to_shared(smem));
  if (kBulk) {
    if (tid < kStages) {
      const unsigned b = unsigned(__cvta_generic_to_shared(&bar[tid]));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
  }
  auto issue = [&](int n, int stage) {  // block n into stage (n < 0: nothing; cp.async still commits a group)
    const unsigned dst = smem_base + stage * kStage;
    if (kBulk) {
      if (n >= 0 && tid < 32) {
        const unsigned b = unsigned(__cvta_generic_to_shared(&bar[stage]));
        if (tid == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(kStage) : "memory");
        __syncwarp();
        for (int r = tid; r < kBlock; r += 32) {
          const char* ks = kx + long(n * kBlock + r) * key_stride;
          const char* vs = vx + long(n * kBlock + r) * key_stride;
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];"
                       ::"r"(dst + r * kRow), "l"(ks), "r"(b) : "memory");
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];"
                       ::"r"(dst + kBlock * kRow + r * kRow), "l"(vs), "r"(b) : "memory");
        }
      }
    } else {
      if (n >= 0) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // 1024 16-byte chunks of K, then of V, 8 per thread each
          const int c = i * 128 + tid, r = c / 16, col = (c % 16) * 16;
          const char* ks = kx + long(n * kBlock + r) * key_stride + col;
          const char* vs = vx + long(n * kBlock + r) * key_stride + col;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + r * kRow + col), "l"(ks) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + kBlock * kRow + r * kRow + col), "l"(vs)
                       : "memory");
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  };
  // Split s: blocks n_blocks - 1 - s, then every splits-th below.
  const int first = n_blocks - 1 - split;
  for (int st = 0; st < kStages - 1; ++st) issue(first - st * splits >= 0 ? first - st * splits : -1, st);
  unsigned acc = 0;
  int it = 0;
  for (int n = first; n >= 0; n -= splits, ++it) {
    const int stage = it % kStages;
    if (kBulk) {
      const unsigned b = unsigned(__cvta_generic_to_shared(&bar[stage]));
      const unsigned parity = unsigned(it / kStages) & 1u;
      unsigned done = 0;
      while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } else {
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    }
    __syncthreads();  // block n landed for every thread; every thread is done with the previous block's stage
    const int ahead = n - (kStages - 1) * splits;
    issue(ahead >= 0 ? ahead : -1, (it + kStages - 1) % kStages);
    const uint4* sk = reinterpret_cast<const uint4*>(smem + stage * kStage);
    const uint4 a = sk[tid], c = sk[1024 + tid];  // a word of K and of V per thread
    acc ^= a.x ^ c.w;
  }
  if (!kBulk) asm volatile("cp.async.wait_group 0;" ::: "memory");
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if ((tid & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

void read_ring(torch::Tensor x, torch::Tensor sink, int64_t heads, int64_t splits, int64_t stages, int64_t bulk) {
  const long half = x.numel() * x.element_size() / 2;
  const int keys = int(half / (heads * 256)) / 64 * 64;
  auto s = at::cuda::getCurrentCUDAStream();
  auto p = reinterpret_cast<const char*>(x.data_ptr());
  auto o = reinterpret_cast<unsigned*>(sink.data_ptr());
  const dim3 grid(splits, heads);
  const int smem = int(stages) * 2 * 64 * 256;
#define FA_RING(S, B)                                                                                        \
  if (stages == S && bulk == B) {                                                                           \
    cudaFuncSetAttribute(ring_read<S, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);               \
    ring_read<S, B><<<grid, 128, smem, s>>>(p, half, keys, int(heads), int(splits), o);                     \
    return;                                                                                                  \
  }
  FA_RING(2, 0) FA_RING(3, 0) FA_RING(4, 0) FA_RING(2, 1) FA_RING(3, 1) FA_RING(4, 1) FA_RING(6, 1)
#undef FA_RING
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
    p.add_argument("--ring-splits", default="",
                   help="split counts of ring_read (the decode kernel's cp.async / bulk-copy ring without math)")
    p.add_argument("--split-only", action="store_true", help="only the split patterns (no plain or torch reads)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("read_ceiling_ext", cpp_sources="void read_all(torch::Tensor, torch::Tensor, int64_t, int64_t);\n"
                      "void read_split(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);\n"
                      "void read_split_interleaved(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);\n"
                      "void read_ring(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);",
                      cuda_sources=KERNEL, functions=["read_all", "read_split", "read_split_interleaved", "read_ring"], extra_cuda_cflags=["-O3", "-arch=sm_90a"],
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
        # The decode kernel's load structure without math (ring_read): 8 heads, interleaved splits.
        for splits in [int(n) for n in a.ring_splits.split(",") if n]:
            for stages, bulk in ((3, 0), (2, 1), (3, 1), (4, 1), (6, 1)):
                variants[f"ring s{splits} st{stages} {'bulk' if bulk else 'cp.async'}"] = (
                    lambda splits=splits, stages=stages, bulk=bulk: [
                        lambda x=x: ext.read_ring(x, sink, 8, splits, stages, bulk) for x in bufs])
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

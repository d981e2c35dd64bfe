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

// interleaved: split_read_interleaved's order of key chunks, else split_read's ranges.
void read_split(torch::Tensor x, torch::Tensor sink, int64_t heads, int64_t row16, int64_t splits, int64_t unroll,
                int64_t interleaved) {
  const long n16 = x.numel() * x.element_size() / 16;
  const int keys = int(n16 / (heads * row16));
  auto s = at::cuda::getCurrentCUDAStream();
  auto p = reinterpret_cast<const uint4*>(x.data_ptr());
  auto o = reinterpret_cast<unsigned*>(sink.data_ptr());
  const dim3 grid(splits, heads);
  auto launch = [&](auto kernel) { kernel<<<grid, 128, 0, s>>>(p, keys, int(heads), int(row16), int(splits), o); };
  if (interleaved) {
    launch(unroll == 16 ? split_read_interleaved<16> : unroll == 8 ? split_read_interleaved<8> : split_read_interleaved<4>);
  } else {
    launch(unroll == 16 ? split_read<16> : unroll == 8 ? split_read<8> : split_read<4>);
  }
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

// The ablation ladder for the decode kernel's missing microseconds (perf-notes, twenty-fourth session):
// ring_read's CTA (one split of one kv head, 128 threads, a 3-stage ring of 64-key K+V blocks, splits
// interleaved; rows swizzled for ldmatrix) with the decode kernel's pieces switched on one at a time:
//   kLadderMath  each warp computes its 16 keys of a block for 8 query rows (4 real, GQA 32/8): S^T = K Q^T
//                (mma.sync m16n8k16), online softmax over its keys, P^T by movmatrix, O^T += V^T P^T
//   kLadderDep   the key count comes from global memory (as cache_seqlens) before the first copy
//   kLadderEpi   the warps merge (m, l, O^T) through smem and the CTA stores fp32 partial O and LSE rows
//   kLadderSetup ~500 dependent integer instructions (24 divisions) before the first copy, as the kernels'
//                address and mask setup (the tile kernel issues its first cp.async ~1000 SASS lines in)
// and then the step's combine as a second kernel, launched plainly or as a programmatic dependent launch (PDL,
// triggered at the ring kernel's start) as the library does.
//   kLadderEpiStore / kLadderEpiMerge  the epilogue's halves alone (twenty-fifth session: kLadderEpi cost ~2 us):
//                the fp32 partial rows stored straight from registers (no merge), or the warps' merge through
//                smem with its two barriers and no global stores
//   kLadderMathSkipLast / kLadderMathOnlyLast  (with kLadderMath; thirty-first session) the math on every block
//                but the split's last, or on the last only: whether the math's ~1.6 us is the tail (the last
//                block's math after the stream ends) or a slower stream (each block's math delaying its refill)
constexpr int kLadderMath = 1, kLadderDep = 2, kLadderEpi = 4, kLadderSetup = 8, kLadderEpiStore = 16, kLadderEpiMerge = 32,
              kLadderMathSkipLast = 64, kLadderMathOnlyLast = 128;

__device__ __forceinline__ int ladder_swz(int r, int u) { return r * 256 + ((u ^ (r & 7)) << 4); }
// ldmatrix x4 (transposed for V^T) into a, then c += a * (b0, b1) (m16n8k16, bf16 in, fp32 accumulate).
template <bool kTrans>
__device__ __forceinline__ void ladder_ldsm_mma(float (&c)[4], unsigned addr, uint32_t b0, uint32_t b1) {
  uint32_t a[4];
  if (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
  }
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kFlags>
__global__ void __launch_bounds__(128, 2) ladder_kernel(const char* __restrict__ x, long half_bytes, int keys_arg,
                                                         const int* __restrict__ keys_ptr, const uint16_t* __restrict__ q,
                                                         int splits, float* __restrict__ o_part,
                                                         float* __restrict__ lse_part, unsigned* __restrict__ sink,
                                                         int pdl) {
  constexpr int kStages = 3, kBlock = 64, kRow = 256, kStage = 2 * kBlock * kRow, kHeads = 8;
  extern __shared__ __align__(128) char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int split = blockIdx.x, head = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const long key_stride = long(kHeads) * kRow;
  const char* kx = x + long(head) * kRow;
  const char* vx = x + half_bytes + long(head) * kRow;
  int keys = (kFlags & kLadderDep) ? *keys_ptr : keys_arg;
  if (kFlags & kLadderSetup) {  // a dependent chain the first copy waits for (the result never changes keys)
    int v = tid + split;
#pragma unroll 1
    for (int i = 0; i < 24; ++i) v = (v * 7 + keys) / (3 + (v & 1));
    keys += v == -12345 ? 1 : 0;
  }
  const int n_blocks = keys / kBlock;
  const unsigned smem_base = unsigned(__cvta_generic_to_shared(smem));
  auto issue = [&](int n, int stage) {
    const unsigned dst = smem_base + stage * kStage;
    if (n >= 0) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = i * 128 + tid, r = c / 16, u = c % 16;
        const char* ks = kx + long(n * kBlock + r) * key_stride + u * 16;
        const char* vs = vx + long(n * kBlock + r) * key_stride + u * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + ladder_swz(r, u)), "l"(ks) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + kBlock * kRow + ladder_swz(r, u)), "l"(vs)
                     : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  const int first = n_blocks - 1 - split;
  for (int st = 0; st < kStages - 1; ++st) issue(first - st * splits >= 0 ? first - st * splits : -1, st);

  // Q^T fragments of this head's 8 rows (row g; dims 16 kk + 2t, + 8).
  uint32_t qf[8][2];
  float o[8][4], m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  if (!(kFlags & kLadderMath)) m_run[0] = m_run[1] = 0.f, l_run[0] = l_run[1] = 1.f;  // (epilogue without math)
  if (kFlags & kLadderMath) {
    const uint16_t* qr = q + (long(head) * 8 + g) * 128;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        qf[kk][hf] = uint32_t(qr[16 * kk + 8 * hf + 2 * t]) | (uint32_t(qr[16 * kk + 8 * hf + 2 * t + 1]) << 16);
  }
  const int lm_q = lane / 8, lm_r = lane % 8;
  const int k_row = 16 * warp + (lm_q & 1) * 8 + lm_r, k_unit = lm_q >> 1;
  const int v_row = 16 * warp + (lm_q >> 1) * 8 + lm_r, v_unit = lm_q & 1;
  const float scale2 = 0.08838834764f * 1.44269504f;
  unsigned acc = 0;
  int it = 0;
  for (int n = first; n >= 0; n -= splits, ++it) {
    const int stage = it % kStages;
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    const int ahead = n - (kStages - 1) * splits;
    issue(ahead >= 0 ? ahead : -1, (it + kStages - 1) % kStages);
    const unsigned k_s = smem_base + stage * kStage, v_s = k_s + kBlock * kRow;
    const bool last = n - splits < 0;
    if ((kFlags & kLadderMath) && !((kFlags & kLadderMathSkipLast) && last) && !((kFlags & kLadderMathOnlyLast) && !last)) {
      float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < 8; ++kk)
        ladder_ldsm_mma<false>(sc, k_s + ladder_swz(k_row, 2 * kk + k_unit), qf[kk][0], qf[kk][1]);
      if ((n + 1) * kBlock > keys) {  // the sequence's end (never here: keys is a multiple of 64)
        const int j = n * kBlock + 16 * warp + g;
        if (j >= keys) sc[0] = sc[1] = -INFINITY;
        if (j + 8 >= keys) sc[2] = sc[3] = -INFINITY;
      }
      float pr[4];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mx = fmaxf(sc[e], sc[e + 2]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        mx *= scale2;
        if (mx > m_run[e] + 8.f || m_run[e] == -INFINITY) {  // lazy max (slack 8, as common/softmax.h)
          const float f = m_run[e] == -INFINITY ? 0.f : exp2f(m_run[e] - mx);
          m_run[e] = mx;
          l_run[e] *= f;
#pragma unroll
          for (int mt = 0; mt < 8; ++mt) o[mt][e] *= f, o[mt][e + 2] *= f;
        }
        pr[e] = exp2f(fmaf(sc[e], scale2, -m_run[e]));
        pr[e + 2] = exp2f(fmaf(sc[e + 2], scale2, -m_run[e]));
        l_run[e] += pr[e] + pr[e + 2];
      }
      uint32_t p0, p1;
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p0) : "f"(pr[1]), "f"(pr[0]));
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p1) : "f"(pr[3]), "f"(pr[2]));
      asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(p0) : "r"(p0));
      asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(p1) : "r"(p1));
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) ladder_ldsm_mma<true>(o[mt], v_s + ladder_swz(v_row, 2 * mt + v_unit), p0, p1);
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(smem + stage * kStage + tid * 16);
      const uint4 c = *reinterpret_cast<const uint4*>(smem + stage * kStage + kBlock * kRow + tid * 16);
      acc ^= a.x ^ c.w;
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (kFlags & (kLadderEpi | kLadderEpiMerge)) {
    __syncthreads();
    float* red_o = reinterpret_cast<float*>(smem);  // [warp][row 8][dim 128]
    float* red_m = red_o + 4 * 8 * 128;
    float* red_l = red_m + 4 * 8;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float l = l_run[e];
      l += __shfl_xor_sync(0xffffffffu, l, 4);
      l += __shfl_xor_sync(0xffffffffu, l, 8);
      l += __shfl_xor_sync(0xffffffffu, l, 16);
      const int r = 2 * t + e;
      if (g == 0) red_m[warp * 8 + r] = m_run[e], red_l[warp * 8 + r] = l;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        red_o[(warp * 8 + r) * 128 + 16 * mt + g] = o[mt][e];
        red_o[(warp * 8 + r) * 128 + 16 * mt + g + 8] = o[mt][e + 2];
      }
    }
    __syncthreads();
    for (int r = 0; r < 4; ++r) {
      float m = -INFINITY;
      for (int w = 0; w < 4; ++w) m = fmaxf(m, red_m[w * 8 + r]);
      float l = 0.f, a = 0.f;
      for (int w = 0; w < 4; ++w) {
        const float f = exp2f(red_m[w * 8 + r] - m);
        l += f * red_l[w * 8 + r];
        a += f * red_o[(w * 8 + r) * 128 + tid];
      }
      const long row = (long(split) * kHeads + head) * 8 + r;
      if (kFlags & kLadderEpi) {
        o_part[row * 128 + tid] = a / l;
        if (tid == 0) lse_part[row] = (m + log2f(l)) * 0.69314718f;
      } else {
        acc ^= __float_as_uint(a / l) ^ __float_as_uint(m + log2f(l));
      }
    }
    if (!(kFlags & kLadderEpi)) {
      acc = __reduce_xor_sync(0xffffffffu, acc);
      if ((tid & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
    }
  } else if (kFlags & kLadderEpiStore) {
    // Each warp's own (unmerged) O^T rows: thread (g, t) holds dims 16 mt + g (+ 8) of rows 2t, 2t + 1.
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const long row = ((long(split) * kHeads + head) * 8 + 2 * t + e) * 4 + warp;  // a row per (row, warp)
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        o_part[row * 128 / 4 + 16 * mt + g] = o[mt][e] / l_run[e];
        o_part[row * 128 / 4 + 16 * mt + g + 8] = o[mt][e + 2] / l_run[e];
      }
      if (g == 0) lse_part[row / 4] = m_run[e] + log2f(l_run[e]);
    }
  } else {
    if (kFlags & kLadderMath) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) acc ^= __float_as_uint(o[mt][0] + o[mt][3]) ^ __float_as_uint(l_run[0]);
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((tid & 31) == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
  }
}

// The step's combine: a CTA per kv head, a thread per dim, over the 4 real rows of every split.
__global__ void ladder_combine(const float* __restrict__ o_part, const float* __restrict__ lse_part, int splits,
                               uint16_t* __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int head = blockIdx.x, tid = threadIdx.x;
  for (int r = 0; r < 4; ++r) {
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, lse_part[(long(s) * 8 + head) * 8 + r]);
    float l = 0.f, a = 0.f;
    for (int s = 0; s < splits; ++s) {
      const long row = (long(s) * 8 + head) * 8 + r;
      const float w = __expf(lse_part[row] - m);
      l += w;
      a += w * o_part[row * 128 + tid];
    }
    const float v = a / l;
    out[(head * 8 + r) * 128 + tid] = uint16_t(__float_as_uint(v) >> 16);
  }
}

// combine: 0 none, 1 plain launch, 2 programmatic dependent launch.
void read_ladder(torch::Tensor x, torch::Tensor q, torch::Tensor keys, torch::Tensor o_part, torch::Tensor lse_part,
                 torch::Tensor out, torch::Tensor sink, int64_t splits, int64_t flags, int64_t combine) {
  const long half = x.numel() * x.element_size() / 2;
  const int n_keys = int(half / (8 * 256)) / 64 * 64;
  auto s = at::cuda::getCurrentCUDAStream();
  const dim3 grid(splits, 8);
  const int smem = 3 * 2 * 64 * 256;
  auto args = [&](auto kernel) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    kernel<<<grid, 128, smem, s>>>(reinterpret_cast<const char*>(x.data_ptr()), half, n_keys, keys.data_ptr<int>(),
                                   reinterpret_cast<const uint16_t*>(q.data_ptr()), int(splits),
                                   o_part.data_ptr<float>(), lse_part.data_ptr<float>(),
                                   reinterpret_cast<unsigned*>(sink.data_ptr()), combine == 2 ? 1 : 0);
  };
  switch (flags) {
    case 0: args(ladder_kernel<0>); break;
    case 1: args(ladder_kernel<1>); break;
    case 2: args(ladder_kernel<2>); break;
    case 3: args(ladder_kernel<3>); break;
    case 4: args(ladder_kernel<4>); break;
    case 5: args(ladder_kernel<5>); break;
    case 7: args(ladder_kernel<7>); break;
    case 8: args(ladder_kernel<8>); break;
    case 9: args(ladder_kernel<9>); break;
    case 19: args(ladder_kernel<19>); break;
    case 35: args(ladder_kernel<35>); break;
    case 65: args(ladder_kernel<65>); break;
    case 129: args(ladder_kernel<129>); break;
    case 71: args(ladder_kernel<71>); break;
    case 135: args(ladder_kernel<135>); break;
    default: args(ladder_kernel<15>); break;
  }
  if (combine == 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8);
  cfg.blockDim = dim3(128);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = combine == 2 ? 1 : 0;
  cudaLaunchKernelEx(&cfg, ladder_combine, static_cast<const float*>(o_part.data_ptr<float>()),
                     static_cast<const float*>(lse_part.data_ptr<float>()), int(splits),
                     reinterpret_cast<uint16_t*>(out.data_ptr()));
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
    p.add_argument("--ladder-splits", default="",
                   help="split counts (comma-separated) of the ablation ladder (ladder_kernel: the ring plus the decode kernel's math, "
                        "dependent start, epilogue and combine, one at a time); empty: off")
    p.add_argument("--split-only", action="store_true", help="only the split patterns (no plain or torch reads)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("read_ceiling_ext", cpp_sources="void read_all(torch::Tensor, torch::Tensor, int64_t, int64_t);\n"
                      "void read_split(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t, int64_t);\n"
                      "void read_ring(torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t, int64_t);\n"
                      "void read_ladder(torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, "
                      "torch::Tensor, torch::Tensor, int64_t, int64_t, int64_t);",
                      cuda_sources=KERNEL,
                      functions=["read_all", "read_split", "read_ring", "read_ladder"], extra_cuda_cflags=["-O3", "-arch=sm_90a"],
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
                        lambda x=x: ext.read_split(x, sink, heads, 16 * 8 // heads, splits, u, 0) for x in bufs])
                if heads > 1:
                    variants[f"split h{heads} s{splits} u{u} interleaved"] = (
                        lambda heads=heads, splits=splits, u=u: [
                            lambda x=x: ext.read_split(x, sink, heads, 16 * 8 // heads, splits, u, 1)
                            for x in bufs])
        # The decode kernel's load structure without math (ring_read): 8 heads, interleaved splits.
        for splits in [int(n) for n in a.ring_splits.split(",") if n]:
            for stages, bulk in ((3, 0), (2, 1), (3, 1), (4, 1), (6, 1)):
                variants[f"ring s{splits} st{stages} {'bulk' if bulk else 'cp.async'}"] = (
                    lambda splits=splits, stages=stages, bulk=bulk: [
                        lambda x=x: ext.read_ring(x, sink, 8, splits, stages, bulk) for x in bufs])
        # The ablation ladder (ladder_kernel): the ring plus the decode kernel's pieces, one at a time.
        for lsp in [int(n) for n in a.ladder_splits.split(",") if n]:
            ldr = [dict(q=torch.randn(8 * 8 * 128, device=dev).to(torch.bfloat16),
                        keys=torch.tensor([(nbytes // 2) // (8 * 256) // 64 * 64], dtype=torch.int32, device=dev),
                        o=torch.empty(lsp * 8 * 8 * 128, device=dev), lse=torch.empty(lsp * 8 * 8, device=dev),
                        out=torch.empty(8 * 8 * 128, dtype=torch.bfloat16, device=dev)) for _ in bufs]
            ladder = [("ring only", 0, 0), ("+ math", 1, 0), ("+ dependent start", 2, 0), ("+ epilogue", 4, 0),
                      ("+ setup chain", 8, 0), ("math + setup chain", 9, 0), ("math + dependent start", 3, 0),
                      ("math + epilogue", 5, 0), ("math + dep + epilogue", 7, 0),
                      ("math + dep + epilogue + setup", 15, 0), ("that + combine (plain launch)", 15, 1),
                      ("that + combine (PDL)", 15, 2), ("math + dep + epilogue + combine (PDL)", 7, 2),
                      ("math + dep + epilogue's stores only", 19, 0), ("math + dep + epilogue's merge only", 35, 0),
                      ("+ math but on the last block", 65, 0), ("+ math on the last block only", 129, 0),
                      ("math but last + dep + epilogue", 71, 0), ("math last only + dep + epilogue", 135, 0)]
            for lname, flags, comb in ladder:
                variants[f"ladder s{lsp} {lname}"] = (
                    lambda flags=flags, comb=comb: [
                        lambda x=x, d=d: ext.read_ladder(x, d["q"], d["keys"], d["o"], d["lse"], d["out"], sink, lsp,
                                                         flags, comb) for x, d in zip(bufs, ldr)])
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

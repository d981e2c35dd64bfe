// The backward's two memory-bound passes around the main kernel, one CTA per (query tile,
// query head, sequence):
//   preprocess:  D = rowsum(dO * O) and LSE * log2(e) into the tile's slots of the workspace
//                (+inf / 0 past the sequence and for rows with no keys, so the main kernel needs
//                no row guards), the tile's fp32 dQ accumulator zeroed, its semaphore reset.
//   postprocess: dQ = softmax_scale * accumulator, read in the dQ GEMM's register order
//                (the same partition the main kernel's consumers wrote it through).
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "common/softmax.h"
#include "sm90/bwd_epilogue.h"
#include "sm90/bwd_workspace.h"

namespace flashattn::sm90 {

// This CTA's query tile (blockIdx: query block, query head, sequence) and its workspace slot.
struct BwdRowTile {
  int h, b, row0;
  SeqBounds sb;
  int64_t tile;
  bool empty;  // the query block lies past its sequence

  __device__ static BwdRowTile of_block(const BwdParams& p, const BwdWorkspace& ws, int block_m) {
    BwdRowTile t;
    const int m_block = int(blockIdx.x);
    t.h = int(blockIdx.y);
    t.b = int(blockIdx.z);
    t.row0 = m_block * block_m;
    t.sb = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, t.b);
    t.empty = t.row0 >= t.sb.seqlen_q;
    t.tile = ws.tile(t.h, BwdWorkspace::packed_row0(t.sb, p.shape, t.b, p.cu_seqlens_q != nullptr), t.b, m_block,
                     block_m);
    return t;
  }
};

template <class Element, int kHeadDim, int kBlockM>
__global__ void __launch_bounds__(128) bwd_preprocess_kernel(const BwdParams p, const BwdWorkspace ws) {
  const BwdRowTile rt = BwdRowTile::of_block(p, ws, kBlockM);
  if (rt.empty) return;
  const int h = rt.h, b = rt.b, row0 = rt.row0;
  const SeqBounds& sb = rt.sb;
  const int64_t tile = rt.tile;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const Element* o = static_cast<const Element*>(p.o) + row_offset(p.o_stride, b, sb.q_offset, 0, h);
  const Element* dout = static_cast<const Element*>(p.dout) + row_offset(p.dout_stride, b, sb.q_offset, 0, h);
  // One warp per row, 2 elements (4 bytes) per lane per step.
  for (int r = warp; r < kBlockM; r += 4) {
    const int i = row0 + r;
    float d = 0.f, lse2 = INFINITY;
    if (i < sb.seqlen_q) {
      const Element* orow = o + int64_t(i) * p.o_stride.row;
      const Element* drow = dout + int64_t(i) * p.dout_stride.row;
      // Bounded by kHeadDim so the loop unrolls and its loads issue together (a runtime bound
      // measured 2-6% slower fwd+bwd at hdim 128, same-run A/B); the tensors' head dim (even) as a predicate.
      const int hd = p.shape.headdim;
#pragma unroll
      for (int c = 2 * lane; c < kHeadDim; c += 64) {
        if (c < hd) d += float(orow[c]) * float(drow[c]) + float(orow[c + 1]) * float(drow[c + 1]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
      const float lse = p.lse[sb.lse_offset + int64_t(h) * sb.lse_head_stride + i];
      lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;  // a row with no keys: P = 0
    }
    if (lane == 0) {
      ws.lse_log2[tile * kBlockM + r] = lse2;
      ws.dpsum[tile * kBlockM + r] = d;
    }
  }
  float4* acc = reinterpret_cast<float4*>(ws.dq_accum + tile * kBlockM * kHeadDim);
  for (int k = int(threadIdx.x); k < kBlockM * kHeadDim / 4; k += 128) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (ws.dq_semaphore != nullptr && threadIdx.x == 0) ws.dq_semaphore[tile] = 0;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumMmaThreads) bwd_postprocess_kernel(const BwdParams p,
                                                                                  const BwdWorkspace ws) {
  using namespace cute;
  constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim;
  const BwdRowTile rt = BwdRowTile::of_block(p, ws, kBlockM);
  if (rt.empty) return;
  const int h = rt.h, b = rt.b, row0 = rt.row0;
  const SeqBounds& sb = rt.sb;
  const int64_t tile = rt.tile;
  const int tidx = int(threadIdx.x);

  typename Traits::TiledMmadQ mma;
  auto thr_mma = mma.get_thread_slice(tidx);
  Tensor acc = partition_fragment_C(mma, cute::Shape<Int<kBlockM>, Int<kD>>{});
  Tensor gacc = make_tensor(make_gmem_ptr(ws.dq_accum + tile * kBlockM * kD), typename Traits::SmemLayoutdQacc{});
  auto thr_copy = typename Traits::R2SCopydQacc{}.get_thread_slice(tidx);
  copy(thr_copy.partition_D(gacc), thr_copy.retile_S(acc));

  Tensor cdQ = thr_mma.partition_C(make_identity_tensor(cute::Shape<Int<kBlockM>, Int<kD>>{}));
  using Element = typename Traits::Element;
  Element* out = static_cast<Element*>(p.dq) + row_offset(p.dq_stride, b, sb.q_offset, row0, h);
  store_rows(out, p.dq_stride.row, sb.seqlen_q - row0, p.shape.headdim, make_tensor(acc.data(), acc_rowcol(acc.layout())),
             make_tensor(cdQ.data(), acc_rowcol(cdQ.layout())), p.mask.softmax_scale);
}

}  // namespace flashattn::sm90

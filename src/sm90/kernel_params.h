// Kernel parameters (passed as __grid_constant__ so the TMA descriptors stay in param space)
// and the per-tile problem that the producer and the consumers derive identically.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "common/mask.h"
#include "common/params.h"
#include "sm90/tile_scheduler.h"

namespace flashattn::sm90 {

// Global tensors as TMA sees them: (seqlen, head dim, head, batch). Varlen: (total, d, h, 1),
// with each sequence's first row added as a coordinate offset.
using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using StrideQKV = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;

// A dimension of extent 1 is never stepped over, and the API only validates the strides of
// dimensions longer than 1; give TMA a legal (16-byte multiple) stride there.
inline int64_t tma_stride(int64_t extent, int64_t stride) { return extent <= 1 ? 8 : stride; }

template <class Traits>
struct TmaTypes {
  using Element = typename Traits::Element;
  using GmemTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)),
                                                ShapeQKV{}, StrideQKV{}));
  using Q = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(typename Traits::SmemLayoutQ{}),
      cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDim>>{}, cute::_1{}));
  using KV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(typename Traits::SmemLayoutK{}),
      cute::Shape<cute::Int<Traits::kBlockN>, cute::Int<Traits::kHeadDim>>{}, cute::_1{}));
  using OutTensor = decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{},
                                               StrideQKV{}));
  // One consumer warpgroup's 64 x head-dim slice of O.
  using O = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{}, OutTensor{}, cute::take<0, 2>(typename Traits::SmemLayoutO{}),
      cute::Shape<cute::_64, cute::Int<Traits::kHeadDim>>{}, cute::_1{}));
};

template <class Traits>
struct KernelParams {
  typename TmaTypes<Traits>::Q tma_q;
  typename TmaTypes<Traits>::KV tma_k;
  typename TmaTypes<Traits>::KV tma_v;
  typename TmaTypes<Traits>::O tma_o;
  ShapeQKV shape_q;  // also O's
  ShapeQKV shape_k;
  FwdParams fwd;  // o, lse, strides, cu_seqlens, mask options
  TileScheduler scheduler;
  int pingpong;                 // ablation switches, read once per CTA
  int intra_warpgroup_overlap;
};

// One tile's problem: where the sequence lives, its mask and the key blocks to visit.
struct TileWork {
  SeqBounds seq;
  Mask mask;
  int n_begin, n_end;  // key blocks [n_begin, n_end); the loop runs from n_end - 1 down
  bool has_rows;       // some query row of the tile exists (else: nothing to do at all)

  __device__ bool empty() const { return n_end <= n_begin; }
};

template <class Traits>
__device__ __forceinline__ TileWork make_tile_work(const FwdParams& p, const TileCoord& t) {
  TileWork w;
  w.seq = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, t.batch);
  w.mask = make_mask(p.mask, w.seq);
  w.has_rows = t.m_block * Traits::kBlockM < w.seq.seqlen_q;
  w.n_begin = w.n_end = 0;
  if (w.has_rows && w.seq.seqlen_k > 0)
    w.mask.key_block_range(t.m_block * Traits::kBlockM, Traits::kBlockM, Traits::kBlockN, &w.n_begin, &w.n_end);
  return w;
}

}  // namespace flashattn::sm90

// What the stages of the forward share (the backward reuses the first part):
//   - global tensors as TMA sees them: (rows, head dim, head, batch), and how the host builds
//     such a view from a FwdParams tensor (each stage's to_params() encodes its own TMA
//     descriptors from it: producer.h for Q/K/V, epilogue.h for O);
//   - the per-tile problem (TileWork) that the producer and the consumers derive identically.
// The kernel's parameter block itself is composed in kernel.h from the stages' Params.
#pragma once

#include <initializer_list>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "common/fp8_scales.h"
#include "common/mask.h"
#include "common/params.h"
#include "common/score_mods.h"
#include "sm90/tile_scheduler.h"

namespace flashattn::sm90 {

// Global tensors as TMA sees them: (seqlen, head dim, head, batch). Varlen: (total, d, h, 1),
// with each sequence's first row added as a coordinate offset.
using ShapeQKV = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using StrideQKV = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;

// A dimension of extent 1 is never stepped over, and the API only validates the strides of
// dimensions longer than 1; give TMA a legal (16-byte multiple) stride there: 16 elements, for
// 1-byte (FP8) elements too.
inline int64_t tma_stride(int64_t extent, int64_t stride) { return extent <= 1 ? 16 : stride; }

// The extents TMA sees for a forward or backward problem (varlen: the packed rows, one batch).
struct TmaExtents {
  int rows_q, rows_k, batch;
  template <class Problem>
  static TmaExtents of(const Problem& f) {
    const bool varlen = f.cu_seqlens_q != nullptr;
    return {varlen ? f.shape.total_q : f.shape.seqlen_q, varlen ? f.shape.total_k : f.shape.seqlen_k,
            varlen ? 1 : f.shape.batch};
  }
};

// Host: a (rows, d, heads, batch) view of a [b, s, h, d] tensor for make_tma_copy. Element is
// const for the loads (Q, K, V) and not for the store (O).
template <class Element>
auto tma_gmem_tensor(Element* ptr, int rows, int d, int heads, int batch, const RowStrides& st) {
  using namespace cute;
  ShapeQKV shape(rows, d, heads, batch);
  StrideQKV stride(tma_stride(rows, st.row), _1{}, tma_stride(heads, st.head), tma_stride(batch, st.batch));
  return make_tensor(make_gmem_ptr(ptr), make_layout(shape, stride));
}
// Host: the name of the first operand with a zero stride on a dimension TMA steps over (a
// broadcast tensor: the sm80 path takes it), or null when every one can be a TMA operand.
struct TmaOperand {
  const char* name;
  const RowStrides& stride;
  int rows, heads;
};
inline const char* tma_broadcast_operand(std::initializer_list<TmaOperand> ops, int batch) {
  for (const TmaOperand& x : ops)
    if ((x.rows > 1 && x.stride.row == 0) || (x.heads > 1 && x.stride.head == 0) || (batch > 1 && x.stride.batch == 0))
      return x.name;
  return nullptr;
}

template <class Element>
using TmaGmemTensor = decltype(tma_gmem_tensor(static_cast<Element*>(nullptr), 0, 0, 0, 0, RowStrides{}));

// FP8: the scales of one (sequence, head): Q's of its query head, K's and V's of its KV head
// (common/fp8_scales.h has the layout). The kernel reads one per warpgroup of query rows and
// one per key tile (launch.cu checks that the block sizes make that exact).
struct Fp8TileScales {
  const float* q;
  const float* k;
  const float* v;
  int q_block, k_block;  // rows per scale block
  int q_last;            // Q's last scale block: a warpgroup's first row may lie past the sequence's end
  __device__ float q_at(int row) const { return q[min(row / q_block, q_last)]; }
  // K's and V's: mainloop.h walks k and v by key block (Mainloop::next_scales).

  __device__ static Fp8TileScales make(const Fp8Scales& f, const flashattn::Shape& s, int batch, int head) {
    const int64_t kv = int64_t(batch) * s.nheads_kv + s.kv_head(head);
    return {f.q + (int64_t(batch) * s.nheads_q + head) * f.q_blocks, f.k + kv * f.k_blocks, f.v + kv * f.k_blocks,
            f.q_block_size, f.k_block_size, f.q_blocks - 1};
  }
};

// One tile's problem: where the sequence lives, its mask and the key blocks to visit.
struct TileWork {
  SeqBounds seq;
  Mask mask;
  int n_begin, n_end;  // key blocks [n_begin, n_end); the loop runs from n_end - 1 down
  bool has_rows;       // some query row of the tile exists (else: nothing to do at all)
  ScoreMods mods;      // ALiBi and dropout of (batch, head); the producer leaves it unused
  Fp8TileScales fp8;   // FP8 kernels only

  __device__ bool empty() const { return n_end <= n_begin; }
};

template <class Traits>
__device__ __forceinline__ TileWork make_tile_work(const FwdParams& p, const TileCoord& t) {
  TileWork w;
  w.seq = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, t.batch);
  w.mask = make_mask(p.mask, w.seq);
  w.has_rows = t.m_block * Traits::kBlockM < w.seq.seqlen_q;
  w.mods = ScoreMods::make(p, ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap), w.seq, t.batch, t.head);
  if constexpr (Traits::kFp8) w.fp8 = Fp8TileScales::make(p.fp8, p.shape, t.batch, t.head);
  w.n_begin = w.n_end = 0;
  if (w.has_rows && w.seq.seqlen_k > 0)
    w.mask.key_block_range(t.m_block * Traits::kBlockM, Traits::kBlockM, Traits::kBlockN, &w.n_begin, &w.n_end);
  return w;
}

}  // namespace flashattn::sm90

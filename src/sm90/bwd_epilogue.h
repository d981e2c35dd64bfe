// Backward epilogue: dK (times the softmax scale) and dV of the CTA's key block, from the
// consumers' registers straight to global memory with a row bound (keys past seqlen_k, or of
// the next varlen sequence, are never written). Key blocks no query reaches store zeros.
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "sm90/softmax.h"

namespace flashattn::sm90 {

// acc (rowcol view, fp32) * scale -> rows [0, row_limit) of `out` (row-major, head dim
// contiguous): each quad writes 2 adjacent columns (4 bytes) per column group.
template <class Element, class TensorAcc, class TensorCoord>
__device__ __forceinline__ void store_rows(Element* out, int64_t row_stride, int row_limit, const TensorAcc& acc,
                                           const TensorCoord& coord, float scale) {
  using namespace cute;
#pragma unroll
  for (int r = 0; r < size<0>(acc); ++r) {
    const int i = get<0>(coord(r, 0));
    if (i >= row_limit) continue;
    Element* orow = out + int64_t(i) * row_stride;
#pragma unroll
    for (int c = 0; c < size<1>(acc); c += 2) {  // (c, c+1) are adjacent columns
      const uint32_t lo = Element(acc(r, c) * scale).raw(), hi = Element(acc(r, c + 1) * scale).raw();
      *reinterpret_cast<uint32_t*>(orow + get<1>(coord(r, c))) = lo | (hi << 16);
    }
  }
}

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;

  struct Params {
    void* dk;
    void* dv;
    RowStrides dk_stride, dv_stride;
    float softmax_scale;
  };
  static Params to_params(const BwdParams& p) { return {p.dk, p.dv, p.dk_stride, p.dv_stride, p.mask.softmax_scale}; }

  template <class TensorAcc>
  __device__ static void store(const Params& ep, const SeqBounds& seq, int n_block, int kv_head, int batch,
                               const TensorAcc& dk, const TensorAcc& dv, int mma_tidx) {
    using namespace cute;
    typename Traits::TiledMmadKV mma;
    Tensor cKV = mma.get_thread_slice(mma_tidx).partition_C(make_identity_tensor(cute::Shape<Int<kBlockN>, Int<kD>>{}));
    Tensor coord = make_tensor(cKV.data(), acc_rowcol(cKV.layout()));
    const int row0 = n_block * kBlockN;
    const int rows = seq.seqlen_k - row0;
    Element* dk_out = static_cast<Element*>(ep.dk) + row_offset(ep.dk_stride, batch, seq.k_offset, row0, kv_head);
    Element* dv_out = static_cast<Element*>(ep.dv) + row_offset(ep.dv_stride, batch, seq.k_offset, row0, kv_head);
    store_rows(dk_out, ep.dk_stride.row, rows, make_tensor(dk.data(), acc_rowcol(dk.layout())), coord, ep.softmax_scale);
    store_rows(dv_out, ep.dv_stride.row, rows, make_tensor(dv.data(), acc_rowcol(dv.layout())), coord, 1.f);
  }
};

}  // namespace flashattn::sm90

// Epilogue of one tile: O *= 1/l, then O and LSE to global memory. Stores go straight from
// the accumulator registers with a row bound check, which covers partial tiles, varlen and
// strided outputs uniformly: each quad writes 16 contiguous bytes of a row per column group.
// Rows >= seqlen_q are never written; an empty row gets O = 0 and LSE = -inf.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/kernel_params.h"
#include "sm90/softmax.h"

namespace flashattn::sm90 {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim;

  template <class TensorO, class Softmax>
  __device__ static void store(const FwdParams& p, const TileCoord& t, const TileWork& w, TensorO& tOrO,
                               Softmax& sm, int mma_tidx) {
    using namespace cute;
    constexpr int kRows = sizeof(sm.row) / sizeof(sm.row[0]);
    float inv[kRows], lse[kRows];
    sm.finalize(inv, lse);
    Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    rescale_rows(o, inv);

    typename Traits::TiledMmaPV mma_pv;
    Tensor tOcO = mma_pv.get_thread_slice(mma_tidx).partition_C(make_identity_tensor(cute::Shape<cute::Int<kBlockM>, Int<kD>>{}));
    Tensor cO = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    Element* out = static_cast<Element*>(p.o) + row_offset(p.o_stride, t.batch, w.seq.q_offset, 0, t.head);
    const int row0 = t.m_block * kBlockM;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = row0 + get<0>(cO(r, 0));
      if (i >= w.seq.seqlen_q) continue;
      Element* orow = out + int64_t(i) * p.o_stride.row;
#pragma unroll
      for (int c = 0; c < size<1>(o); c += 2) {  // (c, c+1) are adjacent columns
        const uint32_t lo = Element(o(r, c)).raw(), hi = Element(o(r, c + 1)).raw();
        *reinterpret_cast<uint32_t*>(orow + get<1>(cO(r, c))) = lo | (hi << 16);
      }
      if (p.lse != nullptr && (mma_tidx % 4) == 0)
        p.lse[w.seq.lse_offset + int64_t(t.head) * w.seq.lse_head_stride + i] = lse[r];
    }
  }
};

}  // namespace flashattn::sm90

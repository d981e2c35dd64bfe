// Backward epilogue: dK (times the softmax scale) and dV of the CTA's key block. Registers ->
// smem (stmatrix, into K's and V's bytes, free once every consumer is past the mainloop) ->
// one TMA store each, which clips rows past seqlen_k. A varlen block that ends past its
// sequence is stored from registers with a row bound instead (the TMA tensor is the packed
// one: it would write the next sequence's rows). Key blocks no query reaches store zeros.
#pragma once

#include <cute/tensor.hpp>

#include "common/params.h"
#include "sm90/bwd_shapes.h"
#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/softmax.h"
#include "sm90/warp_uniform.h"

namespace flashattn::sm90 {

// acc (rowcol view, fp32) * scale -> rows [0, row_limit) of `out` (row-major, head dim
// contiguous): each quad writes 2 adjacent columns (4 bytes) per column group.
template <class Element, class TensorAcc, class TensorCoord>
__device__ __forceinline__ void store_rows(Element* out, int64_t row_stride, int row_limit, int col_limit,
                                           const TensorAcc& acc, const TensorCoord& coord, float scale) {
  using namespace cute;
#pragma unroll
  for (int r = 0; r < size<0>(acc); ++r) {
    const int i = get<0>(coord(r, 0));
    if (i >= row_limit) continue;
    Element* orow = out + int64_t(i) * row_stride;
#pragma unroll
    for (int c = 0; c < size<1>(acc); c += 2) {  // (c, c+1) are adjacent columns; col_limit is even
      if (get<1>(coord(r, c)) >= col_limit) continue;
      const uint32_t lo = Element(acc(r, c) * scale).raw(), hi = Element(acc(r, c + 1) * scale).raw();
      *reinterpret_cast<uint32_t*>(orow + get<1>(coord(r, c))) = lo | (hi << 16);
    }
  }
}

template <class Traits>
struct BwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  // (kBlockN, d), swizzled so each warpgroup's column slice (kDkvN wide) is whole atoms.
  using SmemLayoutdKV = decltype(cute::tile_to_shape(typename Traits::template AtomK<kBlockN, Traits::kDkvN>{},
                                                     cute::Shape<cute::Int<kBlockN>, cute::Int<Traits::kHeadDim>>{}));
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kD>>;
  static auto make_tma_store(const TmaGmemTensor<Element>& g) {
    return cute::make_tma_copy(cute::SM90_TMA_STORE{}, g, SmemLayoutdKV{}, TileKV{}, cute::_1{});
  }
  using TmaStore = decltype(make_tma_store(TmaGmemTensor<Element>{}));

  struct TensorStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdKV>, 1024> dk;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdKV>, 1024> dv;
  };

  struct Params {
    TmaStore tma_dk, tma_dv;
    ShapeQKV shape_k;
    void* dk;
    void* dv;
    RowStrides dk_stride, dv_stride;
    float softmax_scale;
    int headdim;  // the tensors' (<= kD)
    bool varlen;
  };
  static Params to_params(const BwdParams& p) {
    const Shape& s = p.shape;
    const TmaExtents e = TmaExtents::of(p);
    auto gmem = [&](void* ptr, const RowStrides& st) {
      return tma_gmem_tensor(static_cast<Element*>(ptr), e.rows_k, s.headdim, s.nheads_kv, e.batch, st);  // clips
    };
    return {make_tma_store(gmem(p.dk, p.dk_stride)), make_tma_store(gmem(p.dv, p.dv_stride)),
            ShapeQKV(e.rows_k, s.headdim, s.nheads_kv, e.batch), p.dk, p.dv, p.dk_stride, p.dv_stride,
            p.mask.softmax_scale, s.headdim, p.cu_seqlens_k != nullptr};
  }

  template <class TensorAcc>
  __device__ static void store(const Params& ep, TensorStorage& ts, const SeqBounds& seq, int n_block, int kv_head,
                               int batch, const TensorAcc& dk, const TensorAcc& dv, int mma_tidx) {
    using namespace cute;
    typename Traits::TiledMmadKV mma;
    const int row0 = n_block * kBlockN;
    if (ep.varlen && row0 + kBlockN > seq.seqlen_k) {
      Tensor cKV = mma.get_thread_slice(mma_tidx).partition_C(make_identity_tensor(TileKV{}));
      Tensor coord = make_tensor(cKV.data(), acc_rowcol(cKV.layout()));
      const int rows = seq.seqlen_k - row0;
      Element* dk_out = static_cast<Element*>(ep.dk) + row_offset(ep.dk_stride, batch, seq.k_offset, row0, kv_head);
      Element* dv_out = static_cast<Element*>(ep.dv) + row_offset(ep.dv_stride, batch, seq.k_offset, row0, kv_head);
      store_rows(dk_out, ep.dk_stride.row, rows, ep.headdim, make_tensor(dk.data(), acc_rowcol(dk.layout())), coord,
                 ep.softmax_scale);
      store_rows(dv_out, ep.dv_stride.row, rows, ep.headdim, make_tensor(dv.data(), acc_rowcol(dv.layout())), coord,
                 1.f);
      return;
    }
    named_barrier_sync(kBwdBarrierEpilogue, Traits::kNumMmaThreads);  // K and V no longer read
    Tensor sdK = make_tensor(make_smem_ptr(ts.dk.data()), SmemLayoutdKV{});
    Tensor sdV = make_tensor(make_smem_ptr(ts.dv.data()), SmemLayoutdKV{});
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    auto thr = r2s.get_thread_slice(mma_tidx);
    Tensor rdK = make_tensor_like<Element>(dk);
    Tensor rdV = make_tensor_like<Element>(dv);
#pragma unroll
    for (int i = 0; i < size(dk); ++i) {
      rdK(i) = Element(dk(i) * ep.softmax_scale);
      rdV(i) = Element(dv(i));
    }
    copy(r2s, thr.retile_S(rdK), thr.partition_D(sdK));
    copy(r2s, thr.retile_S(rdV), thr.partition_D(sdV));
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to TMA
    named_barrier_sync(kBwdBarrierEpilogue, Traits::kNumMmaThreads);
    // One elected lane of the first consumer warp issues and waits on the stores (warp_uniform.h).
    if (elected_lane(warp_uniform(mma_tidx / 32) == 0)) {
      const int b = ep.varlen ? 0 : batch;
      const auto origin = make_coord(int32_t(seq.k_offset), _0{});
      Tensor gdK = local_tile(domain_offset(origin, ep.tma_dk.get_tma_tensor(ep.shape_k)(_, _, kv_head, b)), TileKV{},
                              make_coord(n_block, _0{}));
      Tensor gdV = local_tile(domain_offset(origin, ep.tma_dv.get_tma_tensor(ep.shape_k)(_, _, kv_head, b)), TileKV{},
                              make_coord(n_block, _0{}));
      auto tK = tma_partition(ep.tma_dk, _0{}, Layout<_1>{}, group_modes<0, 2>(sdK), group_modes<0, 2>(gdK));
      auto tV = tma_partition(ep.tma_dv, _0{}, Layout<_1>{}, group_modes<0, 2>(sdV), group_modes<0, 2>(gdV));
      copy(ep.tma_dk, get<1>(tK), get<0>(tK));
      copy(ep.tma_dv, get<1>(tV), get<0>(tV));
      tma_store_arrive();
      tma_store_wait<0>();  // smem must outlive the stores' reads
    }
  }

  __device__ static void prefetch_descriptors(const Params& ep) {
    cute::prefetch_tma_descriptor(ep.tma_dk.get_tma_descriptor());
    cute::prefetch_tma_descriptor(ep.tma_dv.get_tma_descriptor());
  }
};

}  // namespace flashattn::sm90

// Epilogue of one tile: O *= 1/l, LSE, and O to global memory through shared memory with a
// TMA store (FA3 Algorithm 1, last lines). Per consumer warpgroup, independently of the others:
//   1. its previous store has finished reading its smem slice;
//   2. registers -> smem (stmatrix, swizzled like Q), fence to the async proxy, barrier;
//   3. one thread issues the TMA store of the 64 x d slice; TMA clips rows >= seqlen_q.
// Stored straight from registers with a row bound check instead: a varlen slice that runs past
// its sequence (the TMA tensor is the packed one: it would clobber the next sequence's rows),
// tiles with no keys (O = 0, LSE = -inf), and hdim 192/256, which have no smem for O
// (tile_shapes.h says why).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>  // fence_view_async_shared

#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/softmax.h"

namespace flashattn::sm90 {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim;

  template <class TensorO, class Softmax>
  __device__ static void store(const KernelParams<Traits>& kp, Element* smem_o, const TileCoord& t, const TileWork& w,
                               TensorO& tOrO, Softmax& sm, int mma_tidx) {
    using namespace cute;
    const FwdParams& p = kp.fwd;
    constexpr int kRows = sizeof(sm.row) / sizeof(sm.row[0]);
    float inv[kRows], lse[kRows];
    sm.finalize(inv, lse);
    Tensor o = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    rescale_rows(o, inv);

    typename Traits::TiledMmaPV mma_pv;
    Tensor tOcO = mma_pv.get_thread_slice(mma_tidx).partition_C(make_identity_tensor(cute::Shape<Int<kBlockM>, Int<kD>>{}));
    Tensor cO = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
    const int row0 = t.m_block * kBlockM;
    if (p.lse != nullptr && (mma_tidx % 4) == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int i = row0 + get<0>(cO(r, 0));
        if (i < w.seq.seqlen_q) p.lse[w.seq.lse_offset + int64_t(t.head) * w.seq.lse_head_stride + i] = lse[r];
      }
    }

    if constexpr (Traits::kTmaStoreO) {
      const int wg = mma_tidx / 128;
      const bool varlen = p.cu_seqlens_q != nullptr;
      if (!w.empty() && (!varlen || row0 + wg * 64 + 64 <= w.seq.seqlen_q)) {
        store_tma(kp, smem_o, t, w, tOrO, mma_tidx);
        return;
      }
    }
    store_direct(p, t, w, o, cO, row0);
  }

  // Before the CTA exits: smem must outlive the reads of the last TMA store.
  __device__ static void finish(int mma_tidx) {
    if (mma_tidx % 128 == 0) cute::tma_store_wait<0>();
  }

 private:
  template <class TensorO>
  __device__ static void store_tma(const KernelParams<Traits>& kp, Element* smem_o, const TileCoord& t,
                                   const TileWork& w, TensorO& tOrO, int mma_tidx) {
    using namespace cute;
    const int wg = mma_tidx / 128;
    const bool leader = mma_tidx % 128 == 0;
    typename Traits::TiledMmaPV mma_pv;
    if (leader) tma_store_wait<0>();  // this warpgroup's previous store has read its slice
    named_barrier_sync(kBarrierEpilogueBase + wg, 128);

    Tensor sO = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutOTile{});  // (kBlockM, d)
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr = r2s.get_thread_slice(mma_tidx);
    Tensor tOrOe = make_tensor_like<Element>(tOrO);
    convert_fragment(tOrO, tOrOe);
    copy(r2s, thr.retile_S(tOrOe), thr.partition_D(sO));
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to TMA
    named_barrier_sync(kBarrierEpilogueBase + wg, 128);
    if (leader) {
      const int b = kp.fwd.cu_seqlens_q != nullptr ? 0 : t.batch;
      Tensor mO = kp.tma_o.get_tma_tensor(kp.shape_q);
      Tensor gO = local_tile(domain_offset(make_coord(int32_t(w.seq.q_offset), _0{}), mO(_, _, t.head, b)),
                             cute::Shape<_64, Int<kD>>{}, make_coord(t.m_block * Traits::kNumMmaWG + wg, _0{}));
      Tensor sOwg = make_tensor(make_smem_ptr(smem_o), typename Traits::SmemLayoutO{})(_, _, wg);
      auto tO = tma_partition(kp.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOwg), group_modes<0, 2>(gO));
      copy(kp.tma_o, get<1>(tO), get<0>(tO));
      tma_store_arrive();
    }
  }

  // Each quad writes 16 contiguous bytes of a row per column group; rows >= seqlen_q are skipped.
  template <class TensorO, class TensorC>
  __device__ static void store_direct(const FwdParams& p, const TileCoord& t, const TileWork& w, TensorO& o,
                                      const TensorC& cO, int row0) {
    using namespace cute;
    Element* out = static_cast<Element*>(p.o) + row_offset(p.o_stride, t.batch, w.seq.q_offset, 0, t.head);
#pragma unroll
    for (int r = 0; r < size<0>(o); ++r) {
      const int i = row0 + get<0>(cO(r, 0));
      if (i >= w.seq.seqlen_q) continue;
      Element* orow = out + int64_t(i) * p.o_stride.row;
#pragma unroll
      for (int c = 0; c < size<1>(o); c += 2) {  // (c, c+1) are adjacent columns
        const uint32_t lo = Element(o(r, c)).raw(), hi = Element(o(r, c + 1)).raw();
        *reinterpret_cast<uint32_t*>(orow + get<1>(cO(r, c))) = lo | (hi << 16);
      }
    }
  }
};

}  // namespace flashattn::sm90

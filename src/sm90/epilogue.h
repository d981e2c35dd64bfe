// Epilogue of one tile: O *= 1/l, LSE, and O to global memory through shared memory with a
// TMA store (FA3 Algorithm 1, last lines). Per consumer warpgroup, independently of the others:
//   1. its previous store has finished reading its smem slice;
//   2. registers -> smem (stmatrix, swizzled like Q), fence to the async proxy, barrier;
//   3. one thread issues the TMA store of the 64 x d slice; TMA clips rows >= seqlen_q.
// Stored straight from registers with a row bound check instead: a varlen slice that runs past
// its sequence (the TMA tensor is the packed one: it would clobber the next sequence's rows),
// tiles with no keys (O = 0, LSE = -inf), and hdim 192/256, which have no smem for O
// (OStaging says why).
// The epilogue owns O's staging: its smem layout and buffer (SharedStorage), its TMA
// descriptor (Params) and the host function that builds it (to_params).
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>  // fence_view_async_shared

#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/softmax.h"
#include "sm90/warp_uniform.h"

namespace flashattn::sm90 {

// O staging for the TMA store: one 64-row slice per consumer warpgroup, each contiguous, so
// a warpgroup stores its rows as soon as they are ready (the warpgroups finish apart).
// Only where it fits beside Q and 2 stages of K and V (hdim <= 128 with 128-key blocks). At hdim 192/256 FA3
// stages O in V's bytes; that measured 6-11% slower here than storing O from registers
// (same-run A/B, docs/perf-notes.md v5), so those head dims store from registers.
template <class Traits>
struct OStaging {
  static constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim, kNumMmaWG = Traits::kNumMmaWG;
  using SmemLayoutO = decltype(cute::tile_to_shape(
      typename Traits::SmemAtomO{}, cute::Shape<cute::_64, cute::Int<kD>, cute::Int<kNumMmaWG>>{}));
  // The same bytes as the (kBlockM, head dim) tile that the PV accumulator partitions.
  using SmemLayoutOTile = decltype(cute::composition(
      SmemLayoutO{},
      cute::make_layout(cute::Shape<cute::Shape<cute::_64, cute::Int<kNumMmaWG>>, cute::Int<kD>>{},
                        cute::Stride<cute::Stride<cute::_1, cute::Int<64 * kD>>, cute::_64>{})));
  static constexpr int kBytesO = kBlockM * kD * int(sizeof(typename Traits::ElementOut));
  static constexpr bool kTmaStoreO =
      Traits::kStagesQ * Traits::kBytesQ + Traits::kBytesKVStages + kBytesO <= Traits::kSmemLimit;
};

// O's TMA store, one consumer warpgroup's 64 x head-dim slice: the one place it is written;
// Epilogue::Params' member type is what this returns.
template <class Traits, class GmemTensor>
auto make_tma_store_o(const GmemTensor& g) {
  using namespace cute;
  return make_tma_copy(SM90_TMA_STORE{}, g, take<0, 2>(typename OStaging<Traits>::SmemLayoutO{}),
                       cute::Shape<_64, Int<Traits::kHeadDim>>{}, _1{});
}

template <class Traits>
struct Epilogue {
  using Element = typename Traits::ElementOut;  // O's type (16-bit; FP8 inputs write 16-bit too)
  using Staging = OStaging<Traits>;
  static constexpr int kBlockM = Traits::kBlockM, kD = Traits::kHeadDim;
  static constexpr bool kTmaStoreO = Staging::kTmaStoreO;

  // 1024-byte alignment: TMA and the swizzle assume phase 0 at the start of the buffer.
  struct StagedStorage {
    cute::array_aligned<Element, cute::cosize_v<typename Staging::SmemLayoutO>, 1024> smem_o;
    __device__ Element* o() { return smem_o.data(); }
  };
  struct NoStorage {  // hdim 192/256: O goes from registers to global memory
    __device__ Element* o() { return nullptr; }
  };
  using SharedStorage = std::conditional_t<kTmaStoreO, StagedStorage, NoStorage>;

  using TmaO = decltype(make_tma_store_o<Traits>(std::declval<TmaGmemTensor<Element>>()));
  struct Params {
    TmaO tma_o;  // encoded only where kTmaStoreO
    ShapeQKV shape_o;
  };

  static Params to_params(const FwdParams& f) {
    const TmaExtents e = TmaExtents::of(f);
    Params p{};
    // O's own head dim (<= kD): the TMA store clips the columns past it.
    p.shape_o = ShapeQKV(e.rows_q, f.shape.headdim, f.shape.nheads_q, e.batch);
    if constexpr (kTmaStoreO)  // hdim 192/256 store O from registers: no descriptor to encode
      p.tma_o = make_tma_store_o<Traits>(tma_gmem_tensor(static_cast<Element*>(f.o), e.rows_q, f.shape.headdim,
                                                         f.shape.nheads_q, e.batch, f.o_stride));
    return p;
  }

  template <class TensorO, class Softmax>
  __device__ static void store(const Params& ep, const FwdParams& p, SharedStorage& ss, const TileCoord& t,
                               const TileWork& w, TensorO& tOrO, Softmax& sm, float o_scale, int mma_tidx) {
    using namespace cute;
    constexpr int kRows = sizeof(sm.row) / sizeof(sm.row[0]);
    float inv[kRows], lse[kRows];
    sm.finalize(inv, lse);
    if (w.mods.dropout()) {  // kept entries of P are 1 / keep probability (common/dropout.h)
#pragma unroll
      for (int r = 0; r < kRows; ++r) inv[r] *= p.dropout.scale;
    }
    if constexpr (Traits::kFp8) {  // the last V block's scale (mainloop.h o_scale)
#pragma unroll
      for (int r = 0; r < kRows; ++r) inv[r] *= o_scale;
    }
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

    if constexpr (kTmaStoreO) {
      const int wg = warpgroup_of(mma_tidx);
      const bool varlen = p.cu_seqlens_q != nullptr;
      if (!w.empty() && (!varlen || row0 + wg * 64 + 64 <= w.seq.seqlen_q)) {
        store_tma(ep, p, ss.o(), t, w, tOrO, mma_tidx);
        return;
      }
    }
    store_direct(p, t, w, o, cO, row0);
  }

  // Before the CTA exits: smem must outlive the reads of the last TMA store.
  __device__ static void finish(int mma_tidx) {
    if (is_store_leader(mma_tidx)) cute::tma_store_wait<0>();
  }

 private:
  // The TMA-store thread of a warpgroup: one elected lane of its first warp (warp_uniform.h).
  __device__ static int warpgroup_of(int mma_tidx) { return warp_uniform(mma_tidx / 128); }
  __device__ static bool is_store_leader(int mma_tidx) { return elected_lane(warp_uniform(mma_tidx % 128 / 32) == 0); }

  template <class TensorO>
  __device__ static void store_tma(const Params& ep, const FwdParams& p, Element* smem_o, const TileCoord& t,
                                   const TileWork& w, TensorO& tOrO, int mma_tidx) {
    using namespace cute;
    const int wg = warpgroup_of(mma_tidx);
    const bool leader = is_store_leader(mma_tidx);
    typename Traits::TiledMmaPV mma_pv;
    if (leader) tma_store_wait<0>();  // this warpgroup's previous store has read its slice
    named_barrier_sync(kBarrierEpilogueBase + wg, 128);

    Tensor sO = make_tensor(make_smem_ptr(smem_o), typename Staging::SmemLayoutOTile{});  // (kBlockM, d)
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr = r2s.get_thread_slice(mma_tidx);
    Tensor tOrOe = make_tensor_like<Element>(tOrO);
    convert_fragment(tOrO, tOrOe);
    copy(r2s, thr.retile_S(tOrOe), thr.partition_D(sO));
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to TMA
    named_barrier_sync(kBarrierEpilogueBase + wg, 128);
    if (leader) {
      const int b = p.cu_seqlens_q != nullptr ? 0 : t.batch;
      Tensor mO = ep.tma_o.get_tma_tensor(ep.shape_o);
      Tensor gO = local_tile(domain_offset(make_coord(int32_t(w.seq.q_offset), _0{}), mO(_, _, t.head, b)),
                             cute::Shape<_64, Int<kD>>{}, make_coord(t.m_block * Traits::kNumMmaWG + wg, _0{}));
      Tensor sOwg = make_tensor(make_smem_ptr(smem_o), typename Staging::SmemLayoutO{})(_, _, wg);
      auto tO = tma_partition(ep.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOwg), group_modes<0, 2>(gO));
      copy(ep.tma_o, get<1>(tO), get<0>(tO));
      tma_store_arrive();
    }
  }

  // Each quad writes 16 contiguous bytes of a row per column group; rows >= seqlen_q and
  // columns >= the tensor's head dim (a smaller head dim on this kernel) are skipped.
  template <class TensorO, class TensorC>
  __device__ static void store_direct(const FwdParams& p, const TileCoord& t, const TileWork& w, TensorO& o,
                                      const TensorC& cO, int row0) {
    using namespace cute;
    Element* out = static_cast<Element*>(p.o) + row_offset(p.o_stride, t.batch, w.seq.q_offset, 0, t.head);
    const int d = p.shape.headdim;
#pragma unroll
    for (int r = 0; r < size<0>(o); ++r) {
      const int i = row0 + get<0>(cO(r, 0));
      if (i >= w.seq.seqlen_q) continue;
      Element* orow = out + int64_t(i) * p.o_stride.row;
#pragma unroll
      for (int c = 0; c < size<1>(o); c += 2) {  // (c, c+1) are adjacent columns; d is even
        if (get<1>(cO(r, c)) >= d) continue;
        const uint32_t lo = Element(o(r, c)).raw(), hi = Element(o(r, c + 1)).raw();
        *reinterpret_cast<uint32_t*>(orow + get<1>(cO(r, c))) = lo | (hi << 16);
      }
    }
  }
};

}  // namespace flashattn::sm90

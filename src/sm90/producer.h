// The producer side of the mainloop collective: the Q, K, V buffers in shared memory, their
// pipelines' barriers, the TMA descriptors that fill them (Params, built on the host by
// to_params), and the one thread of warpgroup 0 that issues every TMA load (Q_i, K_j, V_j) of
// every tile this CTA computes, running ahead of the consumers (mainloop.h) by up to kStages
// key blocks.
// Load order per tile, matching the consumers' order with intra-warpgroup overlap
// (S_{j+1} = Q K_{j+1}^T is issued before O += P_j V_j):  Q and K_last, then (K_{j-1}, V_j)
// pairs walking down, then V_first. With one Q buffer, K_last goes first (the consumers still
// hold the old Q until their last Q K^T); with two, Q goes first: its buffer was freed a tile
// ago, so the next tile's Q is in smem well before the consumers reach it. K and V have
// separate pipelines, so a consumer that does not overlap (K_j, V_j, K_{j-1}, ...) also never
// waits on a load queued behind its own need.
#pragma once

#include <type_traits>
#include <utility>

#include <cute/tensor.hpp>

#include <cutlass/arch/barrier.h>  // fence_view_async_shared

#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/tile_scheduler.h"
#include "sm90/tile_shapes.h"

namespace flashattn::sm90 {

// The Q and K/V TMA loads: the one place they are written. Producer::Params' member types are
// what these return, so the descriptor types and their construction cannot drift apart.
// (Free functions: a deduced return type cannot be used inside the class that defines it.)
template <class Traits, class GmemTensor>
auto make_tma_load_q(const GmemTensor& g) {
  using namespace cute;
  return make_tma_copy(SM90_TMA_LOAD{}, g, take<0, 2>(typename Traits::SmemLayoutQ{}),
                       cute::Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDim>>{}, _1{});
}
template <class Traits, class GmemTensor>
auto make_tma_load_k(const GmemTensor& g) {
  using namespace cute;
  return make_tma_copy(SM90_TMA_LOAD{}, g, take<0, 2>(typename Traits::SmemLayoutK{}),
                       cute::Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDim>>{}, _1{});
}
// V's rows: tiles of (keys, head dim) as K's; V^T (VSource::kKeysPermutedT): tiles of (head dim, keys)
// from the (head dim, keys, head, batch) view that Producer::to_params builds.
template <class Traits, class GmemTensor>
auto make_tma_load_v(const GmemTensor& g) {
  using namespace cute;
  if constexpr (Traits::kVSource == VSource::kKeysPermutedT) {
    return make_tma_copy(SM90_TMA_LOAD{}, g, take<0, 2>(typename Traits::SmemLayoutV{}),
                         cute::Shape<Int<Traits::kHeadDim>, Int<Traits::kBlockN>>{}, _1{});
  } else {
    static_assert(std::is_same_v<typename Traits::SmemLayoutK, typename Traits::SmemLayoutV>);
    return make_tma_load_k<Traits>(g);
  }
}

template <class Traits>
struct Producer {
  using Element = typename Traits::Element;
  using P = Pipelines<Traits>;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;

  // 1024-byte alignment: the 128B-swizzle atom repeats every 8 rows x 128 bytes, and both TMA
  // and the WGMMA descriptors assume swizzle phase 0 at the start of each buffer.
  struct TensorStorageQKV {
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> smem_v;  // as TMA loads it
  };
  struct TensorStorageQKVt : TensorStorageQKV {  // FP8: V transposed, keys contiguous (VTransposer)
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutVt>, 1024> smem_vt;
  };
  using TensorStorage = std::conditional_t<Traits::kTransposeV, TensorStorageQKVt, TensorStorageQKV>;
  // The full/empty barriers of the Q, K and V pipelines (pipeline.h). Kept apart from the
  // tensors so that the kernel can place them after every 1024-aligned buffer (kernel.h).
  using PipelineStorage = typename P::SharedStorage;

  using TmaQ = decltype(make_tma_load_q<Traits>(std::declval<TmaGmemTensor<Element const>>()));
  using TmaK = decltype(make_tma_load_k<Traits>(std::declval<TmaGmemTensor<Element const>>()));
  using TmaV = decltype(make_tma_load_v<Traits>(std::declval<TmaGmemTensor<Element const>>()));
  static constexpr bool kVtGlobal = Traits::kVSource == VSource::kKeysPermutedT;
  struct Params {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    ShapeQKV shape_q;
    ShapeQKV shape_k;
    ShapeQKV shape_v;  // shape_k, or V^T's (head dim, keys rounded up to 16, head, batch)
  };

  static Params to_params(const FwdParams& f) {
    const flashattn::Shape& s = f.shape;
    const TmaExtents e = TmaExtents::of(f);
    // The tensors' own head dim (<= kD): a head dim without its own kernel runs on the next
    // larger one, and TMA zero-fills the columns past it, so they add nothing to Q K^T.
    auto gmem = [&](const void* ptr, int rows, int heads, const RowStrides& st) {
      return tma_gmem_tensor(static_cast<Element const*>(ptr), rows, s.headdim, heads, e.batch, st);
    };
    const ShapeQKV shape_k(e.rows_k, s.headdim, s.nheads_kv, e.batch);
    if constexpr (kVtGlobal) {
      // V^T: (head dim, keys, head, batch), keys contiguous; the keys' extent is rounded up to 16
      // because the last group's permutation puts valid keys anywhere in it (its key-less positions hold
      // finite codes, flashattn.h); TMA zero-fills the rest of a tile. Fixed-length batches only (validate.cpp).
      const int keys = (e.rows_k + 15) / 16 * 16;
      const StrideQKV stride(tma_stride(s.headdim, f.fp8.v_col_stride), cute::_1{},
                             tma_stride(s.nheads_kv, f.v_stride.head), tma_stride(e.batch, f.v_stride.batch));
      const ShapeQKV shape_v(s.headdim, keys, s.nheads_kv, e.batch);
      auto vt = cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(f.v)), cute::make_layout(shape_v, stride));
      return Params{make_tma_load_q<Traits>(gmem(f.q, e.rows_q, s.nheads_q, f.q_stride)),
                    make_tma_load_k<Traits>(gmem(f.k, e.rows_k, s.nheads_kv, f.k_stride)), make_tma_load_v<Traits>(vt),
                    ShapeQKV(e.rows_q, s.headdim, s.nheads_q, e.batch), shape_k, shape_v};
    } else {
      return Params{make_tma_load_q<Traits>(gmem(f.q, e.rows_q, s.nheads_q, f.q_stride)),
                    make_tma_load_k<Traits>(gmem(f.k, e.rows_k, s.nheads_kv, f.k_stride)),
                    make_tma_load_v<Traits>(gmem(f.v, e.rows_k, s.nheads_kv, f.v_stride)),
                    ShapeQKV(e.rows_q, s.headdim, s.nheads_q, e.batch), shape_k, shape_k};
    }
  }

  // One thread, before the first load.
  __device__ static void prefetch_descriptors(const Params& p) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
  }

  // The one producer thread: every load of every tile of this CTA.
  __device__ static void run(const Params& p, const FwdParams& fwd, const TileScheduler& sched, TensorStorage& ts,
                             typename P::Q& pipe_q, typename P::KV& pipe_k, typename P::KV& pipe_v) {
    // Two copies of the loop, one per scheduling rule (tile_scheduler.h says why).
    sched.dispatch_rule([&](auto rule) { loop<decltype(rule)::value>(p, fwd, sched, ts, pipe_q, pipe_k, pipe_v); });
  }

 private:
  template <TileScheduler::Rule kRule>
  __device__ static void loop(const Params& p, const FwdParams& fwd, const TileScheduler& sched, TensorStorage& ts,
                              typename P::Q& pipe_q, typename P::KV& pipe_k, typename P::KV& pipe_v) {
    using namespace cute;
    using Hint = TMA::CacheHintSm90;
    auto q_state = cutlass::make_producer_start_state<typename P::Q>();
    auto kv_state = cutlass::make_producer_start_state<typename P::KV>();

    Tensor sQ = make_tensor(make_smem_ptr(ts.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ts.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ts.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_v);
    const bool varlen = fwd.cu_seqlens_q != nullptr;

    // Dynamic rule: the next tile is picked (and handed to the consumers) once this one's
    // loads are issued; they can stall on a full stage, so the pick happens near the end of
    // the consumers' current tile.
    for (auto work = sched.get_initial_work<true, kRule>(); sched.is_valid(work);
         work = sched.get_next_work<true, kRule>(work)) {
      const TileCoord t = sched.coord(work);
      const TileWork w = make_tile_work<Traits>(fwd, t);
      if (w.empty()) continue;  // the consumers write zeros / -inf without loads
      const int b = varlen ? 0 : t.batch;
      const int kv_head = fwd.shape.kv_head(t.head);
      // Varlen: the sequence starts at row q_offset/k_offset of the packed tensor; rows of the
      // next sequence that a partial tile reads are masked (keys) or never written (queries).
      Tensor gQ = local_tile(domain_offset(make_coord(int32_t(w.seq.q_offset), _0{}), mQ(_, _, t.head, b)),
                             cute::Shape<cute::Int<kBlockM>, Int<kD>>{}, make_coord(t.m_block, _0{}));
      Tensor gK = local_tile(domain_offset(make_coord(int32_t(w.seq.k_offset), _0{}), mK(_, _, kv_head, b)),
                             cute::Shape<cute::Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));  // (N, D, n)
      Tensor gV = [&] {  // (N, D, n), or V^T's (D, N, n): fixed length only, no sequence offset
        if constexpr (kVtGlobal) {
          return local_tile(mV(_, _, kv_head, b), cute::Shape<Int<kD>, cute::Int<kBlockN>>{}, make_coord(_0{}, _));
        } else {
          return local_tile(domain_offset(make_coord(int32_t(w.seq.k_offset), _0{}), mV(_, _, kv_head, b)),
                            cute::Shape<cute::Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));
        }
      }();
      // (TMA, stage) for Q; (TMA, n) and (TMA, stage) for K and V.
      auto tQ = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto tK = tma_partition(p.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
      auto tV = tma_partition(p.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
      Tensor tQgQ = get<0>(tQ);
      Tensor tQsQ = get<1>(tQ);
      Tensor tKgK = get<0>(tK);
      Tensor tKsK = get<1>(tK);
      Tensor tVgV = get<0>(tV);
      Tensor tVsV = get<1>(tV);

      // K/V are re-read by every query block of the head: keep them in L2; Q is read once.
      auto load_k = [&](int n, const typename P::KVState& s) {
        pipe_k.producer_acquire(s);
        copy(p.tma_k.with(*pipe_k.producer_get_barrier(s), 0, Hint::EVICT_LAST), tKgK(_, n), tKsK(_, s.index()));
      };
      auto load_v = [&](int n, const typename P::KVState& s) {
        pipe_v.producer_acquire(s);
        copy(p.tma_v.with(*pipe_v.producer_get_barrier(s), 0, Hint::EVICT_LAST), tVgV(_, n), tVsV(_, s.index()));
      };

      auto load_q = [&]() {
        pipe_q.producer_acquire(q_state);
        copy(p.tma_q.with(*pipe_q.producer_get_barrier(q_state), 0, Hint::EVICT_FIRST), tQgQ, tQsQ(_, q_state.index()));
        ++q_state;
      };
      int n = w.n_end - 1;
      if constexpr (Traits::kStagesQ > 1) load_q();
      load_k(n, kv_state);
      if constexpr (Traits::kStagesQ == 1) load_q();
      for (--n; n >= w.n_begin; --n) {
        typename P::KVState v_state = kv_state;  // V trails K by one block
        ++kv_state;
        load_k(n, kv_state);
        load_v(n + 1, v_state);
      }
      load_v(w.n_begin, kv_state);
      ++kv_state;
    }
  }
};

// FP8: warps 1-3 of the producer warpgroup turn each V tile that TMA loaded as (keys, head dim)
// into the (head dim, keys) K-major operand FP8 WGMMA needs, one stage behind the loads, in the
// key order the consumers' P fragment has (mainloop.h, convert_p): within each 16 keys, operand
// position 4q + j holds key {2q, 2q + 1, 2q + 8, 2q + 9}[j].
// Per 16 keys x 32 head dims, one ldmatrix.x4.trans (16-bit elements) gives lane L the bytes
// V[2q + {0, 1}][2c + {0, 1}] (q = L % 4, c = L / 4) of keys 0-7 and 8-15 of two 16-column
// halves; two byte_perms per half make the head dims' 4-key words, which one stmatrix.x4 stores
// (matrix rows = head dims, 16 bytes = the 16 keys). The loads read 8 keys of one 16-byte column,
// swizzled apart (no conflicts); a stored matrix's 8 rows 2r + d hit 4 swizzle rows (2-way).
// The threads follow the tile sequence like the consumers (same scheduler, same skipped
// tiles), so they transpose exactly the blocks the producer loads, in its order.
template <class Traits>
struct VTransposer {
  using Element = typename Traits::Element;
  using P = Pipelines<Traits>;
  using TensorStorage = typename Producer<Traits>::TensorStorage;
  static constexpr int kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  static constexpr int kThreads = Traits::kNumTransposeThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kUnits = (kBlockN / 16) * (kD / 32);  // 16 keys x 32 head dims each
  static_assert(kThreads == 96 && kBlockN % 16 == 0 && kD % 32 == 0);

  // tid: 0 .. kThreads-1 (threads 32..127 of the CTA).
  __device__ static void run(const FwdParams& fwd, const TileScheduler& sched, TensorStorage& ts,
                             typename P::KV& pipe_v, typename P::Vt& pipe_vt, int tid) {
    typename P::KVState v_read;  // index 0, phase 0: the consumer start state
    auto vt_write = cutlass::make_producer_start_state<typename P::Vt>();
    for (auto work = sched.get_initial_work<false>(); sched.is_valid(work); work = sched.get_next_work<false>(work)) {
      const TileWork w = make_tile_work<Traits>(fwd, sched.coord(work));
      if (!w.has_rows) continue;
      for (int n = w.n_end - 1; n >= w.n_begin; --n) {
        pipe_v.consumer_wait(v_read);
        pipe_vt.producer_acquire(vt_write);
        transpose(ts, v_read.index(), vt_write.index(), tid);
        cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to WGMMA
        pipe_vt.producer_commit(vt_write);
        // Every transposing thread has read the stage before TMA may overwrite it.
        named_barrier_sync(kBarrierTranspose, kThreads);
        pipe_v.consumer_release(v_read);
        ++v_read;
        ++vt_write;
      }
    }
  }

 private:
  // Offsets are written out for the K-major 8-bit layouts (the GMMA atom is 8 rows x B bytes,
  // tiled down the rows first). With B = 128 (the 128-byte swizzle, cols a multiple of 128; V at
  // hdim 128/256 and V^T) the swizzle XORs the row's low 3 bits into the 16-byte column; with
  // B = 64 (the 64-byte swizzle; V at hdim 64) it XORs row bits 1-2. (row, col) is at
  //   (col / B) (rows x B) + row x B + ((col % B) ^ x(row)),  x = (row % 8) x 16 or ((row / 2) % 4) x 16,
  // equal to Traits::SmemLayoutV / SmemLayoutVt (checked against CuTe on the host for hdim
  // 64/128/256). The CuTe evaluation costs ~30 instructions per address in this 24-register warpgroup.
  // kBlockN == 128: V^T's rows are 128 bytes and the stores below leave out the column-block term.
  static constexpr uint32_t kSrcRow = kD % 128 == 0 ? 128u : 64u;  // V's row (key) bytes per atom
  static_assert((kD % 128 == 0 || kD == 64) && kBlockN == 128 && sizeof(Element) == 1,
                "the transpose's offsets assume 128- or 64-byte swizzled V rows, 128-byte V^T rows and 128 keys");

  __device__ static void transpose(TensorStorage& ts, int src_stage, int dst_stage, int tid) {
    using namespace cute;
    const uint32_t warp = uint32_t(tid) / 32, lane = uint32_t(tid) % 32;
    const uint32_t mat = lane / 8, mrow = lane % 8;  // the row address this lane gives ldmatrix / stmatrix
    // ldmatrix: matrices 0/1 are keys 0-7 / 8-15 of head dims h32..+15, 2/3 the same of h32+16..+31.
    const uint32_t src_lane = cast_smem_ptr_to_uint(ts.smem_v.data()) + uint32_t(src_stage) * Traits::kBytesKV +
                              (8 * (mat & 1) + mrow) * kSrcRow;
    // The row is 16 g + 8 (mat & 1) + mrow: its bits 0-2 (SW128) and 1-2 (SW64) are mrow's.
    const uint32_t src_col = 16 * (mat >> 1), src_xor = (kSrcRow == 128u ? mrow : (mrow >> 1) & 3u) << 4;
    // stmatrix: matrix 0 is head dims h32 + 2r (r = 0..7), 1 is h32 + 2r + 1, 2 and 3 the same
    // plus 16; each row's 16 bytes are the 16 keys of group g.
    const uint32_t dst_row = 16 * (mat >> 1) + 2 * mrow + (mat & 1);
    const uint32_t dst_lane = cast_smem_ptr_to_uint(ts.smem_vt.data()) + uint32_t(dst_stage) * Traits::kBytesKV +
                              dst_row * 128u;
    const uint32_t dst_xor = (dst_row & 7u) << 4;
#pragma unroll 1
    for (uint32_t u = warp; u < uint32_t(kUnits); u += kWarps) {
      const uint32_t g = u % (kBlockN / 16), h32 = (u / (kBlockN / 16)) * 32;
      const uint32_t col = h32 + src_col;
      const uint32_t src = src_lane + g * (16 * kSrcRow) + (col / kSrcRow) * (kBlockN * kSrcRow) + ((col % kSrcRow) ^ src_xor);
      uint32_t r0, r1, r2, r3;
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                   : "r"(src));
      // Lane L (q = L % 4, c = L / 4) holds keys {2q, 2q+1} and {2q+8, 2q+9} of head dims
      // h32 + 2c, +1 (r0, r1) and h32 + 16 + 2c, +1 (r2, r3); its 4-key words at position 4q:
      const uint32_t lo_even = __byte_perm(r0, r1, 0x6420), lo_odd = __byte_perm(r0, r1, 0x7531);
      const uint32_t hi_even = __byte_perm(r2, r3, 0x6420), hi_odd = __byte_perm(r2, r3, 0x7531);
      const uint32_t dst = dst_lane + h32 * 128u + ((16 * g) ^ dst_xor);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(lo_even),
                   "r"(lo_odd), "r"(hi_even), "r"(hi_odd));
    }
  }
};

}  // namespace flashattn::sm90

// The producer: one thread of warpgroup 0 issues every TMA load (Q_i, K_j, V_j) of every tile
// this CTA computes, running ahead of the consumers by up to kStages key blocks.
// Load order per tile, matching the consumers' order with intra-warpgroup overlap
// (S_{j+1} = Q K_{j+1}^T is issued before O += P_j V_j):  Q and K_last, then (K_{j-1}, V_j)
// pairs walking down, then V_first. With one Q buffer, K_last goes first (the consumers still
// hold the old Q until their last Q K^T); with two, Q goes first: its buffer was freed a tile
// ago, so the next tile's Q is in smem well before the consumers reach it. K and V have
// separate pipelines, so a consumer that does not overlap (K_j, V_j, K_{j-1}, ...) also never
// waits on a load queued behind its own need.
#pragma once

#include <cute/tensor.hpp>

#include "sm90/kernel_params.h"
#include "sm90/pipeline.h"

namespace flashattn::sm90 {

template <class Traits, class SharedStorage>
struct Producer {
  using P = Pipelines<Traits>;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;

  __device__ static void run(const KernelParams<Traits>& p, SharedStorage& ss, typename P::Q& pipe_q,
                             typename P::KV& pipe_k, typename P::KV& pipe_v) {
    // Two copies of the loop: the atomic of the dynamic schedule costs the 24-register producer
    // ~230 bytes of spills, which the static (unmasked) schedule should not pay.
    if (p.scheduler.counter != nullptr) {
      loop<true>(p, ss, pipe_q, pipe_k, pipe_v);
    } else {
      loop<false>(p, ss, pipe_q, pipe_k, pipe_v);
    }
  }

  template <bool kDynamic>
  __device__ static void loop(const KernelParams<Traits>& p, SharedStorage& ss, typename P::Q& pipe_q,
                              typename P::KV& pipe_k, typename P::KV& pipe_v) {
    using namespace cute;
    using Hint = TMA::CacheHintSm90;
    auto q_state = cutlass::make_producer_start_state<typename P::Q>();
    auto kv_state = cutlass::make_producer_start_state<typename P::KV>();

    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutV{});
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
    const bool varlen = p.fwd.cu_seqlens_q != nullptr;

    // Dynamic: the next tile is picked once this one's loads are issued (they can stall on a
    // full stage, so the pick happens near the end of the consumers' current tile) and handed
    // to the consumers. Static: the consumers know the sequence themselves.
    int k = 0;
    for (int tile = p.scheduler.first(); tile < p.scheduler.num_tiles; tile = p.scheduler.next<kDynamic>(tile), ++k) {
      if constexpr (kDynamic) TileQueue::push(ss.tiles, k, tile);
      const TileCoord t = p.scheduler.coord(tile);
      const TileWork w = make_tile_work<Traits>(p.fwd, t);
      if (w.empty()) continue;  // the consumers write zeros / -inf without loads
      const int b = varlen ? 0 : t.batch;
      const int kv_head = p.fwd.shape.kv_head(t.head);
      // Varlen: the sequence starts at row q_offset/k_offset of the packed tensor; rows of the
      // next sequence that a partial tile reads are masked (keys) or never written (queries).
      Tensor gQ = local_tile(domain_offset(make_coord(int32_t(w.seq.q_offset), _0{}), mQ(_, _, t.head, b)),
                             cute::Shape<cute::Int<kBlockM>, Int<kD>>{}, make_coord(t.m_block, _0{}));
      Tensor gK = local_tile(domain_offset(make_coord(int32_t(w.seq.k_offset), _0{}), mK(_, _, kv_head, b)),
                             cute::Shape<cute::Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));  // (N, D, n)
      Tensor gV = local_tile(domain_offset(make_coord(int32_t(w.seq.k_offset), _0{}), mV(_, _, kv_head, b)),
                             cute::Shape<cute::Int<kBlockN>, Int<kD>>{}, make_coord(_, _0{}));
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
    if constexpr (kDynamic) TileQueue::push(ss.tiles, k, p.scheduler.num_tiles);  // tells the consumers to stop
  }
};

}  // namespace flashattn::sm90

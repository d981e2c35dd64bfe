// The backward's producer/consumer collective for one key block (FA3's backward, in our
// pieces): it owns its shared memory, its TMA descriptors (built in to_params, the one place
// their types come from) and its params.
//   load()      producer warp, one thread: K_j, V_j once; then per step (query head of the
//               GQA group, query block i) Q_i + LSE_i and dO_i + D_i into kStages-deep rings.
//   mma()       consumer warpgroups, per step:
//                 S^T = K Q_i^T, dP^T = V dO_i^T (async, both issued before either is used)
//                 P^T = exp2(S^T * scale_log2 - LSE_i)            (masked / softcapped)
//                 dS^T = P^T * (dP^T - D_i) [* (1 - tanh^2)]
//                 dS -> smem (stmatrix, transposed), and P^T too when the head dim is split
//                 dV += P^T dO_i, dQ_i = dS K (one barrier: both warpgroups' dS), dK += dS^T Q_i
//                 (dV/dK from registers or smem: the partition policy, bwd_shapes.h)
//                 dQ_i -> this warpgroup's smem slice for the dQ writer, or atomics (hdim 256)
//   store_dq()  producer warpgroup's warp 1: per step, one bulk reduce-add (cp.reduce.async.bulk)
//               per warpgroup slice into the fp32 accumulator, so no consumer waits on global
//               atomics; deterministic mode orders the adds of the key blocks by a semaphore.
// A CTA loops over the query heads of its GQA group itself, so dK/dV need no cross-CTA
// reduction (and are deterministic by construction).
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/dropout_tile.h"
#include "common/mask.h"
#include "common/score_mods.h"
#include "common/params.h"
#include "common/softmax.h"
#include "sm90/bwd_shapes.h"
#include "sm90/bwd_workspace.h"
#include "sm90/kernel_params.h"  // ShapeQKV, TmaExtents, tma_gmem_tensor
#include "sm90/gemm.h"           // gemm_async
#include "sm90/named_barriers.h"
#include "sm90/softmax.h"
#include "sm90/warp_uniform.h"

namespace flashattn::sm90 {

constexpr uint32_t kBwdDqBarrierThreads = 128 + 32;  // one consumer warpgroup + the writer warp

// What one CTA (key block n_block of kv head kv_head, sequence batch) does.
struct BwdWork {
  SeqBounds seq;
  Mask mask;
  int n_block, kv_head, batch;
  int m_begin, m_end;  // query blocks that see some key of the block
  int group;           // query heads per kv head

  __device__ int steps() const { return m_end > m_begin ? group * (m_end - m_begin) : 0; }
};

__device__ __forceinline__ BwdWork make_bwd_work(const BwdParams& p, int n_block, int kv_head, int batch,
                                                 int block_m, int block_n) {
  BwdWork w;
  w.seq = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, batch);
  w.mask = make_mask(p.mask, w.seq);
  w.n_block = n_block;
  w.kv_head = kv_head;
  w.batch = batch;
  w.group = p.shape.group_size();
  w.m_begin = w.m_end = 0;
  if (n_block * block_n < w.seq.seqlen_k && w.seq.seqlen_q > 0)
    w.mask.query_block_range(n_block * block_n, block_n, block_m, &w.m_begin, &w.m_end);
  return w;
}

// Host: a TMA load of `tile`-sized boxes of a (rows, d, heads, batch) tensor into `smem`.
template <class GmemTensor, class SmemLayout, class Tile>
auto make_tma_load(const GmemTensor& g, SmemLayout smem, Tile tile) {
  return cute::make_tma_copy(cute::SM90_TMA_LOAD{}, g, smem, tile, cute::_1{});
}

template <class Traits>
struct BwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  // Which copy of a step's elementwise code runs (mma(): per step, uniform over the CTA).
  enum class StepKind { kPlain, kGeneral, kAlibiFold, kDropout };
  static constexpr int kStages = Traits::kStages, kNumMmaWG = Traits::kNumMmaWG;
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;  // Q + LSE, and dO + D: one state for both
  using PipelineState = cutlass::PipelineState<kStages>;
  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kD>>;
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kD>>;
  using Gmem = TmaGmemTensor<Element const>;
  using TmaQ = decltype(make_tma_load(Gmem{}, cute::take<0, 2>(typename Traits::SmemLayoutQ{}), TileQ{}));
  using TmaK = decltype(make_tma_load(Gmem{}, typename Traits::SmemLayoutK{}, TileKV{}));
  using TmaV = decltype(make_tma_load(Gmem{}, typename Traits::SmemLayoutV{}, TileKV{}));

  // Buffers (the epilogue may reuse K's and V's bytes once the mainloop is done: bwd_kernel.h)
  // and barriers (never reused).
  struct TensorStorage {
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutdO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutdS>, 1024> ds;
    std::conditional_t<Traits::kKeysPerWG, cute::array<Element, 0>,
                       cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutPt>, 1024>>
        pt;
    std::conditional_t<Traits::kDqBulkReduce,
                       cute::array_aligned<float, cute::cosize_v<typename Traits::SmemLayoutdQacc>, 128>,
                       cute::array<float, 0>>
        dq_acc;
    cute::array_aligned<float, cute::cosize_v<typename Traits::SmemLayoutRowStat>, 128> lse;
    cute::array_aligned<float, cute::cosize_v<typename Traits::SmemLayoutRowStat>, 128> dpsum;
  };
  struct BarrierStorage {
    typename Pipeline::SharedStorage pipe_q;
    typename Pipeline::SharedStorage pipe_do;
    uint64_t kv_full;
  };

  struct Params {
    TmaQ tma_q, tma_do;
    TmaK tma_k;
    TmaV tma_v;
    ShapeQKV shape_q, shape_k;
    BwdParams bwd;
    BwdWorkspace ws;
  };

  static Params to_params(const BwdParams& p, const BwdWorkspace& ws) {
    const Shape& s = p.shape;
    const TmaExtents e = TmaExtents::of(p);
    auto gmem = [&](const void* ptr, int rows, int heads, const RowStrides& st) {
      return tma_gmem_tensor(static_cast<Element const*>(ptr), rows, s.headdim, heads, e.batch, st);  // zero fill past it
    };
    const auto smem_q = cute::take<0, 2>(typename Traits::SmemLayoutQ{});
    return {make_tma_load(gmem(p.q, e.rows_q, s.nheads_q, p.q_stride), smem_q, TileQ{}),
            make_tma_load(gmem(p.dout, e.rows_q, s.nheads_q, p.dout_stride), smem_q, TileQ{}),
            make_tma_load(gmem(p.k, e.rows_k, s.nheads_kv, p.k_stride), typename Traits::SmemLayoutK{}, TileKV{}),
            make_tma_load(gmem(p.v, e.rows_k, s.nheads_kv, p.v_stride), typename Traits::SmemLayoutV{}, TileKV{}),
            ShapeQKV(e.rows_q, s.headdim, s.nheads_q, e.batch),
            ShapeQKV(e.rows_k, s.headdim, s.nheads_kv, e.batch),
            p,
            ws};
  }

  __device__ static void prefetch_descriptors(const Params& p) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
  }

  // Every thread; warp 0 initializes the barriers. A __syncthreads must follow.
  __device__ static Pipeline make_pipeline(typename Pipeline::SharedStorage& storage) {
    typename Pipeline::Params params;
    params.transaction_bytes = Traits::kBytesQ + Traits::kBytesRowStat;
    params.role = threadIdx.x < 128 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = Traits::kNumMmaThreads;
    return Pipeline(storage, params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  }
  __device__ static void init_kv_barrier(BarrierStorage& bs) {
    if (threadIdx.x == 0) cutlass::arch::ClusterTransactionBarrier::init(&bs.kv_full, 1);
  }

  // The step order all three roles share: query heads of the group, then query blocks.
  template <class Fn>
  __device__ static void for_each_step(const BwdWork& w, Fn&& fn) {
    if (w.steps() == 0) return;
    for (int g = 0; g < w.group; ++g)
      for (int m = w.m_begin; m < w.m_end; ++m) fn(w.kv_head * w.group + g, m);
  }

  __device__ static int64_t stat_tile(const Params& p, const BwdWork& w, int q_head, int m_block) {
    const int64_t row0 = BwdWorkspace::packed_row0(w.seq, p.bwd.shape, w.batch, p.bwd.cu_seqlens_q != nullptr);
    return p.ws.tile(q_head, row0, w.batch, m_block, kBlockM);
  }

  // ---- producer (one thread) ----
  __device__ static void load(const Params& p, TensorStorage& ss, BarrierStorage& bs, Pipeline& pipe_q,
                              Pipeline& pipe_do, const BwdWork& w) {
    using namespace cute;
    if (w.steps() == 0) return;
    using Hint = TMA::CacheHintSm90;
    const int b = p.bwd.cu_seqlens_q != nullptr ? 0 : w.batch;
    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mdO = p.tma_do.get_tma_tensor(p.shape_q);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_k);
    const auto k_origin = make_coord(int32_t(w.seq.k_offset), _0{});
    Tensor gK = local_tile(domain_offset(k_origin, mK(_, _, w.kv_head, b)), TileKV{}, make_coord(w.n_block, _0{}));
    Tensor gV = local_tile(domain_offset(k_origin, mV(_, _, w.kv_head, b)), TileKV{}, make_coord(w.n_block, _0{}));
    // Rank-1 views so tma_partition sees one (TMA) mode on each side.
    auto [tKgK, tKsK] = tma_partition(p.tma_k, _0{}, Layout<_1>{},
                                      group_modes<0, 2>(make_tensor(sK.data(), make_layout(sK.layout(), Layout<_1>{}))),
                                      group_modes<0, 2>(make_tensor(gK.data(), make_layout(gK.layout(), Layout<_1>{}))));
    auto [tVgV, tVsV] = tma_partition(p.tma_v, _0{}, Layout<_1>{},
                                      group_modes<0, 2>(make_tensor(sV.data(), make_layout(sV.layout(), Layout<_1>{}))),
                                      group_modes<0, 2>(make_tensor(gV.data(), make_layout(gV.layout(), Layout<_1>{}))));
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bs.kv_full, 2 * Traits::kBytesKV);
    copy(p.tma_k.with(bs.kv_full, 0, Hint::EVICT_FIRST), tKgK, tKsK);
    copy(p.tma_v.with(bs.kv_full, 0, Hint::EVICT_FIRST), tVgV, tVsV);

    auto state = cutlass::make_producer_start_state<Pipeline>();
    const auto q_origin = make_coord(int32_t(w.seq.q_offset), _0{});
    for_each_step(w, [&](int q_head, int m_block) {
      // Q_i / dO_i are re-read by every key block of the head: keep them in L2.
      Tensor gQ = local_tile(domain_offset(q_origin, mQ(_, _, q_head, b)), TileQ{}, make_coord(m_block, _0{}));
      Tensor gdO = local_tile(domain_offset(q_origin, mdO(_, _, q_head, b)), TileQ{}, make_coord(m_block, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(p.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] =
          tma_partition(p.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      const int64_t tile = stat_tile(p, w, q_head, m_block);
      const int stage = state.index();
      pipe_q.producer_acquire(state);
      copy(p.tma_q.with(*pipe_q.producer_get_barrier(state), 0, Hint::EVICT_LAST), tQgQ, tQsQ(_, stage));
      SM90_BULK_COPY_G2S::copy(p.ws.lse_log2 + tile * kBlockM, pipe_q.producer_get_barrier(state),
                               ss.lse.data() + stage * kBlockM, Traits::kBytesRowStat);
      pipe_do.producer_acquire(state);
      copy(p.tma_do.with(*pipe_do.producer_get_barrier(state), 0, Hint::EVICT_LAST), tdOgdO, tdOsdO(_, stage));
      SM90_BULK_COPY_G2S::copy(p.ws.dpsum + tile * kBlockM, pipe_do.producer_get_barrier(state),
                               ss.dpsum.data() + stage * kBlockM, Traits::kBytesRowStat);
      ++state;
    });
  }

  // ---- dQ writer (one warp) ----
  __device__ static void store_dq(const Params& p, TensorStorage& ss, const BwdWork& w) {
    if constexpr (!Traits::kDqBulkReduce) return;  // the consumers add dQ with atomics
    const bool leader = threadIdx.x % 32 == 0;
    const bool deterministic = p.ws.dq_semaphore != nullptr;
    for_each_step(w, [&](int q_head, int m_block) {
      const int64_t tile = stat_tile(p, w, q_head, m_block);
      float* gacc = p.ws.dq_accum + tile * kBlockM * kD;
      int* sem = deterministic ? p.ws.dq_semaphore + tile : nullptr;
      if (deterministic && leader) wait_turn(sem, dq_adds_before(w.mask, w.n_block, m_block, kBlockM, kBlockN));
      __syncwarp();
#pragma unroll
      for (int wg = 0; wg < kNumMmaWG; ++wg) {
        named_barrier_sync(kBwdBarrierdQFull + wg, kBwdDqBarrierThreads);
        if (leader) {
          bulk_reduce_add(gacc + wg * Traits::kDqSliceFloats, ss.dq_acc.data() + wg * Traits::kDqSliceFloats,
                          Traits::kDqSliceFloats * int(sizeof(float)));
          cute::tma_store_arrive();
        }
      }
      // Each slice may be refilled once its reduce has read it.
      if (leader) cute::tma_store_wait<kNumMmaWG - 1>();
      __syncwarp();
      named_barrier_arrive(kBwdBarrierdQEmpty + 0, kBwdDqBarrierThreads);
      if (leader) cute::tma_store_wait<0>();
      __syncwarp();
      named_barrier_arrive(kBwdBarrierdQEmpty + 1, kBwdDqBarrierThreads);
      if (deterministic && leader) {
        bulk_wait_all();  // the adds themselves are done, not only their smem reads
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        __threadfence();
        atomicAdd(sem, 1);
      }
    });
    if (leader) cute::tma_store_wait<0>();
  }

  // ---- consumers ----
  template <class TensorAcc>
  __device__ static void mma(const Params& p, TensorStorage& ss, BarrierStorage& bs, Pipeline& pipe_q,
                             Pipeline& pipe_do, PipelineState& state, const BwdWork& w, TensorAcc& tdKrdK,
                             TensorAcc& tdVrdV, int mma_tidx) {
    using namespace cute;
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmadV mma_dv;
    typename Traits::TiledMmadK mma_dk;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tidx);
    auto thr_dv = mma_dv.get_thread_slice(mma_tidx);
    auto thr_dk = mma_dk.get_thread_slice(mma_tidx);
    auto thr_dq = mma_dq.get_thread_slice(mma_tidx);
    const int wg = warp_uniform(mma_tidx / 128);  // and every test below that picks warps (warp_uniform.h)

    Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutV{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutdOt{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdSt{}));
    Tensor sdSt_desc = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdSt{});
    Tensor sPt = make_tensor(make_smem_ptr(ss.pt.data()), typename Traits::SmemLayoutPt{});
    Tensor sdQ = make_tensor(make_smem_ptr(ss.dq_acc.data()), typename Traits::SmemLayoutdQacc{});
    Tensor sLSE = make_tensor(make_smem_ptr(ss.lse.data()), typename Traits::SmemLayoutRowStatMma{});
    Tensor sdPsum = make_tensor(make_smem_ptr(ss.dpsum.data()), typename Traits::SmemLayoutRowStatMma{});

    // WGMMA descriptors / operand views: (MMA, MMA_M|N, MMA_K[, stage]).
    Tensor tSrK = thr_sdp.partition_fragment_A(sK);
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
    Tensor tdPrV = thr_sdp.partition_fragment_A(sV);
    Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);
    Tensor tdVrdO = thr_dv.partition_fragment_B(sdOt);
    Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
    Tensor tdQrK = thr_dq.partition_fragment_B(sKt);

    auto r2s_ds = make_tiled_copy_C(typename Traits::SmemCopyAtomdS{}, mma_sdp);
    auto thr_r2s_ds = r2s_ds.get_thread_slice(mma_tidx);
    Tensor tdSsdS = thr_r2s_ds.partition_D(sdSt);  // (CPY, CPY_M, CPY_N, stage)
    auto r2s_p = make_tiled_copy_C(typename Traits::SmemCopyAtomP{}, mma_sdp);
    auto thr_r2s_p = r2s_p.get_thread_slice(mma_tidx);
    Tensor tPsPt = thr_r2s_p.partition_D(as_position_independent_swizzle_tensor(sPt));
    auto thr_r2s_dq = typename Traits::R2SCopydQacc{}.get_thread_slice(mma_tidx);
    Tensor tdQsdQ = thr_r2s_dq.partition_D(sdQ);

    // This thread's query columns of S^T: their LSE / D per stage, in the rowcol column order.
    Tensor tLSEsLSE = group_modes<0, 3>(thr_sdp.partition_C(sLSE)(make_coord(_, _0{}, _), _0{}, _, _));
    Tensor tDsD = group_modes<0, 3>(thr_sdp.partition_C(sdPsum)(make_coord(_, _0{}, _), _0{}, _, _));
    Tensor cS = thr_sdp.partition_C(make_identity_tensor(cute::Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor cS_rc = make_tensor(cS.data(), acc_rowcol(cS.layout()));  // (key, query) per element

    const ScoreTransform tf = ScoreTransform::make(p.bwd.mask.softmax_scale, p.bwd.mask.softcap);
    const int key0 = w.n_block * kBlockN;

    if (w.steps() == 0) return;  // no query reaches these keys: dK = dV = 0
    // The writer warp's first "slice free" is this warpgroup's own arrival.
    if (Traits::kDqBulkReduce && warp_uniform(mma_tidx % 128 / 32) == 0)
      named_barrier_arrive(kBwdBarrierdQEmpty + wg, kBwdDqBarrierThreads);
    cutlass::arch::ClusterTransactionBarrier::wait(&bs.kv_full, 0);

    for_each_step(w, [&](int q_head, int m_block) {
      const int stage = state.index();
      Tensor tSrS = partition_fragment_C(mma_sdp, cute::Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tdPrdP = partition_fragment_C(mma_sdp, cute::Shape<Int<kBlockN>, Int<kBlockM>>{});
      pipe_q.consumer_wait(state);
      gemm_async<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
      pipe_do.consumer_wait(state);
      gemm_async<true>(mma_sdp, tdPrV, tdPrdO(_, _, _, stage), tdPrdP);
      // LSE and D are read from smem where used (an LDS each): register copies of both would
      // push the consumers past 240 registers at hdim 128.
      Tensor lse = tLSEsLSE(_, stage);
      warpgroup_wait<1>();  // S^T ready, dP^T may still run
      warpgroup_fence_operand(tSrS);

      Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor ds = make_tensor(tdPrdP.data(), s.layout());
      // Copies of the elementwise code, picked per step by uniform branches (StepKind), so
      // interior tiles pay for no mask and softcap-free calls for no tanh. The general copy
      // takes masked tiles and whatever the others do not: ALiBi straddling its diagonal or with
      // softcap, dropout with ALiBi or softcap. Elsewhere:
      //  - ALiBi: |i + diag - j| has one sign over the tile, so the bias splits into a query term
      //    (folded into the LSE once per column) and a key term, one add per score. It was the
      //    general copy on every tile: 0.61-0.75 of the plain backward.
      //  - dropout: the keep bits without the mask's per-score tests.
      const ScoreMods mods = ScoreMods::make(p.bwd, tf, w.seq, w.batch, q_head);
      const int alibi_base = m_block * kBlockM + mods.alibi_diag - key0;  // i + diag - j at the tile's origin
      const bool softcap = tf.softcap > 0.f;
      StepKind kind = StepKind::kPlain;
      if (w.mask.tile_needs_mask(m_block * kBlockM, kBlockM, key0, kBlockN)) {
        kind = StepKind::kGeneral;
      } else if (mods.dropout()) {
        kind = mods.alibi() || softcap ? StepKind::kGeneral : StepKind::kDropout;
      } else if (mods.alibi()) {
        const bool one_side = alibi_base - (kBlockN - 1) >= 0 || alibi_base + (kBlockM - 1) <= 0;
        kind = one_side && !softcap ? StepKind::kAlibiFold : StepKind::kGeneral;
      }
      auto elementwise = [&](auto kind_tag, auto softcap_tag) {
        constexpr StepKind kKind = decltype(kind_tag)::value;
        constexpr bool kSoftcap = decltype(softcap_tag)::value;
        if constexpr (kKind == StepKind::kAlibiFold) {
          scores_to_p_alibi_fold(s, lse, cS_rc, tf, mods, alibi_base >= 0 ? 1 : -1, alibi_base);
        } else {
          scores_to_p<kKind == StepKind::kGeneral, kSoftcap>(s, lse, cS_rc, w, tf, mods, m_block, key0);
        }
        // The keep bits, drawn while dP^T still runs: bit (r, c) of S^T's row/col view.
        DropoutMask<decltype(cS_rc), false, true> keep;
        if constexpr (kKind == StepKind::kGeneral) {
          if (mods.dropout()) keep.generate(cS_rc, key0, m_block * kBlockM, mods);
        } else if constexpr (kKind == StepKind::kDropout) {
          keep.generate(cS_rc, key0, m_block * kBlockM, mods);
        }
        Tensor dsum = tDsD(_, stage);
        warpgroup_wait<0>();  // dP^T ready
        warpgroup_fence_operand(tdPrdP);
        if constexpr (kKind == StepKind::kGeneral) {
          dp_to_ds_general<kSoftcap>(s, ds, lse, dsum, tf, mods, keep, cS_rc, key0, m_block * kBlockM,
                                     p.bwd.dropout.scale);
        } else if constexpr (kKind == StepKind::kDropout) {
          dp_to_ds_dropout(s, ds, dsum, keep, p.bwd.dropout.scale);
        } else {
          dp_to_ds<kSoftcap>(s, ds, lse, dsum, tf);
        }
      };
      using Kind = StepKind;
      if (softcap) {  // kind is kPlain or kGeneral
        if (kind == Kind::kGeneral) elementwise(std::integral_constant<Kind, Kind::kGeneral>{}, cute::true_type{});
        else elementwise(std::integral_constant<Kind, Kind::kPlain>{}, cute::true_type{});
      } else if (kind == Kind::kGeneral) {
        elementwise(std::integral_constant<Kind, Kind::kGeneral>{}, cute::false_type{});
      } else if (kind == Kind::kAlibiFold) {
        elementwise(std::integral_constant<Kind, Kind::kAlibiFold>{}, cute::false_type{});
      } else if (kind == Kind::kDropout) {
        elementwise(std::integral_constant<Kind, Kind::kDropout>{}, cute::false_type{});
      } else {
        elementwise(std::integral_constant<Kind, Kind::kPlain>{}, cute::false_type{});
      }
      Tensor rP = make_tensor<Element>(tSrS.layout());
      convert_fragment(tSrS, rP);
      Tensor rdS = make_tensor<Element>(tdPrdP.layout());
      convert_fragment(tdPrdP, rdS);

      Tensor tdQrdQ = partition_fragment_C(mma_dq, cute::Shape<Int<kBlockM>, Int<kD>>{});
      if constexpr (Traits::kKeysPerWG) {
        // dS (transposed by stmatrix) to this stage's buffer; the other stage may still be read
        // by the other warpgroup's dQ GEMM of the previous step, this one no longer (the barrier
        // below was passed since).
        copy(r2s_ds, thr_r2s_ds.retile_S(rdS), tdSsdS(_, _, _, stage));
        // dV += P^T dO_i (P^T from registers)
        gemm_async<false>(mma_dv, make_tensor(rP.data(), acc_as_a_operand(tSrS.layout())), tdVrdO(_, _, _, stage),
                          tdVrdV);
        cutlass::arch::fence_view_async_shared();  // dS stores -> visible to WGMMA
        named_barrier_sync(kBwdBarrierdS, Traits::kNumMmaThreads);
        // dQ_i = dS K (this warpgroup's half of the head dim)
        gemm_async<true>(mma_dq, tdQrdS(_, _, _, stage), tdQrK, tdQrdQ);
        warpgroup_wait<1>();  // dV done: dO_i no longer read
        pipe_do.consumer_release(state);
        // dK += dS^T Q_i
        gemm_async<false>(mma_dk, make_tensor(rdS.data(), acc_as_a_operand(tdPrdP.layout())),
                          tdKrQ(_, _, _, stage), tdKrdK);
      } else {
        // One P^T / dS buffer: the other warpgroup must be done with the last step's.
        named_barrier_sync(kBwdBarrierdS, Traits::kNumMmaThreads);
        copy(r2s_p, thr_r2s_p.retile_S(rP), tPsPt(_, _, _, 0));
        copy(r2s_ds, thr_r2s_ds.retile_S(rdS), tdSsdS(_, _, _, 0));
        cutlass::arch::fence_view_async_shared();
        named_barrier_sync(kBwdBarrierdS, Traits::kNumMmaThreads);
        gemm_async<false>(mma_dv, thr_dv.partition_fragment_A(sPt)(_, _, _, 0), tdVrdO(_, _, _, stage), tdVrdV);
        gemm_async<true>(mma_dq, tdQrdS(_, _, _, 0), tdQrK, tdQrdQ);
        warpgroup_wait<1>();  // dV done: dO_i no longer read
        pipe_do.consumer_release(state);
        gemm_async<false>(mma_dk, thr_dk.partition_fragment_A(sdSt_desc)(_, _, _, 0), tdKrQ(_, _, _, stage), tdKrdK);
      }
      warpgroup_wait<1>();  // dQ done
      warpgroup_fence_operand(tdQrdQ);
      if constexpr (Traits::kDqBulkReduce) {
        named_barrier_sync(kBwdBarrierdQEmpty + wg, kBwdDqBarrierThreads);
        copy(thr_r2s_dq.retile_S(tdQrdQ), tdQsdQ);
        cutlass::arch::fence_view_async_shared();  // dQ stores -> visible to the bulk reduce
        named_barrier_arrive(kBwdBarrierdQFull + wg, kBwdDqBarrierThreads);
      } else {
        // Same order in global memory as the bulk reduce would give (the postprocess reads it so).
        Tensor gdQ = make_tensor(make_gmem_ptr(p.ws.dq_accum + stat_tile(p, w, q_head, m_block) * kBlockM * kD),
                                 typename Traits::SmemLayoutdQacc{});
        Tensor src = recast<float4>(thr_r2s_dq.retile_S(tdQrdQ));
        Tensor dst = recast<float4>(thr_r2s_dq.partition_D(gdQ));
#pragma unroll
        for (int i = 0; i < size(src); ++i) atomicAdd(&dst(i), src(i));
      }
      warpgroup_wait<0>();  // dK done: Q_i no longer read
      warpgroup_fence_operand(tdKrdK);
      pipe_q.consumer_release(state);
      ++state;
    });
  }

 private:
  // S^T (rowcol: keys x queries) -> P^T = exp2((capped score + ALiBi) * exp2_scale - LSE);
  // masked 0. kMasked is the general copy: the mask and ALiBi.
  template <bool kMasked, bool kSoftcap, class TensorS, class TensorL, class TensorC>
  __device__ static void scores_to_p(TensorS& s, const TensorL& lse, const TensorC& coord, const BwdWork& w,
                                     const ScoreTransform& tf, const ScoreMods& mods, int m_block, int key0) {
    using namespace cute;
    if constexpr (kMasked) {
      if (mods.alibi()) {
        if constexpr (kSoftcap) {
#pragma unroll
          for (int i = 0; i < size(s); ++i) s(i) = tf.softcap * tanhf(s(i) * tf.pre_scale);
        }
        alibi_apply<false>(s, coord, key0, m_block * kBlockM, mods);
        scores_to_p_capped<kMasked>(s, lse, coord, w, tf, m_block, key0);
        return;
      }
    }
    scores_to_p_capped<kMasked, kSoftcap>(s, lse, coord, w, tf, m_block, key0);
  }
  // S^T -> P^T with ALiBi on a tile where i + diag - j has one sign (no mask, no softcap):
  //   bias * exp2_scale = -c e sign (base + dq) + c e sign dk,
  // dq / dk the query / key offsets in the tile, base = i + diag - j at its origin: the query
  // term joins -LSE once per column, the key term once per row; one add per score.
  template <class TensorS, class TensorL, class TensorC>
  __device__ static void scores_to_p_alibi_fold(TensorS& s, const TensorL& lse, const TensorC& coord,
                                                const ScoreTransform& tf, const ScoreMods& mods, int sign, int base) {
    using namespace cute;
    const float ce = mods.alibi_coef * tf.exp2_scale * float(sign);
    constexpr int kRows = decltype(size<0>(s))::value;
    float key_term[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) key_term[r] = ce * float(get<0>(coord(r, 0)));
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
      const float col_term = -lse(c) - ce * float(base + get<1>(coord(0, c)));
#pragma unroll
      for (int r = 0; r < size<0>(s); ++r) s(r, c) = exp2f(fmaf(s(r, c), tf.exp2_scale, col_term + key_term[r]));
    }
  }
  template <bool kMasked, bool kSoftcap = false, class TensorS, class TensorL, class TensorC>
  __device__ static void scores_to_p_capped(TensorS& s, const TensorL& lse, const TensorC& coord, const BwdWork& w,
                                            const ScoreTransform& tf, int m_block, int key0) {
    using namespace cute;
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
      int kb = 0, ke = 0;
      if constexpr (kMasked) {
        const int q = m_block * kBlockM + get<1>(coord(0, c));
        kb = w.mask.key_begin(q);
        ke = q < w.seq.seqlen_q ? w.mask.key_end(q) : 0;
      }
#pragma unroll
      for (int r = 0; r < size<0>(s); ++r) {
        float x = s(r, c);
        if constexpr (kSoftcap) x = tf.softcap * tanhf(x * tf.pre_scale);
        float p = exp2f(fmaf(x, tf.exp2_scale, -lse(c)));
        if constexpr (kMasked) {
          const int key = key0 + get<0>(coord(r, 0));
          if (key < kb || key >= ke) p = 0.f;
        }
        s(r, c) = p;
      }
    }
  }

  // dS^T = P^T (dP^T - D), times d(capped)/d(raw) = 1 - (capped / cap)^2 with softcap. The
  // capped score is recovered from P itself, (log2 P + LSE) / exp2_scale, so no second score
  // array stays live across the dP wait.
  template <bool kSoftcap, class TensorS, class TensorL, class TensorD>
  __device__ static void dp_to_ds(const TensorS& p, TensorS& ds, const TensorL& lse, const TensorD& dsum,
                                  const ScoreTransform& tf) {
    using namespace cute;
#pragma unroll
    for (int c = 0; c < size<1>(p); ++c) {
#pragma unroll
      for (int r = 0; r < size<0>(p); ++r) {
        float v = p(r, c) * (ds(r, c) - dsum(c));
        if constexpr (kSoftcap) {
          const float capped = (log2f(p(r, c)) + lse(c)) * (1.f / tf.exp2_scale);
          v = p(r, c) == 0.f ? 0.f : v * tf.dtanh_factor(capped);
        }
        ds(r, c) = v;
      }
    }
  }

  // dp_to_ds with ALiBi and dropout. The GEMM gave dP of the dropped P, so
  //   dS^T = P^T (keep * scale * dP^T - D)   (dropped entries: -P^T D),
  // and P^T keeps only the kept entries for dV += P^T dO (the 1 / keep probability multiplies
  // dV once, in the kernel). With softcap the capped score is P's exponent minus the bias.
  template <bool kSoftcap, class TensorS, class TensorL, class TensorD, class Keep, class TensorC>
  __device__ static void dp_to_ds_general(TensorS& p, TensorS& ds, const TensorL& lse, const TensorD& dsum,
                                          const ScoreTransform& tf, const ScoreMods& mods, const Keep& keep,
                                          const TensorC& coord, int key0, int query0, float dropout_scale) {
    using namespace cute;
    const bool dropout = mods.dropout();
#pragma unroll
    for (int c = 0; c < size<1>(p); ++c) {
#pragma unroll
      for (int r = 0; r < size<0>(p); ++r) {
        const bool kept = !dropout || keep.keep(r, c);
        const float dp = kept ? (dropout ? ds(r, c) * dropout_scale : ds(r, c)) : 0.f;
        float v = p(r, c) * (dp - dsum(c));
        if constexpr (kSoftcap) {
          float capped = (log2f(p(r, c)) + lse(c)) * (1.f / tf.exp2_scale);
          if (mods.alibi()) capped -= mods.alibi_units(query0 + get<1>(coord(r, c)), key0 + get<0>(coord(r, c)));
          v = p(r, c) == 0.f ? 0.f : v * tf.dtanh_factor(capped);
        }
        ds(r, c) = v;
        if (!kept) p(r, c) = 0.f;
      }
    }
  }

  // dp_to_ds_general for dropout alone (no ALiBi, no softcap): dS^T = P^T (keep * scale * dP^T - D);
  // P^T keeps the kept entries for dV.
  template <class TensorS, class TensorD, class Keep>
  __device__ static void dp_to_ds_dropout(TensorS& p, TensorS& ds, const TensorD& dsum, const Keep& keep,
                                          float dropout_scale) {
    using namespace cute;
#pragma unroll
    for (int c = 0; c < size<1>(p); ++c) {
#pragma unroll
      for (int r = 0; r < size<0>(p); ++r) {
        const bool kept = keep.keep(r, c);
        ds(r, c) = p(r, c) * ((kept ? ds(r, c) * dropout_scale : 0.f) - dsum(c));
        if (!kept) p(r, c) = 0.f;
      }
    }
  }

  __device__ static void bulk_reduce_add(float* gmem, const float* smem, int bytes) {
    const uint32_t s = cute::cast_smem_ptr_to_uint(smem);
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem), "r"(s),
                 "r"(bytes)
                 : "memory");
  }
  __device__ static void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

  __device__ static void wait_turn(int* sem, int expected) {
    int v;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    } while (v != expected);
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
  }
};

}  // namespace flashattn::sm90

// The consumer mainloop of one tile (FA3 Algorithm 1, consumer side), per warpgroup of 64 rows:
//   S_j = Q K_j^T  (SS-WGMMA, both from smem)
//   softcap, mask (boundary blocks only), online softmax -> P_j in registers (fp16/bf16)
//   O = O * scale_j + P_j V_j  (RS-WGMMA, P from registers)
// Key blocks run from the last down, so the block that needs masking (the causal diagonal or
// the seqlen_k edge) comes first. Two schedules, picked at runtime:
//   plain:   QK_j, wait, softmax_j, PV_j, wait.
//   overlap: issue QK_j, then PV of the previous block (its P is ready), wait for QK_j only
//            (warpgroup_wait<1>) and run block j's softmax while that PV runs, then wait.
// Pingpong (named_barriers.h) orders the GEMM issue of the consumer warpgroups.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"
#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/softmax.h"

namespace flashattn::sm90 {

// Issue one warpgroup GEMM (all K slices) as one async batch; the caller waits with
// warpgroup_wait<N>. Operand fences keep the compiler from moving register accesses of the
// accumulator (and of P for the RS GEMM) across the asynchronous region.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_async(TiledMma& mma, TA const& a, TB const& b, TC& c) {
  using namespace cute;
  constexpr bool kRS = !is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
}

// -inf outside [key_begin(i), key_end(i)); key_end <= seqlen_k, so keys past the end (TMA
// zero-filled, or the next varlen sequence) are masked too.
template <class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask(TensorS& s, const TensorC& c, const Mask& mask, int row0, int col0) {
#pragma unroll
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const int i = row0 + cute::get<0>(c(r, 0));
    const int kb = mask.key_begin(i), ke = mask.key_end(i);
#pragma unroll
    for (int k = 0; k < cute::size<1>(s); ++k) {
      const int j = col0 + cute::get<1>(c(r, k));
      if (j < kb || j >= ke) s(r, k) = -INFINITY;
    }
  }
}

template <class Traits, class SharedStorage>
struct Mainloop {
  using Element = typename Traits::Element;
  using P = Pipelines<Traits>;
  using TiledMmaQK = typename Traits::TiledMmaQK;
  using TiledMmaPV = typename Traits::TiledMmaPV;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  using AccO = decltype(cute::partition_fragment_C(TiledMmaPV{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kD>>{}));
  static constexpr int kRows = decltype(cute::size<0>(acc_rowcol(AccO{}.layout())))::value;  // 2
  using Softmax = WarpgroupSoftmax<kRows>;

  typename P::KVState kv_read;  // persists across tiles, like the producer's write state
  typename P::QState q_read;

  template <class TensorO>
  __device__ void run(SharedStorage& ss, typename P::Q& pipe_q, typename P::KV& pipe_k, typename P::KV& pipe_v,
                      const TileWork& w, int m_block, TensorO& tOrO, Softmax& sm,
                      const PingpongScheduler<Traits::kNumMmaWG>& ping, bool overlap, int mma_tidx) {
    using namespace cute;
    TiledMmaQK mma_qk;
    TiledMmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(mma_tidx);
    auto thr_pv = mma_pv.get_thread_slice(mma_tidx);
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Traits::SmemLayoutVt{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // descriptors (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, PIPE)
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(cute::Shape<cute::Int<kBlockM>, Int<kBlockN>>{}));
    Tensor cS = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));  // (row, col) in the tile
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    const int row0 = m_block * kBlockM;

    // Softcap + boundary mask + online softmax of one S block; leaves P (fp32) in tSrS.
    auto softmax_block = [&](auto& tSrS, int n, float(&scale)[kRows]) {
      Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      sm.apply_softcap(s);
      if (w.mask.tile_needs_mask(row0, kBlockM, n * kBlockN, kBlockN)) apply_mask(s, cS, w.mask, row0, n * kBlockN);
      sm.step(s, scale);
    };
    auto new_s = [&]() { return partition_fragment_C(mma_qk, cute::Shape<cute::Int<kBlockM>, Int<kBlockN>>{}); };
    using AccS = decltype(new_s());
    auto tOrP = make_tensor<Element>(acc_as_a_operand(AccS{}.layout()));

    float scale[kRows];
    int n = w.n_end - 1;
    pipe_q.consumer_wait(q_read);
    if (overlap) {
      {
        Tensor tSrS = new_s();
        pipe_k.consumer_wait(kv_read);
        ping.wait_turn();
        gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
        ping.pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(kv_read);
        softmax_block(tSrS, n, scale);
        convert_fragment(tSrS, tOrP);
      }
      for (--n; n >= w.n_begin; --n) {
        typename P::KVState v_read = kv_read;  // V of the previous block
        ++kv_read;
        Tensor tSrS = new_s();
        pipe_k.consumer_wait(kv_read);
        ping.wait_turn();
        gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
        rescale_rows(o_rc, scale);
        pipe_v.consumer_wait(v_read);
        gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
        ping.pass_turn();
        warpgroup_wait<1>();  // S_j ready; P_{j+1} V_{j+1} still running
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(kv_read);
        softmax_block(tSrS, n, scale);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        pipe_v.consumer_release(v_read);
        convert_fragment(tSrS, tOrP);
      }
      pipe_q.consumer_release(q_read);  // every Q K^T of the tile has completed
      rescale_rows(o_rc, scale);
      pipe_v.consumer_wait(kv_read);
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, kv_read.index()), tOrO);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      pipe_v.consumer_release(kv_read);
      ++kv_read;
    } else {
      for (; n >= w.n_begin; --n) {
        Tensor tSrS = new_s();
        pipe_k.consumer_wait(kv_read);
        ping.wait_turn();
        gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
        ping.pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        pipe_k.consumer_release(kv_read);
        softmax_block(tSrS, n, scale);
        convert_fragment(tSrS, tOrP);
        rescale_rows(o_rc, scale);
        pipe_v.consumer_wait(kv_read);
        gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, kv_read.index()), tOrO);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        pipe_v.consumer_release(kv_read);
        ++kv_read;
      }
      pipe_q.consumer_release(q_read);
    }
    ++q_read;
  }
};

}  // namespace flashattn::sm90

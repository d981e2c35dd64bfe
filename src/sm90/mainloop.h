// The consumer mainloop (FA3 Algorithm 1, consumer side), per warpgroup of 64 rows:
//   S_j = Q K_j^T  (SS-WGMMA, both from smem)
//   softcap, mask (boundary blocks only), online softmax -> P_j in registers (fp16/bf16)
//   O = O * scale_j + P_j V_j  (RS-WGMMA, P from registers)
// Key blocks run from the last down, so the block that needs masking (the causal diagonal or
// the seqlen_k edge) comes first. Two schedules, picked at compile time (Schedule::kOverlap):
//   overlap: issue QK_j, then PV of the previous block (its P is ready), wait for QK_j only
//            (warpgroup_wait<1>) and run block j's softmax while that PV runs, then wait.
//            A tile is head() (its first block: QK + softmax, nothing to overlap), body()
//            (every other block) and tail() (the last block's PV).
//   plain:   run_plain() (ablation): per block QK_j, wait, softmax_j, PV_j, wait.
// Pingpong (named_barriers.h, Schedule::kPingpong) orders the GEMM issue of the consumer
// warpgroups: one turn per key block (head, each body block).
#pragma once

#include <cfloat>

#include <cute/tensor.hpp>

#include "common/dropout_tile.h"
#include "common/mask.h"
#include "sm90/gemm.h"
#include "sm90/kernel_params.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/producer.h"
#include "sm90/softmax.h"

namespace flashattn::sm90 {

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

// The consumers' schedule (FA3 paper, section 3.1 and 3.2): kPingpong = inter-warpgroup
// pingpong, kOverlap = intra-warpgroup overlap of softmax and GEMMs. The production kernels have
// both (the defaults), except two FP8 kernels that measured faster without turns (launch.h
// SchedFp8); the ablation kernels, with one or both off, are compiled only with
// -DFLASHATTN_SM90_ABLATION=ON (flashattn_sm90_set_ablation, flashattn-bench --ablation).
template <bool kPingpong_ = true, bool kOverlap_ = true>
struct Schedule {
  static constexpr bool kPingpong = kPingpong_;
  static constexpr bool kOverlap = kOverlap_;
};

// The other schedules (named, so that macros and generated files can spell them).
using SchedulePingpongOff = Schedule<false, true>;
using ScheduleOverlapOff = Schedule<true, false>;
using ScheduleBothOff = Schedule<false, false>;

template <class Traits, class Sched = Schedule<>>
struct Mainloop {
  using Element = typename Traits::Element;
  using SharedStorage = typename Producer<Traits>::TensorStorage;  // Q, K, V, filled by the producer
  using Pingpong = PingpongScheduler<Traits::kNumMmaWG, Sched::kPingpong>;
  using P = Pipelines<Traits>;
  using TiledMmaQK = typename Traits::TiledMmaQK;
  using TiledMmaPV = typename Traits::TiledMmaPV;
  static constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kD = Traits::kHeadDim;
  using AccO = decltype(cute::partition_fragment_C(TiledMmaPV{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kD>>{}));
  using AccS = decltype(cute::partition_fragment_C(TiledMmaQK{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}));
  static constexpr bool kFp8 = Traits::kFp8;
  // P as the A operand of P V: 16-bit, S's own register order; FP8, the A fragment of the FP8
  // WGMMA (4 keys per register), filled by convert_p.
  using FragP16 = decltype(cute::make_tensor<Element>(acc_as_a_operand(AccS{}.layout())));
  using FragP8 = decltype(TiledMmaPV{}.get_slice(0).partition_fragment_A(cute::make_tensor(
      cute::make_smem_ptr(static_cast<Element*>(nullptr)), cute::Layout<cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>>{})));
  using FragP = std::conditional_t<kFp8, FragP8, FragP16>;
  static constexpr int kRows = decltype(cute::size<0>(acc_rowcol(AccO{}.layout())))::value;  // 2
  using Softmax = WarpgroupSoftmax<kRows, (kD >= kLazyMaxMinHeadDim) && !kFp8, kFp8 ? 8 : 0>;

  typename P::KVState kv_read;  // persists across tiles, like the producer's write state
  typename P::QState q_read;
  FragP tOrP;                   // P of the block whose P V is still to be issued
  float scale[kRows];           // what O is multiplied by before that P V
  bool rescale_o;               // some row of this warp has scale != 1 (warp-uniform)
  // Whether a key block other than the tile's first (n_end - 1) can need the key mask: only with a
  // window (causal included). Without one only the first can reach past seqlen_k, so the other
  // blocks skip Mask::tile_needs_key_mask (~40 instructions a block on the way to the softmax).
  bool inner_may_mask;
  // FP8: O is kept in units of v_scale, the largest V scale of the tile's blocks so far. A
  // block with a smaller scale vs multiplies its P by vs / v_scale inside the softmax's exp2
  // (P stays <= 2^8: no overflow, and no per-score work); one with a larger scale rescales O by
  // the ratio with the softmax's factor (rare: a new maximum) and becomes v_scale. The epilogue
  // applies v_scale (o_scale). A block whose V scale is 0 adds nothing (v_zero: its P is cleared).
  ScoreTransform tf_base;  // the softmax's transform before this tile's Q/K scales
  float v_scale;
  bool v_zero;
  // FP8 scale reads, off the softmax's path: Q's once per tile (q_s, this warpgroup's rows);
  // K's and V's of a key block before its Q K^T is issued (next_scales), the block found by
  // walking the scale blocks down with the key blocks (k_idx, k_rem: no division per block).
  float q_s;
  int k_idx, k_rem;  // the next key block's scale block, and its first key's offset in it
  // kLeanBody: the wide FP8 kernel (hdim 128's 192-key block, launch.h) runs only unmasked, without
  // softcap or ALiBi, with one K/V scale per head, so every block of a tile has the first block's
  // scales. Its blocks after the first take the lean softmax (FA3's unmasked loop): no per-block scale
  // reads or V-scale ratio, no score-mod or mask tests, no -inf guards (after head() every row's max
  // is finite: the first block holds a key of the sequence). exp2_tile: the exp2 multiplier with the
  // tile's Q/K scales.
  static constexpr bool kWideFp8 = kFp8 && kBlockN != Traits::Cfg::kBlockN;
  static constexpr bool kLeanBody = kWideFp8 && Traits::kWideScales == Fp8WideScales::kPerHead;
  float exp2_tile;
  // kGroupBody: the wide FP8 kernel with K/V scale blocks (multiples of 128 keys): a 192-key block straddles two,
  // so each 64-key group of it takes its own scales inside one softmax pass (group_softmax; FA3 has no block
  // scales). Unmasked, no softcap or ALiBi, as kLeanBody; the first block is masked at the sequence's end.
  static constexpr bool kGroupBody = kWideFp8 && Traits::kWideScales == Fp8WideScales::kPer64Keys;
  static_assert(!kGroupBody || kBlockN == 192, "group_softmax: three 64-key groups, at most one scale-block boundary");
  int k_last;  // kGroupBody: the sequence's last scale block
  // kDoubleP: body() keeps P in two register sets (body_double_p says why). FP8 up to hdim 128 only: its P is 24
  // registers at the 192-key block; 16-bit P is twice that and a second set does not fit beside S and O, nor
  // beside hdim 256's 128-register O (ptxas then serializes the WGMMAs, C7520).
  static constexpr bool kDoubleP = kFp8 && kD <= 128;

  static_assert(!kFp8 || kBlockN == 128 || kBlockN == Traits::Cfg::kBlockNUnmasked,
                "next_scales steps one 128-key scale block per key block (launch.cu's kKeysPerKScale); "
                "the wide FP8 block takes one K/V scale per head or per 64-key group (launch.h)");
  // The K and V scales of one key block (FP8; 1 for 16-bit).
  struct BlockScales {
    float k = 1.f, v = 1.f;
  };
  // kGroupBody: a key block's scales. Group g (its keys 64 g .. 64 g + 63) has scale block a's (the block's first
  // key's) or, past a's end, the next one's, b's (in_b1, in_b2: groups 1 and 2). Scale blocks are multiples of 128
  // keys and key blocks start at multiples of 64, so a block straddles at most one boundary.
  struct GroupScales {
    float ka, kb, va, vb;
    bool in_b1, in_b2;
  };
  using Scales = std::conditional_t<kGroupBody, GroupScales, BlockScales>;

  struct Pipes {
    typename P::Q& q;
    typename P::KV& k;
    typename P::VRead& v;  // the TMA pipeline, or FP8's transposed copy
  };

  // What O must still be multiplied by (FP8: the last V block's scale).
  __device__ float o_scale() const { return kFp8 ? v_scale : 1.f; }

  // One tile with keys: O (zeroed by the caller) += softmax(Q K^T) V over its key blocks.
  template <class TensorO>
  __device__ void run(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, TensorO& tOrO, Softmax& sm,
                      const Pingpong& ping, int mma_tidx) {
    inner_may_mask = w.mask.window_left >= 0 || w.mask.window_right >= 0;
    if constexpr (kFp8) {
      tf_base = sm.tf;
      q_s = w.fp8.q_at(m_block * kBlockM + 64 * (mma_tidx / 128));
      const int key0 = (w.n_end - 1) * kBlockN;
      k_idx = key0 / w.fp8.k_block;
      k_rem = key0 - k_idx * w.fp8.k_block;
      if constexpr (kGroupBody) {
        k_last = (w.seq.seqlen_k - 1) / w.fp8.k_block;
        v_scale = FLT_MIN;  // the first block's largest V scale becomes O's unit (group_softmax)
        v_zero = false;     // a zero V scale's P rounds to zero there
      } else {
        v_scale = w.fp8.v[k_idx];
      }
    }
    if constexpr (Sched::kOverlap) {
      head(ss, pipes, w, m_block, sm, ping, mma_tidx);
      body(ss, pipes, w, m_block, tOrO, sm, ping, mma_tidx);
      tail(ss, pipes, tOrO, mma_tidx);
    } else {
      run_plain(ss, pipes, w, m_block, tOrO, sm, ping, mma_tidx);
    }
  }

  // First key block of a tile: S = Q K^T, softmax -> P. Nothing of this warpgroup overlaps it.
  __device__ void head(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, Softmax& sm,
                       const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    if constexpr (kLeanBody) {
      if (w.seq.seqlen_k - (w.n_end - 1) * kBlockN <= 64) {  // the sequence's last keys, in the first block
        head_narrow(ss, pipes, w, m_block, sm, ping, mma_tidx);
        return;
      }
    }
    TiledMmaQK mma_qk;
    Tensor tSrS = new_s();
    const Scales bs = next_scales(w);
    pipes.q.consumer_wait(q_read);
    pipes.k.consumer_wait(kv_read);
    ping.wait_turn();
    gemm_async<true>(mma_qk, q_frag(ss, mma_tidx)(_, _, _, q_read.index()), k_frag(ss, mma_tidx)(_, _, _, kv_read.index()), tSrS);
    ping.pass_turn();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    pipes.k.consumer_release(kv_read);
    if constexpr (kGroupBody) {
      group_head_softmax(tSrS, w, m_block, bs, sm, mma_tidx);
    } else {
      softmax_block(tSrS, w, m_block, w.n_end - 1, bs, sm, mma_tidx);
    }
    if constexpr (kLeanBody) exp2_tile = sm.tf.exp2_scale;  // fp8_scales folded the Q/K scales in
    convert_p(tSrS, w, m_block, w.n_end - 1, mma_tidx);
  }

  // kLeanBody: a first block that holds at most 64 keys of the sequence (4096 and 16384 keys are 21 or 85 blocks of
  // 192 plus 64): its Q K^T on those 64 keys only (m64n64 instead of m64n192) and the lean softmax (step_finite
  // takes the rows' -inf start: every row has a key there); P's other keys are zero, so the first body step's P V
  // stays full width. Unmasked but for the sequence's end (kLeanBody), so only that mask is tested.
  using TiledMmaQK64 = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<cute::Int<kBlockM>, cute::_64, cute::Int<kD>>>(),
      typename Traits::AtomLayoutMma{}));
  __device__ void head_narrow(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, Softmax& sm,
                              const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    TiledMmaQK64 mma;
    auto thr = mma.get_thread_slice(mma_tidx);
    Tensor tSrS = partition_fragment_C(mma, cute::Shape<Int<kBlockM>, _64>{});
    const BlockScales bs = next_scales(w);
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    Tensor sK64 = local_tile(sK, cute::Shape<_64, Int<kD>, Int<Traits::kStages>>{}, make_coord(_0{}, _0{}, _0{}));
    Tensor tSrQ = thr.partition_fragment_A(sQ);
    Tensor tSrK = thr.partition_fragment_B(sK64);
    pipes.q.consumer_wait(q_read);
    pipes.k.consumer_wait(kv_read);
    ping.wait_turn();
    gemm_async<true>(mma, tSrQ(_, _, _, q_read.index()), tSrK(_, _, _, kv_read.index()), tSrS);
    ping.pass_turn();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    pipes.k.consumer_release(kv_read);
    exp2_tile = tf_base.exp2_scale * qk_scale(bs);
    v_zero = bs.v == 0.f;
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    const int row0 = m_block * kBlockM, col0 = (w.n_end - 1) * kBlockN;
    if (w.mask.tile_needs_key_mask(row0, kBlockM, col0, 64)) {
      Tensor tScS = thr.partition_C(make_identity_tensor(cute::Shape<Int<kBlockM>, _64>{}));
      apply_mask(s, make_tensor(tScS.data(), acc_rowcol(tScS.layout())), w.mask, row0, col0);
    }
    rescale_o = sm.step_finite(s, exp2_tile, scale);
    pack_p_fp8<64>(tSrS, tOrP);  // S's 32 registers hold keys 0-63 in the wide S's order
  }

  // Key blocks n_end-2 .. n_begin: QK_j issued before PV_{j+1}; softmax_j runs under PV_{j+1}.
  // Leaves the last block's P V to tail(); frees this tile's Q.
  template <class TensorO>
  __device__ void body(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, TensorO& tOrO, Softmax& sm,
                       const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    if constexpr (kDoubleP) {
      body_double_p(ss, pipes, w, m_block, tOrO, sm, ping, mma_tidx);
    } else {
      TiledMmaQK mma_qk;
      TiledMmaPV mma_pv;
      auto [tSrQ, tSrK, tOrV] = operands(ss, mma_tidx);
      Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
      for (int n = w.n_end - 2; n >= w.n_begin; --n) {
        const typename P::KVState v_read = advance_kv();  // V of the previous block
        Tensor tSrS = new_s();
        const Scales bs = body_scales(w);
        pipes.k.consumer_wait(kv_read);
        ping.wait_turn();
        gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
        if (rescale_o) rescale_rows(o_rc, scale);
        pipes.v.consumer_wait(v_read);
        gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, v_read.index()), tOrO);
        softmax_under_pv(pipes, tSrS, w, m_block, n, bs, sm, ping, mma_tidx);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        pipes.v.consumer_release(v_read);
        convert_p(tSrS, w, m_block, n, mma_tidx, tOrP);
      }
    }
    pipes.q.consumer_release(q_read);  // every Q K^T of the tile has completed
    ++q_read;
  }

  // body() with P in two register sets (kDoubleP): block j's P is written into one while P_{j+1} V_{j+1} still
  // reads the other, so that P V is waited for only in the next step, after its turn's barrier. With one set,
  // ptxas places that wait ahead of the softmax's exponentials (it schedules them next to the conversions that
  // overwrite P), and softmax_j overlaps P_{j+1} V_{j+1} only in its row maxima. Two steps per trip, the sets
  // swapping roles; an odd last step leaves P in the second set, copied back for tail().
  template <class TensorO>
  __device__ void body_double_p(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, TensorO& tOrO,
                                Softmax& sm, const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    auto ops = operands(ss, mma_tidx);
    FragP tOrP2;
    PendingPV pending;
    int n = w.n_end - 2;
    for (; n > w.n_begin; n -= 2) {
      step_double_p(pipes, ops, w, m_block, tOrO, sm, ping, mma_tidx, n, tOrP, tOrP2, pending);
      step_double_p(pipes, ops, w, m_block, tOrO, sm, ping, mma_tidx, n - 1, tOrP2, tOrP, pending);
    }
    const bool odd = n == w.n_begin;
    if (odd) step_double_p(pipes, ops, w, m_block, tOrO, sm, ping, mma_tidx, n, tOrP, tOrP2, pending);
    warpgroup_wait<0>();  // unconditional: ptxas must see no GEMM running on any path here (else it serializes, C7514)
    warpgroup_fence_operand(tOrO);
    if (pending.valid) pipes.v.consumer_release(pending.v);
    if (odd) {
      constexpr int kWords = int(decltype(cute::cosize(FragP{}.layout()))::value * sizeof(Element) / 4);
      uint32_t* to = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
      const uint32_t* from = reinterpret_cast<const uint32_t*>(raw_pointer_cast(tOrP2.data()));
#pragma unroll
      for (int i = 0; i < kWords; ++i) to[i] = from[i];
    }
  }

  // The pipeline read state of the block a body step issues P V for (returned), and K's moved to the next block.
  __device__ typename P::KVState advance_kv() {
    const typename P::KVState prev = kv_read;
    ++kv_read;
    return prev;
  }
  // A body block's K/V scales (FP8 with scale blocks; the lean body keeps the tile's first block's).
  __device__ Scales body_scales(const TileWork& w) {
    Scales bs{};
    if constexpr (!kLeanBody) bs = next_scales(w);
    return bs;
  }
  // After a body step's GEMMs are issued: the turn passed, S waited for (the P V still running), K released, the
  // softmax.
  template <class TensorS>
  __device__ void softmax_under_pv(Pipes pipes, TensorS& tSrS, const TileWork& w, int m_block, int n,
                                   const Scales& bs, Softmax& sm, const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    ping.pass_turn();
    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    pipes.k.consumer_release(kv_read);
    body_softmax(tSrS, w, m_block, n, bs, sm, mma_tidx);
  }

  // A body block's softmax: the lean one (kLeanBody) or the general one; sets rescale_o and scale.
  template <class TensorS>
  __device__ void body_softmax(TensorS& tSrS, const TileWork& w, int m_block, int n, const Scales& bs, Softmax& sm,
                               int mma_tidx) {
    using namespace cute;
    if constexpr (kLeanBody) {
      rescale_o = sm.step_finite(make_tensor(tSrS.data(), acc_rowcol(tSrS.layout())), exp2_tile, scale);
    } else if constexpr (kGroupBody) {
      rescale_o = group_softmax(tSrS, bs, sm);
    } else {
      softmax_block(tSrS, w, m_block, n, bs, sm, mma_tidx);
    }
  }

  // The P V a double-P step leaves running, and its V stage (released once it is waited for).
  struct PendingPV {
    bool valid = false;
    typename P::KVState v;
  };

  // One step of body_double_p, key block n: after the turn's barrier, the previous step's P V (done: it ran under
  // that step's softmax) is waited for and its V released, O rescaled; Q K^T_n and P_{n+1} V_{n+1} (p_in) issued;
  // softmax_n under the latter; P_n -> p_out, which no running GEMM reads.
  template <class Ops, class TensorO>
  __device__ void step_double_p(Pipes pipes, Ops& ops, const TileWork& w, int m_block, TensorO& tOrO, Softmax& sm,
                                const Pingpong& ping, int mma_tidx, int n, FragP& p_in, FragP& p_out,
                                PendingPV& pending) {
    using namespace cute;
    TiledMmaQK mma_qk;
    TiledMmaPV mma_pv;
    auto& [tSrQ, tSrK, tOrV] = ops;
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    const typename P::KVState v_read = advance_kv();  // V of block n + 1
    Tensor tSrS = new_s();
    // kGroupBody reads its scales once the GEMMs are issued: held across the issue, its six registers made the
    // wide loop spill around the turn's barrier (s32).
    Scales bs{};
    if constexpr (!kGroupBody) bs = body_scales(w);
    pipes.k.consumer_wait(kv_read);
    ping.wait_turn();
    // Here, after the barrier (which ptxas does not hoist it over), and before any GEMM is issued, so that O may be
    // rescaled outside every GEMM's pipeline stage.
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    if (pending.valid) pipes.v.consumer_release(pending.v);
    if (rescale_o) rescale_rows(o_rc, scale);
    gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
    pipes.v.consumer_wait(v_read);
    gemm_async<false>(mma_pv, p_in, tOrV(_, _, _, v_read.index()), tOrO);
    if constexpr (kGroupBody) bs = body_scales(w);
    softmax_under_pv(pipes, tSrS, w, m_block, n, bs, sm, ping, mma_tidx);
    convert_p(tSrS, w, m_block, n, mma_tidx, p_out);
    pending.v = v_read;
    pending.valid = true;
  }

  // The last block's P V.
  template <class TensorO>
  __device__ void tail(SharedStorage& ss, Pipes pipes, TensorO& tOrO, int mma_tidx) {
    using namespace cute;
    TiledMmaPV mma_pv;
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    if (rescale_o) rescale_rows(o_rc, scale);
    pipes.v.consumer_wait(kv_read);
    gemm_async<false>(mma_pv, tOrP, v_frag(ss, mma_tidx)(_, _, _, kv_read.index()), tOrO);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    pipes.v.consumer_release(kv_read);
    ++kv_read;
  }

  // The plain schedule (ablation): one whole tile, each block's GEMMs waited for in turn.
  template <class TensorO>
  __device__ void run_plain(SharedStorage& ss, Pipes pipes, const TileWork& w, int m_block, TensorO& tOrO,
                            Softmax& sm, const Pingpong& ping, int mma_tidx) {
    using namespace cute;
    TiledMmaQK mma_qk;
    TiledMmaPV mma_pv;
    auto [tSrQ, tSrK, tOrV] = operands(ss, mma_tidx);
    Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
    pipes.q.consumer_wait(q_read);
    for (int n = w.n_end - 1; n >= w.n_begin; --n) {
      Tensor tSrS = new_s();
      const Scales bs = next_scales(w);
      pipes.k.consumer_wait(kv_read);
      ping.wait_turn();
      gemm_async<true>(mma_qk, tSrQ, tSrK(_, _, _, kv_read.index()), tSrS);
      ping.pass_turn();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      pipes.k.consumer_release(kv_read);
      softmax_block(tSrS, w, m_block, n, bs, sm, mma_tidx);
      convert_p(tSrS, w, m_block, n, mma_tidx);
      if (rescale_o) rescale_rows(o_rc, scale);
      pipes.v.consumer_wait(kv_read);
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, kv_read.index()), tOrO);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      pipes.v.consumer_release(kv_read);
      ++kv_read;
    }
    pipes.q.consumer_release(q_read);
    ++q_read;
  }

 private:
  // FP8: the scales of the key block the cursor is at (read now: the caller issues this before
  // the block's Q K^T), then the cursor moves to the block below. 16-bit: nothing to read.
  __device__ Scales next_scales(const TileWork& w) {
    if constexpr (kGroupBody) {
      return next_group_scales(w);
    } else {
      BlockScales b;
      if constexpr (kFp8) {
        b.k = w.fp8.k[k_idx];
        b.v = w.fp8.v[k_idx];
        k_rem -= kBlockN;
        if (k_rem < 0) {
          --k_idx;
          k_rem += w.fp8.k_block;
        }
      }
      return b;
    }
  }

  __device__ GroupScales next_group_scales(const TileWork& w) {
    GroupScales g;
    const int ib = min(k_idx + 1, k_last);  // past the sequence's last scale block every key is masked
    g.ka = w.fp8.k[k_idx];
    g.va = w.fp8.v[k_idx];
    g.kb = w.fp8.k[ib];
    g.vb = w.fp8.v[ib];
    g.in_b1 = k_rem + 64 >= w.fp8.k_block;
    g.in_b2 = k_rem + 128 >= w.fp8.k_block;
    k_rem -= kBlockN;
    if (k_rem < 0) {
      --k_idx;
      k_rem += w.fp8.k_block;
    }
    if (k_rem < 0) {  // 192 keys can pass a whole 128-key scale block
      --k_idx;
      k_rem += w.fp8.k_block;
    }
    return g;
  }

  // kGroupBody: the first block (the sequence's end masked), then group_softmax.
  template <class TensorS>
  __device__ void group_head_softmax(TensorS& tSrS, const TileWork& w, int m_block, const GroupScales& g, Softmax& sm,
                                     int mma_tidx) {
    using namespace cute;
    const int row0 = m_block * kBlockM, col0 = (w.n_end - 1) * kBlockN;
    if (w.mask.tile_needs_key_mask(row0, kBlockM, col0, kBlockN)) {
      Tensor tScS = TiledMmaQK{}.get_thread_slice(mma_tidx).partition_C(
          make_identity_tensor(cute::Shape<cute::Int<kBlockM>, Int<kBlockN>>{}));
      Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      apply_mask(s, make_tensor(tScS.data(), acc_rowcol(tScS.layout())), w.mask, row0, col0);
    }
    rescale_o = group_softmax(tSrS, g, sm);
  }

  // kGroupBody: a block's softmax with its groups' scales (the FP8 scheme of softmax_block per group): O's unit
  // v_scale becomes the block's largest V scale where that is larger (O rescaled by the ratio with the softmax's
  // factor); a group with a smaller V scale shifts its P's exponent by the log2 ratio, clamped at -64 (a zero scale:
  // its P rounds to E4M3 zero), and its row sum is weighted back by 2^-shift, so l stays the softmax's denominator.
  template <class TensorS>
  __device__ bool group_softmax(TensorS& tSrS, const GroupScales& g, Softmax& sm) {
    using namespace cute;
    const float vb = g.in_b2 ? g.vb : g.va;  // group 2 is in b whenever group 1 is
    const float v_blk = fmaxf(g.va, vb);
    const bool new_unit = v_blk > v_scale;
    const float ratio = v_scale / v_blk;
    if (new_unit) v_scale = v_blk;
    const float inv_unit = 1.f / v_scale;
    const float ta = fmaxf(__log2f(g.va * inv_unit), -64.f), tb = fmaxf(__log2f(vb * inv_unit), -64.f);
    const float wa = exp2f(-ta), wb = exp2f(-tb);
    // The Q/K scales floored as in softmax_block (a zero scale would make a masked score NaN).
    const float ea = tf_base.exp2_scale * fmaxf(q_s * g.ka, 1e-30f);
    const float eb = tf_base.exp2_scale * fmaxf(q_s * g.kb, 1e-30f);
    const float e[3] = {ea, g.in_b1 ? eb : ea, g.in_b2 ? eb : ea};
    const float t[3] = {ta, g.in_b1 ? tb : ta, g.in_b2 ? tb : ta};
    const float wl[3] = {wa, g.in_b1 ? wb : wa, g.in_b2 ? wb : wa};
    bool rescale = sm.step_groups(make_tensor(tSrS.data(), acc_rowcol(tSrS.layout())), e, t, wl, scale);
    if (new_unit) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) scale[r] *= ratio;
      rescale = true;
    }
    return rescale;
  }

  __device__ static auto new_s() { return cute::partition_fragment_C(TiledMmaQK{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}); }
  // WGMMA descriptors of this warpgroup's operands: (MMA, MMA_M|N, MMA_K, stage).
  __device__ static auto q_frag(SharedStorage& ss, int mma_tidx) {
    cute::Tensor sQ = cute::make_tensor(cute::make_smem_ptr(ss.smem_q.data()), typename Traits::SmemLayoutQ{});
    return TiledMmaQK{}.get_thread_slice(mma_tidx).partition_fragment_A(sQ);
  }
  __device__ static auto k_frag(SharedStorage& ss, int mma_tidx) {
    cute::Tensor sK = cute::make_tensor(cute::make_smem_ptr(ss.smem_k.data()), typename Traits::SmemLayoutK{});
    return TiledMmaQK{}.get_thread_slice(mma_tidx).partition_fragment_B(sK);
  }
  // This tile's Q (its stage), and K and V of every stage.
  __device__ auto operands(SharedStorage& ss, int mma_tidx) const {
    using namespace cute;
    return cute::make_tuple(q_frag(ss, mma_tidx)(_, _, _, q_read.index()), k_frag(ss, mma_tidx), v_frag(ss, mma_tidx));
  }
  __device__ static auto v_frag(SharedStorage& ss, int mma_tidx) {
    // 16-bit: V's own bytes read MN-major; FP8: the transposed copy (producer.h VTransposer).
    Element* vt = nullptr;
    if constexpr (Traits::kTransposeV) vt = ss.smem_vt.data();
    else vt = ss.smem_v.data();
    cute::Tensor sVt = cute::make_tensor(cute::make_smem_ptr(vt), typename Traits::SmemLayoutVt{});
    return TiledMmaPV{}.get_thread_slice(mma_tidx).partition_fragment_B(sVt);
  }

  // Softcap + ALiBi + boundary mask + online softmax of key block n; leaves P (fp32) in tSrS
  // and the O rescale factors in scale. The softmax sums the undropped P (the LSE ignores
  // dropout); convert_p drops entries, and the epilogue applies the 1 / keep probability to O.
  template <class TensorS>
  __device__ void softmax_block(TensorS& tSrS, const TileWork& w, int m_block, int n, const BlockScales& bs, Softmax& sm,
                                int mma_tidx) {
    using namespace cute;
    Tensor s = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
    const int row0 = m_block * kBlockM, col0 = n * kBlockN;
    if constexpr (kFp8) fp8_scales(s, w, qk_scale(bs), sm);
    sm.apply_softcap(s);
    Tensor tScS = TiledMmaQK{}.get_thread_slice(mma_tidx).partition_C(
        make_identity_tensor(cute::Shape<cute::Int<kBlockM>, Int<kBlockN>>{}));
    Tensor cS = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
    constexpr int kRows = decltype(size<0>(s))::value;
    float row_add[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) row_add[r] = 0.f;
    if (w.mods.alibi()) {
      // Where i + diag - j has one sign over the tile, ALiBi's bias is a key term (one FFMA per
      // score, its column offset an immediate) plus a query term the softmax adds per row; the
      // other tiles add -coef |i + diag - j| per score (two operations).
      const int base = row0 + w.mods.alibi_diag - col0;  // i + diag - j at the tile's origin
      if (base - (kBlockN - 1) >= 0 || base + (kBlockM - 1) <= 0) {
        alibi_fold(s, cS, base >= 0 ? 1.f : -1.f, base, w.mods, row_add);
      } else {
        alibi_apply<true>(s, cS, row0, col0, w.mods);
      }
    }
    // Rows past seqlen_q are not masked: their scores are finite (TMA zero fill, or the next
    // varlen sequence) and the epilogue never stores them.
    if ((n == w.n_end - 1 || inner_may_mask) && w.mask.tile_needs_key_mask(row0, kBlockM, col0, kBlockN))
      apply_mask(s, cS, w.mask, row0, col0);
    if constexpr (kFp8) {
      // P V adds in units of this block's V scale vs; O is in v_scale's (tile-uniform values,
      // so rescale_o stays warp-uniform).
      const float vs = bs.v;
      v_zero = vs == 0.f;
      float p_shift_log2 = 0.f, l_weight = 1.f;
      const bool new_max = vs > v_scale;
      if (!v_zero && vs < v_scale) {
        // Clamped: below 2^-64 every P' of the block (<= 2^8 2^-64) rounds to E4M3 zero either
        // way, and l, which undoes the shift, keeps the block's sum in fp32's range.
        p_shift_log2 = fmaxf(__log2f(vs / v_scale), -64.f);  // < 0
        l_weight = exp2f(-p_shift_log2);                      // the factor the exp2 applied, undone in l
      }
      rescale_o = sm.step(s, scale, row_add, p_shift_log2, l_weight);
      if (new_max) {  // O so far, to the new unit
        const float ratio = v_scale / vs;
#pragma unroll
        for (int r = 0; r < kRows; ++r) scale[r] *= ratio;
        rescale_o = true;
        v_scale = vs;
      }
    } else {
      rescale_o = sm.step(s, scale, row_add);
    }
  }

  // The Q/K scale product of a block. A zero Q or K scale (the caller's: the quantizer writes >= FLT_MIN) would make a
  // masked score -inf * 0 = NaN; 1e-30 (normal after the softmax scale, flush-to-zero is on) leaves every such score
  // ~0 (|codes' dot| < 448^2 256).
  __device__ float qk_scale(const BlockScales& bs) const { return fmaxf(q_s * bs.k, 1e-30f); }

  // FP8: S holds Q K^T of the codes; the scores are q_scale k_scale times that. The product
  // folds into the transform (the softmax scale, or the softcap's pre-scale: free), except
  // with ALiBi and no softcap, whose bias is added to true scores: S is scaled there.
  template <class TensorS>
  __device__ void fp8_scales(TensorS& s, const TileWork& w, float qk, Softmax& sm) const {
    sm.tf = tf_base;
    if (tf_base.softcap > 0.f) {
      sm.tf.pre_scale = tf_base.pre_scale * qk;
    } else if (w.mods.alibi()) {
#pragma unroll
      for (int i = 0; i < cute::size(s); ++i) s(i) *= qk;
    } else {
      sm.tf.exp2_scale = tf_base.exp2_scale * qk;
    }
  }

  // ALiBi on a tile where t = i + diag - j = base + dq - dk has one sign: -coef |t| =
  // coef sign dk - coef sign (base + dq). With dk = dk0 + dc (dc this thread's column offset
  // from its first column, a constant once unrolled) the score gets coef sign dc and row r the
  // rest, coef sign (dk0 - base - dq_r).
  template <class TensorS, class TensorC, int kRows>
  __device__ static void alibi_fold(TensorS& s, const TensorC& cS, float sign, int base, const ScoreMods& mods,
                                    float (&row_add)[kRows]) {
    using namespace cute;
    const float ce = mods.alibi_coef * sign;
    const int dk0 = get<1>(cS(0, 0));
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_add[r] = ce * float(dk0 - base - get<0>(cS(r, 0)));
#pragma unroll
      for (int c = 0; c < size<1>(s); ++c) s(r, c) = fmaf(ce, float(get<1>(cS(0, c)) - dk0), s(r, c));
    }
  }

  // P_j (fp32) -> the 16-bit A operand of P V, dropped entries zeroed there: after the
  // conversion S is dead, so the Philox draws find registers free (on S they spilled).
  template <class TensorS>
  __device__ void convert_p(const TensorS& tSrS, const TileWork& w, int m_block, int n, int mma_tidx) {
    convert_p(tSrS, w, m_block, n, mma_tidx, tOrP);
  }
  template <class TensorS>
  __device__ void convert_p(const TensorS& tSrS, const TileWork& w, int m_block, int n, int mma_tidx, FragP& out) {
    using namespace cute;
    if constexpr (kFp8) {
      convert_p_fp8(tSrS, out);
      return;
    }
    convert_fragment(tSrS, out);
    if (w.mods.dropout()) {
      Tensor p = make_tensor(out.data(), acc_rowcol(tSrS.layout()));  // same register order as S
      Tensor tScS = TiledMmaQK{}.get_thread_slice(mma_tidx).partition_C(
          make_identity_tensor(cute::Shape<cute::Int<kBlockM>, Int<kBlockN>>{}));
      using CoordS = decltype(make_tensor(tScS.data(), acc_rowcol(tScS.layout())));
      DropoutMask<CoordS, true, true> keep;
      keep.generate(make_tensor(tScS.data(), acc_rowcol(tScS.layout())), m_block * kBlockM, n * kBlockN, w.mods);
#pragma unroll
      for (int r = 0; r < size<0>(p); ++r)
#pragma unroll
        for (int c = 0; c < size<1>(p); ++c)
          if (!keep.keep(r, c)) p(r, c) = Element(0.f);
    }
  }

  // FP8: S (fp32, thread holds (row r + 8 h, key 8 c + 2 q + v) at index 4 c + 2 h + v) -> the
  // E4M3 A fragment: per 32 keys 4 registers (row r keys 0-15, row r + 8 keys 0-15, then keys
  // 16-31), register position 4 q + j of a 16-key half holding key {2q, 2q+1, 2q+8, 2q+9}[j]
  // of it, which is where the transpose put those keys of V (producer.h). No shuffles.
  template <class TensorS>
  __device__ void convert_p_fp8(const TensorS& tSrS, FragP& p) {
    pack_p_fp8<kBlockN>(tSrS, p);
  }
  // The same for an S of the block's first kKeys keys only (head_narrow's, in the wide S's register order); P's
  // other keys are zero.
  template <int kKeys, class TensorS>
  __device__ void pack_p_fp8(const TensorS& tSrS, FragP& p) {
    using namespace cute;
    static_assert(decltype(size(tSrS))::value == kKeys / 2 && decltype(cosize(FragP{}.layout()))::value == kBlockN / 2);
    uint32_t* out = reinterpret_cast<uint32_t*>(raw_pointer_cast(p.data()));
    const uint32_t keep = v_zero ? 0u : ~0u;  // this block's V is zero: it adds nothing
#pragma unroll
    for (int i = 0; i < kKeys / 16; ++i) {      // 16-key half i of 32-key chunk i / 2
#pragma unroll
      for (int h = 0; h < 2; ++h) {             // row r, r + 8
        out[4 * (i / 2) + h + 2 * (i % 2)] = e4m3x4(tSrS(8 * i + 2 * h), tSrS(8 * i + 2 * h + 1),
                                                    tSrS(8 * i + 4 + 2 * h), tSrS(8 * i + 5 + 2 * h)) & keep;
      }
    }
#pragma unroll
    for (int j = kKeys / 8; j < kBlockN / 8; ++j) out[j] = 0u;
  }
  // Four floats -> E4M3 (round to nearest even, saturating at 448), the first in the low byte:
  // two packed conversions (cvt puts its first operand in the high byte) and one register pair.
  __device__ static uint32_t e4m3x4(float a, float b, float c, float d) {
    uint32_t w;
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(w)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return w;
  }
};

}  // namespace flashattn::sm90

// The Hopper forward kernel: warp specialization as in FA3 Algorithm 1.
//   warpgroup 0  (producer): gives registers back (setmaxnreg.dec); one thread issues the TMA
//                 loads of Q_i, K_j, V_j into the smem pipelines for every tile of this CTA.
//   warpgroups 1.. (consumers, 64 query rows each): take the registers (setmaxnreg.inc);
//                 per tile: O = 0, m = -inf, l = 0; the mainloop over key blocks
//                 (S = QK^T, softmax, O += PV); the epilogue (O / l, LSE; O through smem
//                 and a TMA store).
//                 With intra-warpgroup overlap a tile is head, body, tail (mainloop.h).
// Sched (mainloop.h Schedule) fixes pingpong and intra-warpgroup overlap at compile time: the
// production kernels have both but two FP8 ones without pingpong (launch.h SchedFp8); only the
// ablation builds instantiate the others.
// This file only composes and coordinates. Each stage owns its shared memory, its parameters
// and the host function that builds them (to_params):
//   mainloop  (producer.h + mainloop.h): Q, K, V buffers, their pipelines, the Q/K/V TMA loads
//             (FP8: and V's transposed copy, written by warps 1-3 of warpgroup 0);
//   epilogue  (epilogue.h): O's staging buffer and its TMA store;
//   scheduler (tile_scheduler.h): the tile order and the producer -> consumers tile queue.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90/epilogue.h"
#include "sm90/kernel_params.h"
#include "sm90/mainloop.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/producer.h"
#include "sm90/tile_scheduler.h"
#include "sm90/tile_shapes.h"

namespace flashattn::sm90 {

// Passed as __grid_constant__, so the TMA descriptors stay in param space.
template <class Traits>
struct KernelParams {
  typename Producer<Traits>::Params mainloop;  // Q/K/V TMA descriptors and shapes
  typename Epilogue<Traits>::Params epilogue;  // O's TMA descriptor and shape
  FwdParams fwd;                               // the problem: o, lse, strides, cu_seqlens, mask options
  TileScheduler::Params scheduler;
};

// The mainloop's barriers come after every 1024-aligned buffer (Q, K, V, O), so that they share
// the last 1024 bytes with the scheduler's instead of padding a block of their own.
template <class Traits>
struct SharedStorage {
  typename Producer<Traits>::TensorStorage mainloop;       // Q, K, V
  typename Epilogue<Traits>::SharedStorage epilogue;       // O's staging (nothing at hdim 192/256)
  typename Producer<Traits>::PipelineStorage pipelines;    // the mainloop's Q, K, V pipelines
  TileScheduler::SharedStorage scheduler;                  // the tile queue
};

// The roles, once the pipelines exist (pipe_v_read: what the consumers read V through, pipe_v
// itself or, for FP8, the transposed copy's pipeline pipe_vt).
template <class Traits, class Sched, class PipeVt, class PipeVRead>
__device__ __forceinline__ void fwd_roles(const KernelParams<Traits>& p, SharedStorage<Traits>& ss,
                                          typename Pipelines<Traits>::Q& pipe_q, typename Pipelines<Traits>::KV& pipe_k,
                                          typename Pipelines<Traits>::KV& pipe_v, PipeVt& pipe_vt, PipeVRead& pipe_v_read) {
  using namespace cute;
  const int wg = int(threadIdx.x) / 128;
  // The consumers and, for FP8, the V-transposing threads follow the producer's tiles.
  TileScheduler::init(ss.scheduler, Traits::kNumMmaThreads + Traits::kNumTransposeThreads);
  __syncthreads();  // barriers initialized before anyone waits on them
  const TileScheduler sched(p.scheduler, ss.scheduler);

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      Producer<Traits>::run(p.mainloop, p.fwd, sched, ss.mainloop, pipe_q, pipe_k, pipe_v);
    } else if constexpr (Traits::kTransposeV) {
      if (threadIdx.x >= 32) VTransposer<Traits>::run(p.fwd, sched, ss.mainloop, pipe_v, pipe_vt, int(threadIdx.x) - 32);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int mma_tidx = int(threadIdx.x) - 128;
  using ML = Mainloop<Traits, Sched>;
  const typename ML::Pingpong ping{uint32_t(wg - 1)};
  ping.init();
  using Epi = Epilogue<Traits>;
  ML mainloop;  // carries the pipeline read state across tiles
  const typename ML::Pipes pipes{pipe_q, pipe_k, pipe_v_read};
  const ScoreTransform tf = ScoreTransform::make(p.fwd.mask.softmax_scale, p.fwd.mask.softcap);

  for (auto work = sched.get_initial_work<false>(); sched.is_valid(work); work = sched.get_next_work<false>(work)) {
    const TileCoord t = sched.coord(work);
    const TileWork w = make_tile_work<Traits>(p.fwd, t);
    if (!w.has_rows) continue;
    typename ML::AccO tOrO;
    clear(tOrO);
    typename ML::Softmax sm;
    sm.init(tf);
    if (!w.empty()) mainloop.run(ss.mainloop, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
    Epi::store(p.epilogue, p.fwd, ss.epilogue, t, w, tOrO, sm, w.empty() ? 1.f : mainloop.o_scale(), mma_tidx);
  }
  Epi::finish(mma_tidx);
}

template <class Traits, class Sched = Schedule<>>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) fwd_kernel(const __grid_constant__ KernelParams<Traits> p) {
  using SS = SharedStorage<Traits>;
  using P = Pipelines<Traits>;
  extern __shared__ __align__(1024) char smem_raw[];
  SS& ss = *reinterpret_cast<SS*>(smem_raw);

  if (threadIdx.x == 0) Producer<Traits>::prefetch_descriptors(p.mainloop);
  auto pipe_q = P::template make<typename P::Q>(ss.pipelines.q, Traits::kBytesQ);
  auto pipe_k = P::template make<typename P::KV>(ss.pipelines.k, Traits::kBytesKV);
  auto pipe_v = P::make_v(ss.pipelines);
  if constexpr (Traits::kTransposeV) {
    auto pipe_vt = P::make_vt(ss.pipelines);
    fwd_roles<Traits, Sched>(p, ss, pipe_q, pipe_k, pipe_v, pipe_vt, pipe_vt);
  } else {
    fwd_roles<Traits, Sched>(p, ss, pipe_q, pipe_k, pipe_v, pipe_v, pipe_v);
  }
}

}  // namespace flashattn::sm90
